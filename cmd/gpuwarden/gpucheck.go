package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/gpuwarden/gpuwarden/deploy/gpucheck"
)

const gpuCheckUsage = `usage: gpuwarden gpu-check --bundle DIR [--simulate] [--budget 9m] [--cuda-include DIR] [--python python3] [--parts 1,3] [--rows batch64,fixed] [--time-slice 50ms] OUTDIR

Runs the real-GPU check from a bundle built by 'make gpu-check' (its run.sh
calls this) and writes OUTDIR/report.md, OUTDIR/declarations.md and
OUTDIR/bench.txt. --simulate runs it on simgpu. Exit status 1 when a part failed.`

// runGPUCheck is `gpuwarden gpu-check`.
func runGPUCheck(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gpu-check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprintln(stderr, gpuCheckUsage) }
	o := gpucheck.Options{Log: stderr}
	fs.StringVar(&o.Bundle, "bundle", "", "the bundle directory")
	fs.BoolVar(&o.Simulate, "simulate", false, "run on simgpu instead of NVIDIA's driver")
	fs.DurationVar(&o.Budget, "budget", 0, "the whole run's time (default 9m; 4m with --simulate)")
	fs.StringVar(&o.CUDAInclude, "cuda-include", "", "directory of NVIDIA's cuda.h and nvml.h (default: beside nvcc)")
	fs.StringVar(&o.Python, "python", "", "the Python that has PyTorch (default python3)")
	fs.DurationVar(&o.TimeSlice, "time-slice", 0, "the agent's enforcement.timeSlice (default: its own, 50ms)")
	fs.Func("parts", "run only these parts, e.g. 1,3 (default: all)", func(v string) error {
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 || n > gpucheck.PartCount() {
				return fmt.Errorf("want part numbers 1-%d, got %q", gpucheck.PartCount(), f)
			}
			o.Parts = append(o.Parts, n)
		}
		return nil
	})
	fs.Func("rows", "run only part 4's rows whose names contain one of these words, e.g. host_pace,batch64 (default: all)", func(v string) error {
		for _, f := range strings.Split(v, ",") {
			if f = strings.TrimSpace(f); f == "" {
				return fmt.Errorf("want words of part 4's row names, got an empty one in %q", v)
			}
			o.Rows = append(o.Rows, f)
		}
		return nil
	})
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if o.Bundle == "" || fs.NArg() != 1 {
		fs.Usage()
		return 2
	}
	o.Out = fs.Arg(0)
	if o.Budget == 0 {
		o.Budget = 9 * time.Minute
		if o.Simulate {
			o.Budget = 4 * time.Minute
		}
	}
	ok, err := gpucheck.Run(o)
	if err != nil {
		fmt.Fprintf(stderr, "gpuwarden gpu-check: %v\n", err)
		return 1
	}
	if b, err := os.ReadFile(o.Out + "/bench.txt"); err == nil {
		_, _ = stdout.Write(b)
	}
	fmt.Fprintf(stdout, "report: %s/report.md\n", o.Out)
	if !ok {
		return 1
	}
	return 0
}
