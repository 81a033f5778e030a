package gpucheck

import (
	"os"
	"path/filepath"
	"testing"
)

// The report's CPU line says how the kernel clocks and idles the CPUs, and
// says so where sysfs has nothing (a virtual machine without cpufreq).
func TestDescribeCPUsFromSysfs(t *testing.T) {
	root := t.TempDir()
	write := func(p, v string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := describeCPUs(root, 2), "2, cpu1's core runs CPUs unknown; cpufreq none; cpuidle driver unknown, governor unknown, states none"; got != want {
		t.Errorf("empty sysfs: %q, want %q", got, want)
	}
	write("cpu0/cpufreq/scaling_driver", "intel_pstate")
	write("cpu0/cpufreq/scaling_governor", "powersave")
	write("cpu0/cpuidle/state0/name", "POLL")
	write("cpu0/cpuidle/state1/name", "C1")
	write("cpu0/cpuidle/state1/latency", "2")
	write("cpu0/cpuidle/state2/name", "C6")
	write("cpu0/cpuidle/state2/latency", "170")
	write("cpu1/topology/thread_siblings_list", "1,9")
	write("cpuidle/current_driver", "intel_idle")
	write("cpuidle/current_governor_ro", "menu")
	want := "16, cpu1's core runs CPUs 1,9; cpufreq intel_pstate, governor powersave; cpuidle driver intel_idle, governor menu, states POLL, C1 (2 µs), C6 (170 µs)"
	if got := describeCPUs(root, 16); got != want {
		t.Errorf("%q, want %q", got, want)
	}
}
