package main

import (
	"bytes"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

func TestVersionAndUsage(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"--version"}, &out, &errb); code != 0 || out.String() != "gpuwarden "+version+"\n" {
		t.Errorf("--version: exit %d, output %q", code, out.String())
	}
	out.Reset()
	if code := run([]string{"frobnicate"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), `unknown command "frobnicate"`) {
		t.Errorf("unknown command: exit %d, stderr %q", code, errb.String())
	}
	out.Reset()
	if code := run(nil, &out, &errb); code != 0 || !strings.Contains(out.String(), "bench") {
		t.Errorf("no command: exit %d, want usage listing the commands, got %q", code, out.String())
	}
}

var benchLine = regexp.MustCompile(`^BENCH [a-z0-9_]+ [0-9.]+ [A-Za-z/_]+$`)

// The built binary's bench prints its figures in the contract's format.
func TestBenchPrintsFigures(t *testing.T) {
	bin := simtest.Bin(t, "gpuwarden")
	out, err := exec.Command(bin, "bench", "--only", "simgpu", "--seconds", "0.3", "--launches", "2000").Output()
	if err != nil {
		t.Fatalf("gpuwarden bench: %v", err)
	}
	want := map[string]bool{"simgpu_launch_ns": false, "workload_steps_per_sec": false, "workload_images_per_sec": false}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if !benchLine.MatchString(l) {
			t.Errorf("line %q is not `BENCH <name> <value> <unit>`", l)
			continue
		}
		want[strings.Fields(l)[1]] = true
	}
	for name, seen := range want {
		if !seen {
			t.Errorf("bench printed no %s figure:\n%s", name, out)
		}
	}
}
