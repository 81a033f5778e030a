// Package gpucheck is the real-GPU check: one run that proves, on NVIDIA's
// driver, what the rest of the tests prove on simgpu. It compares simgpu's
// declarations with NVIDIA's headers, holds real frameworks to a memory quota
// through the interposer, attaches the agent's probes to the real libcuda,
// measures shares and overhead on real kernels, and writes a Markdown report
// and BENCH lines.
//
// It runs from a bundle that `make gpu-check` assembles (the GPU machines
// have no Go toolchain), through the bundle's run.sh. In simulation mode it
// runs the same parts on simgpu, so `make test` keeps it from rotting; parts
// that need nvcc or PyTorch are reported as skipped there.
package gpucheck

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"time"
)

// Options says where the bundle is, where the report goes and how long the
// whole run may take.
type Options struct {
	Bundle      string        // the bundle directory (run.sh's)
	Out         string        // the report directory (made if missing)
	Simulate    bool          // simgpu instead of NVIDIA's driver
	Budget      time.Duration // the whole run; parts left when it runs out are skipped
	CUDAInclude string        // NVIDIA's headers; empty: found beside nvcc or in /usr/local/cuda
	Python      string        // the Python that has PyTorch; empty: python3
	Parts       []int         // the parts to run (1-6); empty: all
	Rows        []string      // part 4's rows to run: those whose names contain one of these; empty: all
	TimeSlice   time.Duration // the agents' enforcement.timeSlice; 0: its default
	Log         io.Writer     // progress lines
}

// part is one section of the report. Its share of the budget bounds how
// long it may run; it reports through r and never panics the run.
type part struct {
	title string
	share float64 // of the whole budget
	run   func(ctx context.Context, e *env, r *Result)
}

var parts = []part{
	{"1. Declarations: simgpu's cuda.h and nvml.h against NVIDIA's", 0.02, checkDeclarations},
	{"2. Memory quota through real frameworks", 0.10, checkQuota},
	{"3. Probes on the real libcuda", 0.05, checkProbes},
	{"4. Shares on real kernels", 0.50, checkShares},
	{"5. Overhead", 0.33, checkOverhead},
	{"6. Calibration: what simgpu's h200 model needs", 0.05, checkCalibration},
}

// Run runs every part and writes report.md and bench.txt into o.Out. It
// returns whether no part failed; an error means the run itself could not
// start or write its report.
func Run(o Options) (bool, error) {
	if o.Log == nil {
		o.Log = io.Discard
	}
	if o.Budget <= 0 {
		o.Budget = 8 * time.Minute
	}
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return false, fmt.Errorf("make report directory: %w", err)
	}
	start := time.Now()
	e, err := newEnv(o)
	if err != nil {
		return false, err
	}
	defer e.close()
	rep := &Report{Mode: e.mode(), Started: start, Machine: e.describeMachine()}
	deadline := start.Add(o.Budget)
	for i, p := range parts {
		r := &Result{Title: p.title}
		left := time.Until(deadline)
		if len(o.Parts) > 0 && !slices.Contains(o.Parts, i+1) {
			r.Skip("the part", "not asked for (--parts)")
		} else if left < 5*time.Second {
			r.Skip("the part", "out of time: the run's budget of %s is spent", o.Budget)
		} else {
			// Its share of what is left, so time a quick part did not use
			// goes to the later ones; at least a minute, so a loaded
			// machine's slow start does not cut a short part off.
			d := min(max(time.Duration(float64(left)*p.share/sharesFrom(i, o.Parts)), time.Minute), left)
			fmt.Fprintf(o.Log, "gpu-check: %s (up to %s)\n", p.title, d.Round(time.Second))
			runPart(p, e, r, d)
		}
		rep.Parts = append(rep.Parts, r)
		fmt.Fprintf(o.Log, "gpu-check: %s: %s in %s\n", p.title, r.Status(), r.Elapsed.Round(100*time.Millisecond))
	}
	rep.Elapsed = time.Since(start)
	if err := rep.write(o.Out); err != nil {
		return false, err
	}
	return !rep.failed(), nil
}

// PartCount is how many parts there are, for --parts.
func PartCount() int { return len(parts) }

// sharesFrom is the sum of the shares of parts i and after that will run
// (all, or those asked for), so a part not asked for leaves its time to the
// others.
func sharesFrom(i int, asked []int) float64 {
	sum := 0.0
	for j := i; j < len(parts); j++ {
		if len(asked) == 0 || slices.Contains(asked, j+1) {
			sum += parts[j].share
		}
	}
	return sum
}

// runPart gives a part its deadline and turns a panic into a failed check,
// so one broken part never hides the others.
func runPart(p part, e *env, r *Result, d time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	start := time.Now()
	defer func() {
		if v := recover(); v != nil {
			r.Fail("the part", "panic: %v\n%s", v, debug.Stack())
		}
		r.Elapsed = time.Since(start)
		if ctx.Err() != nil {
			r.Note("The part took longer than its share of the run's budget (%s).", d.Round(time.Second))
		}
	}()
	p.run(ctx, e, r)
}

// bundlePath is a path inside the bundle.
func (e *env) bundlePath(parts ...string) string {
	return filepath.Join(append([]string{e.o.Bundle}, parts...)...)
}
