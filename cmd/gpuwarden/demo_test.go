package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuwarden/gpuwarden/enforcer/hostcgroup"
	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

// TestDemoScripted runs `gpuwarden demo --duration` as a script would (and
// as `make demo DURATION=...` does) and checks what it shows and that it
// leaves nothing behind.
func TestDemoScripted(t *testing.T) {
	simtest.RequirePrivileged(t, "eBPF and cgroups")
	cmd := exec.Command(simtest.Bin(t, "gpuwarden"), "demo", "--duration", "12s", "--every", "4s", "--listen", "127.0.0.1:0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out)
	}
	s := string(out)
	for _, want := range []string{
		"-> CUDA_ERROR_OUT_OF_MEMORY",   // the over-quota attempt was denied
		"/demo-a", "/demo-b", "/demo-c", // the smi table names the three containers
		"4096MiB / 6144MiB", "6144MiB / 8192MiB", // memory against quota
		"UNENFORCED",              // the bypass, seen by eBPF
		"images/s", "NO (bypass)", // the shares table
		"/metrics", // where the metrics are
		"done",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("demo output lacks %q:\n%s", want, s)
		}
	}
	// No cgroup of the demo is left.
	mnt, err := hostcgroup.Mount("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	left, _ := filepath.Glob(filepath.Join(mnt, "gpuwarden-demo-*"))
	for _, d := range left {
		if _, err := os.Stat(filepath.Join(d, "demo-a")); err == nil {
			t.Errorf("demo left cgroup %s behind", d)
		}
	}
}
