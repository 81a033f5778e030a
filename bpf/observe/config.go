package observe

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/gpuwarden/gpuwarden/bpf/libcuda"
	"github.com/gpuwarden/gpuwarden/bpf/probes"
)

// Config says where the observer pins its state, which libraries it
// attaches to and how often it looks and samples.
type Config struct {
	// PinDir is the bpffs directory the maps are pinned in; "" pins nothing
	// (state is lost at restart).
	PinDir string
	// Libraries are attached at start and kept attached: processes loading
	// them are observed from their first call.
	Libraries []string
	// LdconfigSoname, when set, adds the path `ldconfig -p` gives for it.
	LdconfigSoname string
	// ProcRoot is the proc filesystem the processes are found in.
	ProcRoot string
	// ScanInterval is how often /proc/*/maps is scanned for other libcuda
	// files; 0 turns scanning off.
	ScanInterval time.Duration
	// LaunchWindow is how long the sampling launch probes stay attached,
	// at a random moment of each LaunchPeriod, on the processes whose
	// launches are not counted exactly (see Ledgered). A window of 0
	// attaches no launch probe at all; a window as long as the period keeps
	// the sampling probes attached on every process (every launch then
	// costs a probe hit).
	LaunchWindow time.Duration
	LaunchPeriod time.Duration
	// Ledgered says whether a process (its pid under ProcRoot) keeps a live
	// slot in its container's ledger, which counts its launches; nil: no
	// process does. Every other process that maps libcuda has its launches
	// counted exactly, by a launch probe attached to it alone (Linux 6.6;
	// before, and where ProcRoot's pids are not the host's, its launches are
	// sampled too). Asked when the scan finds a process, every second while
	// it is young, every 10 s after; it must not block.
	Ledgered func(pid int) bool
	// GCInterval is how often the state of processes that are gone is cleared.
	GCInterval time.Duration
	// FailedAllocBuffer is how many failed-allocation events wait for the
	// reader of FailedAllocs before new ones are dropped (and counted).
	FailedAllocBuffer int
	Logger            *slog.Logger
}

// DefaultConfig is the agent's default.
func DefaultConfig() Config {
	return Config{
		PinDir:            probes.DefaultPinDir,
		LdconfigSoname:    libcuda.DefaultSoname,
		ProcRoot:          "/proc",
		ScanInterval:      500 * time.Millisecond,
		LaunchWindow:      50 * time.Millisecond,
		LaunchPeriod:      30 * time.Second, // attaching and detaching costs the observed processes too
		GCInterval:        10 * time.Second,
		FailedAllocBuffer: 1024,
	}
}

// Validate checks a configuration; it changes nothing.
func (c Config) Validate() error {
	var errs []error
	if c.ProcRoot == "" {
		errs = append(errs, errors.New("proc root is empty"))
	}
	if c.ScanInterval < 0 {
		errs = append(errs, fmt.Errorf("scan interval %v is negative", c.ScanInterval))
	}
	if c.LaunchWindow < 0 {
		errs = append(errs, fmt.Errorf("launch window %v is negative", c.LaunchWindow))
	}
	if c.LaunchWindow > 0 && c.LaunchPeriod <= 0 {
		errs = append(errs, fmt.Errorf("launch period %v must be positive", c.LaunchPeriod))
	}
	if c.LaunchWindow > c.LaunchPeriod && c.LaunchPeriod > 0 {
		errs = append(errs, fmt.Errorf("launch window %v is longer than its period %v", c.LaunchWindow, c.LaunchPeriod))
	}
	if c.GCInterval <= 0 {
		errs = append(errs, fmt.Errorf("gc interval %v must be positive", c.GCInterval))
	}
	if c.FailedAllocBuffer < 0 {
		errs = append(errs, fmt.Errorf("failed-allocation buffer %d is negative", c.FailedAllocBuffer))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("invalid eBPF observer config: %w", err)
	}
	return nil
}

// DutyCycle is the share of time the launch probes are attached.
func (c Config) DutyCycle() float64 {
	if c.LaunchWindow <= 0 || c.LaunchPeriod <= 0 {
		return 0
	}
	return float64(c.LaunchWindow) / float64(c.LaunchPeriod)
}
