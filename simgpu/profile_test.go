package simgpu_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

// SIMGPU_PROFILE: a file of "key = value" lines overrides the h200 model's
// values, and anything in it simgpu does not understand stops the driver
// from loading, naming the line.
func TestProfileRefusesBadLines(t *testing.T) {
	workload := simtest.Bin(t, "simgpu/workload")
	dir := t.TempDir()
	run := func(profile string, model string) (string, error) {
		m := simtest.NewMachine(t, 1, "1Gi")
		c := m.Command(workload, "--steps", "1", "--kernels", "1", "--kernel-ns", "1000")
		c.Env = append(c.Env, "SIMGPU_MODEL="+model, "SIMGPU_PROFILE="+profile)
		out, err := c.CombinedOutput()
		return string(out), err
	}
	for i, tc := range []struct{ text, want string }{
		{"time_slice_ns = 2000000\nfoo = 1\n", "line 2: unknown key"},
		{"# a comment\n\ntime_slice_ns = 1ms\n", "line 3: the value is not a decimal integer"},
		{"time_slice_ns = -5\n", "line 1: the value is not a decimal integer"},
		{"time_slice_ns = 5\n", "line 1: the value is out of range"},
		{"nvml_sample_period_us = 99999999999999999999999\n", "line 1: the value is too large"},
		{"time_slice_ns = 2000000\ntime_slice_ns = 3000000\n", "line 2: the key is set twice"},
		{"nvml_sample_period_us\n", `line 1: want "key = value"`},
		{"time_slice_ns = 2000000 3\n", "line 1: the value is not a decimal integer"},
		{"time_slice_ns = 20\x0000\n", "line 1: the line holds a NUL byte"},
		{"# " + strings.Repeat("x", 600) + "\n", "line 1: the line is longer than 510 bytes"},
	} {
		p := filepath.Join(dir, "bad"+strconv.Itoa(i)+".profile")
		if err := os.WriteFile(p, []byte(tc.text), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := run(p, "h200")
		if err == nil || !strings.Contains(out, "SIMGPU_PROFILE="+p+" "+tc.want) {
			t.Errorf("profile %q: %v, output %q; want a failure saying %q", tc.text, err, out, tc.want)
		}
	}
	if out, err := run(filepath.Join(dir, "missing.profile"), "h200"); err == nil || !strings.Contains(out, "No such file") {
		t.Errorf("a missing profile: %v, %q; want refused", err, out)
	}
	if out, err := run(profilePath(t), ""); err == nil || !strings.Contains(out, "a profile is for SIMGPU_MODEL=h200") {
		t.Errorf("a profile without SIMGPU_MODEL: %v, %q; want refused", err, out)
	}
	if out, err := run(profilePath(t), "h200"); err != nil {
		t.Errorf("the committed h200.profile: %v: %s", err, out)
	}
}

// A profile's value changes what the model does: with the time slice set
// past the length of a 20 ms kernel, the engine no longer preempts it, so a
// process syncing on short kernels beside it waits for whole kernels.
func TestProfileSetsTheTimeSlice(t *testing.T) {
	long := filepath.Join(t.TempDir(), "long-slice.profile")
	if err := os.WriteFile(long, []byte("time_slice_ns = 50000000 # 50 ms\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	rate := func(profile string) float64 {
		return shortBesideLong(t, "SIMGPU_MODEL=h200", "SIMGPU_PROFILE="+profile)
	}
	builtin, slow := rate(profilePath(t)), rate(long)
	t.Logf("short kernels beside 20 ms ones: %.0f steps/s with h200.profile, %.0f with a 50 ms slice", builtin, slow)
	// A whole 20 ms kernel's wait a step allows at most 50 steps/s; a 1 ms
	// slice's, hundreds. Wide bounds for a loaded 2-core machine.
	if slow > 80 || builtin < 3*slow {
		t.Errorf("with a 50 ms slice the short kernels ran %.0f steps/s (want at most 80), with the built-in one %.0f (want 3x more)", slow, builtin)
	}
}

func profilePath(t *testing.T) string {
	return filepath.Join(simtest.Root(t), "simgpu", "models", "h200.profile")
}

// The h200 model's launch takes its profiled host time: at least the
// built-in 3275 ns executed, and what a profile sets. A floor, which load
// cannot break; the exact model's launch has none.
func TestProfileSetsTheLaunchCost(t *testing.T) {
	workload := simtest.Bin(t, "simgpu/workload")
	slow := filepath.Join(t.TempDir(), "slow-launch.profile")
	if err := os.WriteFile(slow, []byte("launch_exec_ns = 20000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	launchNs := func(env ...string) float64 {
		m := simtest.NewMachine(t, 1, "1Gi")
		c := m.Command(workload, "--launch-cost", "2000", "--label", "t")
		c.Env = append(c.Env, env...)
		out, err := c.CombinedOutput()
		if err != nil {
			t.Fatalf("workload %v: %v: %s", env, err, out)
		}
		for _, l := range strings.Split(string(out), "\n") {
			if f := strings.Fields(l); len(f) == 4 && f[1] == "t_launch_ns" {
				v, err := strconv.ParseFloat(f[2], 64)
				if err == nil {
					return v
				}
			}
		}
		t.Fatalf("workload %v printed no launch cost: %s", env, out)
		return 0
	}
	if got := launchNs("SIMGPU_MODEL=h200"); got < 3275 {
		t.Errorf("h200 model: a launch took %.0f ns; want at least the profile's 3275", got)
	}
	if got := launchNs("SIMGPU_MODEL=h200", "SIMGPU_PROFILE="+slow); got < 20000 {
		t.Errorf("launch_exec_ns = 20000: a launch took %.0f ns; want at least 20000", got)
	}
	t.Logf("exact model: %.0f ns a launch", launchNs())
}
