package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"io"
	"strings"
)

// runBench prints each figure as `BENCH <name> <value> <unit>`. Figures that
// compare (with and without a part) are measured side by side in one run.
func runBench(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	launches := fs.Int("launches", 200000, "launches for the launch-cost figure")
	seconds := fs.Float64("seconds", 3, "seconds each workload rate is measured over")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	m, err := newSimMachine(1, "16Gi")
	if err != nil {
		fmt.Fprintf(stderr, "gpuwarden bench: %v\n", err)
		return 1
	}
	defer m.close()

	runs := []struct {
		what string
		args []string
	}{
		{"simulated launch cost", []string{"--label", "simgpu", "--launch-cost", fmt.Sprint(*launches)}},
		{"workload rate", []string{"--label", "workload", "--alloc", "1Gi", "--seconds", fmt.Sprint(*seconds),
			"--kernels", "8", "--kernel-ns", "100000", "--batch", "32"}},
	}
	for _, r := range runs {
		if err := relayBench(m, r.args, stdout); err != nil {
			fmt.Fprintf(stderr, "gpuwarden bench: %s: %v\n", r.what, err)
			return 1
		}
	}
	return 0
}

// relayBench runs the workload and copies its BENCH lines to out.
func relayBench(m *simMachine, args []string, out io.Writer) error {
	var stdout, stderr bytes.Buffer
	cmd := m.workload(args...)
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
