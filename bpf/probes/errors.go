package probes

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// What a kernel or a permission can refuse; errors from Open and Attach wrap
// one of these, so the agent can say what is missing and carry on without
// its eBPF view.
var (
	ErrPermission = errors.New("eBPF not permitted: run as root, or with CAP_BPF and CAP_PERFMON (CAP_SYS_ADMIN on kernels before 5.8)")
	ErrNoBPFFS    = errors.New("no bpffs mount for the pin directory (mount -t bpf bpf /sys/fs/bpf, or configure another pin directory)")
	ErrNoUprobes  = errors.New("kernel has no uprobe support (CONFIG_UPROBE_EVENTS: no uprobe PMU and no tracefs uprobe_events)")
	ErrKernel     = errors.New("kernel refused the eBPF programs (needs Linux >= 5.13 on x86-64 with BPF ring buffers)")
)

// Capability bits (linux/capability.h).
const (
	capSysAdmin = 21
	capPerfmon  = 38
	capBPF      = 39
)

// checkPrivileges reads the effective capabilities: CAP_SYS_ADMIN, or both
// CAP_BPF and CAP_PERFMON.
func checkPrivileges() error {
	eff, err := effectiveCaps("/proc/self/status")
	if err != nil {
		return fmt.Errorf("read capabilities: %w", err)
	}
	return capsError(eff)
}

// capsError says which capabilities an effective set lacks, or nil.
func capsError(eff uint64) error {
	has := func(c uint) bool { return eff&(1<<c) != 0 }
	if has(capSysAdmin) || (has(capBPF) && has(capPerfmon)) {
		return nil
	}
	var missing []string
	if !has(capBPF) {
		missing = append(missing, "CAP_BPF")
	}
	if !has(capPerfmon) {
		missing = append(missing, "CAP_PERFMON")
	}
	return fmt.Errorf("missing %s: %w", strings.Join(missing, " and "), ErrPermission)
}

// effectiveCaps parses CapEff from a /proc/<pid>/status file.
func effectiveCaps(status string) (uint64, error) {
	f, err := os.Open(status)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "CapEff:"); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no CapEff in %s", status)
}

// checkUprobes looks for the uprobe PMU (perf_event_open needs no tracefs
// with it) or, failing that, tracefs' uprobe_events.
func checkUprobes() error {
	for _, p := range []string{
		"/sys/bus/event_source/devices/uprobe/type",
		"/sys/kernel/tracing/uprobe_events",
		"/sys/kernel/debug/tracing/uprobe_events",
	} {
		if _, err := os.Stat(p); err == nil {
			return nil
		}
	}
	return ErrNoUprobes
}

// preparePinDir makes the pin directory on an existing bpffs mount.
func preparePinDir(dir string) error {
	// The nearest existing directory above it must be on bpffs.
	probe := dir
	for {
		if _, err := os.Stat(probe); err == nil {
			break
		}
		parent := filepath.Dir(probe)
		if parent == probe {
			break
		}
		probe = parent
	}
	var st unix.Statfs_t
	if err := unix.Statfs(probe, &st); err != nil {
		return fmt.Errorf("pin directory %s: %w: %w", dir, err, ErrNoBPFFS)
	}
	if st.Type != unix.BPF_FS_MAGIC {
		return fmt.Errorf("pin directory %s: %s is not on bpffs: %w", dir, probe, ErrNoBPFFS)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("make pin directory: %w", err)
	}
	return nil
}

// explainLoad wraps a load error with what it most likely means.
func explainLoad(err error) error {
	var ve *ebpf.VerifierError
	switch {
	case errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES):
		return fmt.Errorf("load eBPF programs: %w: %w", err, ErrPermission)
	case errors.As(err, &ve), errors.Is(err, ebpf.ErrNotSupported), errors.Is(err, unix.EINVAL):
		return fmt.Errorf("load eBPF programs: %w: %w", err, ErrKernel)
	}
	return fmt.Errorf("load eBPF programs: %w", err)
}

// explainAttach wraps an attach error with what it most likely means.
func explainAttach(err error) error {
	switch {
	case errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES):
		return fmt.Errorf("%w: %w", err, ErrPermission)
	case errors.Is(err, ebpf.ErrNotSupported):
		return fmt.Errorf("%w: %w", err, ErrKernel)
	}
	return err
}
