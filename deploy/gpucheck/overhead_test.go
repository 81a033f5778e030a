package gpucheck

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// Part 5, from the bundle's simulated run: the launching processes pinned,
// the three shims timed beside the plain and interposer rows, three whole
// training rounds, and the agent's own eBPF programs counted while it
// trained (the mmap-lock tracepoint runs for every process, the exit
// tracepoint at least for the trainer's threads).
func TestOverheadPart(t *testing.T) {
	out, _, _ := simulated(t)
	report, err := os.ReadFile(filepath.Join(out, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`\| 5\. Overhead \| pass \|`),
		regexp.MustCompile(`\| launching core \| pass \| core \d+ \(`),
		regexp.MustCompile(`\| training throughput \| pass \| .*mean of 3 alternating rounds`),
	} {
		if !want.Match(report) {
			t.Errorf("the report lacks %s:\n%s", want, report)
		}
	}
	bench, err := os.ReadFile(filepath.Join(out, "bench.txt"))
	if err != nil {
		t.Fatal(err)
	}
	value := func(name string) float64 {
		m := regexp.MustCompile(`(?m)^BENCH gpucheck_` + name + ` (-?[0-9.]+) \S+$`).FindSubmatch(bench)
		if m == nil {
			t.Errorf("bench.txt lacks %s", name)
			return 0
		}
		v, _ := strconv.ParseFloat(string(m[1]), 64)
		return v
	}
	for _, m := range []string{"launch_capture_ns", "launch_sync_ns"} {
		for _, row := range []string{"without_interposer", "with_interposer", "shim_tail", "shim_add", "shim_lock"} {
			if v := value(m + "_" + row); v <= 0 {
				t.Errorf("%s_%s = %v ns, want a time", m, row, v)
			}
			value(m + "_" + row + "_spread")
		}
		value(m + "_locked_add_cost")
	}
	for _, round := range []string{"1", "2", "3"} {
		for _, s := range []string{"plain", "probes", "interposer"} {
			if v := value("training_round" + round + "_images_per_sec_" + s); v <= 0 {
				t.Errorf("round %s %s: %v images/s", round, s, v)
			}
		}
	}
	if v := value("training_rounds"); v != 3 {
		t.Errorf("training_rounds = %v, want 3", v)
	}
	for _, prog := range []string{"on_mmap_unlock", "on_exit"} {
		if v := value("training_probes_prog_" + prog + "_hits_per_sec"); v <= 0 {
			t.Errorf("%s: %v hits/s over the probed runs, want some", prog, v)
		}
		if v := value("training_probes_prog_" + prog + "_ns_per_hit"); v <= 0 {
			t.Errorf("%s: %v ns per hit, want a run time", prog, v)
		}
		row := regexp.MustCompile(`(?m)^\| ` + prog + ` \| ([0-9.]+) \| ([0-9]+) \| `).FindSubmatch(report)
		if row == nil || string(row[1]) == "0.0" || string(row[2]) == "0" {
			t.Errorf("the report has no row with hits for %s:\n%s", prog, report)
		}
	}
	if !strings.Contains(string(report), "No hits: ") {
		t.Errorf("the report does not name the programs that did not run:\n%s", report)
	}
}

// A round cut short by the part's time leaves the earlier setups one run
// ahead of the last: the means must be over the whole rounds alone.
func TestWholeRounds(t *testing.T) {
	rates := map[string][]float64{"plain": {1, 2, 3}, "interposer": {4, 5, 6}, "probes": {7, 8}}
	if n := wholeRounds(rates, "probes"); n != 2 {
		t.Fatalf("whole rounds: %d, want 2", n)
	}
	for k, v := range rates {
		if len(v) != 2 {
			t.Errorf("%s keeps %d runs, want 2: %v", k, len(v), v)
		}
	}
	if n := wholeRounds(map[string][]float64{"plain": {1}}, "probes"); n != 0 {
		t.Errorf("no run of the last setup: %d whole rounds, want 0", n)
	}
}
