package main

import (
	"bytes"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

func init() { benchSuites["interposer"] = benchSuite{order: 10, run: benchInterposer} }

// benchInterposer measures what libgpuwarden.so adds to a cuLaunchKernel and
// to a cuMemAlloc_v2 + cuMemFree_v2 pair: the same program (gw-bench) runs
// with and without the library in alternating rounds of one run, and the
// figure is the median of the per-round differences. Launches go to a
// capturing stream, where simgpu's own launch is a steady array append.
func benchInterposer(o benchOptions, stdout io.Writer) error {
	m, err := newSimMachine(1, "16Gi")
	if err != nil {
		return err
	}
	defer m.close()
	bench := filepath.Join(m.bin, "interposer", "gw-bench")
	lib := filepath.Join(m.bin, "libgpuwarden.so")
	run := func(preload bool, mode string, n int) (float64, error) {
		cmd := exec.Command(bench, mode, strconv.Itoa(n))
		cmd.Env = m.env()
		if preload {
			cmd.Env = append(cmd.Env, "LD_PRELOAD="+lib, "GPUWARDEN_CONTROL_DIR="+filepath.Join(m.dir, "ctl"),
				"GPUWARDEN_MEMORY_LIMIT=8Gi")
		}
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			return 0, fmt.Errorf("gw-bench %s: %w: %s", mode, err, errb.String())
		}
		f := strings.Fields(out.String())
		if len(f) != 2 {
			return 0, fmt.Errorf("gw-bench %s printed %q", mode, out.String())
		}
		return strconv.ParseFloat(f[1], 64)
	}
	const rounds = 7
	for _, c := range []struct {
		mode, name string
		n          int
	}{
		{"launch", "launch", o.launches},
		{"alloc", "alloc_free", max(o.launches/20, 1000)},
	} {
		var base, with, diff []float64
		for r := 0; r < rounds; r++ {
			var a, b float64
			var err error
			if r%2 == 0 { // alternate which goes first
				if a, err = run(false, c.mode, c.n); err == nil {
					b, err = run(true, c.mode, c.n)
				}
			} else if b, err = run(true, c.mode, c.n); err == nil {
				a, err = run(false, c.mode, c.n)
			}
			if err != nil {
				return err
			}
			base, with, diff = append(base, a), append(with, b), append(diff, b-a)
		}
		fmt.Fprintf(stdout, "BENCH interposer_%s_base_ns %.1f ns\n", c.name, interposerMedian(base))
		fmt.Fprintf(stdout, "BENCH interposer_%s_with_ns %.1f ns\n", c.name, interposerMedian(with))
		fmt.Fprintf(stdout, "BENCH interposer_%s_overhead_ns %.1f ns\n", c.name, interposerMedian(diff))
	}
	return nil
}

func interposerMedian(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
