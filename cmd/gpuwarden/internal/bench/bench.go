// Package bench is `gpuwarden bench`: suites that measure one part each
// on simgpu (the interposer's hot paths, the probes, the enforcer, the
// shares, the agent, the remote pool) and print `BENCH <name> <value>
// <unit>` lines. Figures that compare, with and without a part, are
// measured side by side in one run, since these machines are noisy.
package bench

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/gpuwarden/gpuwarden/cmd/gpuwarden/internal/simmachine"
)

// options are the knobs every suite shares.
type options struct {
	launches int     // launches for launch-cost figures
	seconds  float64 // seconds each rate is measured over
}

// A suite measures one part and prints its figures as BENCH lines.
type suite struct {
	order int // suites run in this order
	run   func(o options, stdout io.Writer) error
}

var suites = map[string]suite{
	"simgpu": {order: 0, run: benchSimgpu},
}

// Run is `gpuwarden bench [--only SUITES] [--launches N] [--seconds S]`;
// it returns the exit code.
func Run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	fs.IntVar(&o.launches, "launches", 200000, "launches for launch-cost figures")
	fs.Float64Var(&o.seconds, "seconds", 3, "seconds each rate is measured over")
	only := fs.String("only", "", "run only these suites (comma-separated)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	names := make([]string, 0, len(suites))
	for n := range suites {
		if *only == "" || strings.Contains(","+*only+",", ","+n+",") {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		fmt.Fprintf(stderr, "gpuwarden bench: no suite named %q\n", *only)
		return 2
	}
	sort.Slice(names, func(i, j int) bool { return suites[names[i]].order < suites[names[j]].order })
	failed := 0
	for _, n := range names {
		if err := suites[n].run(o, stdout); err != nil {
			fmt.Fprintf(stderr, "gpuwarden bench: %s: %v\n", n, err)
			failed++
		}
	}
	if failed > 0 {
		return 1
	}
	return 0
}

// benchSimgpu measures the simulated driver itself: the cost of a launch and
// a training loop's rate.
func benchSimgpu(o options, stdout io.Writer) error {
	m, err := simmachine.New(1, "16Gi")
	if err != nil {
		return err
	}
	defer m.Close()
	if err := relayBench(m, stdout, "--label", "simgpu", "--launch-cost", fmt.Sprint(o.launches)); err != nil {
		return fmt.Errorf("launch cost: %w", err)
	}
	return relayBench(m, stdout, "--label", "workload", "--alloc", "1Gi", "--seconds", fmt.Sprint(o.seconds),
		"--kernels", "8", "--kernel-ns", "100000", "--batch", "32")
}

// relayBench runs the workload and copies its BENCH lines to out.
func relayBench(m *simmachine.Machine, out io.Writer, args ...string) error {
	var stdout, stderr bytes.Buffer
	cmd := m.Workload(args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("workload %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	sc := bufio.NewScanner(&stdout)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "BENCH ") {
			fmt.Fprintln(out, sc.Text())
		}
	}
	return nil
}
