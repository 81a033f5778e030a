package bench

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/gpuwarden/gpuwarden/cmd/gpuwarden/internal/simmachine"
	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
	"github.com/gpuwarden/gpuwarden/enforcer/hostcgroup"
	"golang.org/x/sys/unix"
)

func init() { suites["interposer"] = suite{order: 10, run: benchInterposer} }

// benchInterposer measures what libgpuwarden.so adds to a cuLaunchKernel and
// to a cuMemAlloc_v2 + cuMemFree_v2 pair, every run of gw-bench on the same
// CPU. A launch's cost is timed in one process under the library, its hook
// and libcuda's own function in alternating batches (simgpu's H200 model
// makes a launch's cost move with where a process's memory lands by more
// than the hook costs); a round's figure is the difference of the two
// series' lower quartiles.
// An alloc/free pair is timed with and without the library in alternating
// processes. Each figure is the median of the rounds. Launches go to a
// capturing stream, where simgpu's own launch is a steady array append.
// Launches are measured without a gate, under a gate (the agent's limits
// gate device 0 with a grant no run reaches), and with simgpu's launch
// leaving stores pending as NVIDIA's does (its H200 model). The
// last row is what a locked add right after such a launch costs: the
// regression a locked instruction on the launch path would be on an H200.
func benchInterposer(o options, stdout io.Writer) error {
	m, err := simmachine.New(1, "16Gi")
	if err != nil {
		return err
	}
	defer m.Close()
	bench := filepath.Join(m.Bin, "interposer", "gw-bench")
	lib := filepath.Join(m.Bin, "libgpuwarden.so")
	gatedCtl := filepath.Join(m.Dir, "ctl-gated")
	lim, err := openBenchGate(gatedCtl)
	if err != nil {
		return err
	}
	defer lim.Close()
	run := func(preload bool, mode string, n int, env ...string) ([]float64, error) {
		cmd := exec.Command(bench, mode, strconv.Itoa(n))
		cmd.Env = append(m.Env(), env...)
		if preload {
			ctl := filepath.Join(m.Dir, "ctl")
			if slices.Contains(env, benchGated) {
				ctl = gatedCtl
				lim.Heartbeat()
			}
			cmd.Env = append(cmd.Env, "LD_PRELOAD="+lib, "GPUWARDEN_CONTROL_DIR="+ctl, "GPUWARDEN_MEMORY_LIMIT=8Gi")
		}
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := runPinned(cmd); err != nil {
			return nil, fmt.Errorf("gw-bench %s: %w: %s", mode, err, errb.String())
		}
		f := strings.Fields(out.String())
		if len(f) < 2 {
			return nil, fmt.Errorf("gw-bench %s printed %q", mode, out.String())
		}
		var v []float64
		for _, s := range f[1:] {
			x, err := strconv.ParseFloat(s, 64)
			if err != nil {
				return nil, fmt.Errorf("gw-bench %s printed %q", mode, out.String())
			}
			v = append(v, x)
		}
		return v, nil
	}
	const rounds = 15
	for _, c := range []struct {
		name     string
		env      []string
		budgetNs float64 // 0: none
	}{
		{"launch", nil, 0},
		{"launch_gated", []string{benchGated}, 0},
		{"launch_stores", []string{benchStores}, budgetLaunchNs},
		{"launch_stores_gated", []string{benchStores, benchGated}, budgetGatedLaunchNs},
	} {
		var base, with, diff []float64
		for r := 0; r < rounds; r++ {
			v, err := run(true, "launch", o.launches, c.env...)
			if err != nil {
				return err
			}
			if len(v) != 2 {
				return fmt.Errorf("gw-bench launch printed %v, not driver and hooked ns", v)
			}
			base, with, diff = append(base, v[0]), append(with, v[1]), append(diff, v[1]-v[0])
		}
		overhead := interposerMedian(diff)
		printInterposerRow(stdout, c.name, interposerMedian(base), interposerMedian(with), overhead)
		if c.budgetNs > 0 {
			fmt.Fprintf(stdout, "BENCH interposer_%s_within_budget %d bool\n", c.name, b2i(overhead <= c.budgetNs))
		}
	}
	var base, with, diff []float64
	for r := 0; r < rounds; r++ {
		var a, b []float64
		var err error
		n := max(o.launches/20, 1000)
		if r%2 == 0 { // alternate which goes first
			if a, err = run(false, "alloc", n); err == nil {
				b, err = run(true, "alloc", n)
			}
		} else if b, err = run(true, "alloc", n); err == nil {
			a, err = run(false, "alloc", n)
		}
		if err != nil {
			return err
		}
		base, with, diff = append(base, a[0]), append(with, b[0]), append(diff, b[0]-a[0])
	}
	printInterposerRow(stdout, "alloc_free", interposerMedian(base), interposerMedian(with), interposerMedian(diff))
	for _, c := range []struct {
		name string
		env  []string
	}{{"locked_add_after_launch_ns", nil}, {"locked_add_after_launch_stores_ns", []string{benchStores}}} {
		v, err := run(false, "lockadd", o.launches, c.env...)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "BENCH interposer_%s %.1f ns\n", c.name, v[0])
		if c.env != nil { // the cost model must make a locked add there cost what it does on a GPU
			fmt.Fprintf(stdout, "BENCH interposer_%s_within_budget %d bool\n", strings.TrimSuffix(c.name, "_ns"), b2i(v[0] >= lockedAddFloorNs))
		}
	}
	return nil
}

func printInterposerRow(stdout io.Writer, name string, base, with, overhead float64) {
	fmt.Fprintf(stdout, "BENCH interposer_%s_base_ns %.1f ns\n", name, base)
	fmt.Fprintf(stdout, "BENCH interposer_%s_with_ns %.1f ns\n", name, with)
	fmt.Fprintf(stdout, "BENCH interposer_%s_overhead_ns %.1f ns\n", name, overhead)
}

// What a launch may cost beyond the driver's under simgpu's H200 model
// (where a launch leaves stores pending as NVIDIA's does), and the least a
// locked add after such a launch must cost there for the model to catch
// one on the launch path (the H200: +153 ns).
const (
	budgetLaunchNs      = 10
	budgetGatedLaunchNs = 50
	lockedAddFloorNs    = 100
)

const (
	benchStores = "SIMGPU_MODEL=h200"
	benchGated  = "GPUWARDEN_BENCH_GATED=1" // marks a run for the gated control directory
)

// openBenchGate writes the agent's limits for the gated runs: device 0
// gated, with a grant no run reaches, so each launch takes a ticket and
// none waits.
func openBenchGate(ctl string) (*controlblock.LimitsFile, error) {
	cg, err := hostcgroup.Of("/proc", os.Getpid())
	if err != nil {
		return nil, err
	}
	path := controlblock.LimitsPath(ctl, controlblock.ContainerKey(cg))
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	lim, err := controlblock.CreateLimits(path, controlblock.LimitsConfig{GateMask: 1, NDev: 1})
	if err == nil {
		lim.Heartbeat()
		err = lim.RaiseGrant(0, 1<<50)
	}
	return lim, err
}

// runPinned runs cmd on the last CPU, every round on the same one: a
// launch's few nanoseconds are otherwise lost among migrations. The child
// inherits the affinity of the thread that starts it, which gets its own
// back before other goroutines may use it.
func runPinned(cmd *exec.Cmd) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var all, one unix.CPUSet
	if err := unix.SchedGetaffinity(0, &all); err != nil {
		return err
	}
	for i, left := 0, all.Count(); left > 0; i++ { // the last CPU it may use
		if all.IsSet(i) {
			one.Zero()
			one.Set(i)
			left--
		}
	}
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		return err
	}
	defer unix.SchedSetaffinity(0, &all)
	return cmd.Run()
}

func interposerMedian(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
