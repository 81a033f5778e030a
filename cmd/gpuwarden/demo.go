package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

// runDemo runs a training-like workload on the simulated GPU and prints what
// it did. It stops after --duration, or at Ctrl-C.
func runDemo(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	duration := fs.Duration("duration", 0, "stop after this long (0: run until Ctrl-C)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	m, err := newSimMachine(1, "15Gi")
	if err != nil {
		fmt.Fprintf(stderr, "gpuwarden demo: %v\n", err)
		return 1
	}
	defer m.close()

	fmt.Fprintf(stdout, "simulated GPU: 1 device with %s of memory (state in %s)\n", m.memory, m.dir)
	cmd := m.workload("--label", "demo", "--alloc", "6Gi", "--seconds", "1000000", "--kernels", "8",
		"--kernel-ns", "1000000", "--batch", "32")
	out, err := cmd.StdoutPipe()
	if err != nil {
		fmt.Fprintf(stderr, "gpuwarden demo: %v\n", err)
		return 1
	}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(stderr, "gpuwarden demo: start workload: %v\n", err)
		return 1
	}
	lines := bufio.NewScanner(out)
	if lines.Scan() && strings.HasPrefix(lines.Text(), "ready") {
		fmt.Fprintf(stdout, "workload started: %s (6 GiB allocated, steps of 8 kernels x 1 ms)\n", lines.Text())
	}

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(stop)
	var timeout <-chan time.Time
	if *duration > 0 {
		timeout = time.After(*duration)
	}
	select {
	case <-stop:
	case <-timeout:
	}
	// SIGINT lets the workload print its rate before it exits.
	_ = cmd.Process.Signal(syscall.SIGINT)
	for lines.Scan() {
		fmt.Fprintln(stdout, lines.Text())
	}
	_ = cmd.Wait()
	fmt.Fprintln(stdout, "demo finished; the workload's memory went back to the device when it exited")
	return 0
}
