package gpucheck

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/hostcgroup"
	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

// simulation is one run of the bundle's run.sh --simulate, as a user runs
// it on a GPU machine, shared by the tests that read its report: every part
// runs once per suite.
var simulation struct {
	once   sync.Once
	out    string // its report directory
	output []byte // what run.sh printed
	pid    int
	err    error
}

func simulated(t *testing.T) (out string, output []byte, pid int) {
	t.Helper()
	simtest.RequirePrivileged(t, "cgroups and eBPF")
	runSh := filepath.Join(simtest.Root(t), "bin", "gpu-check", "run.sh")
	if _, err := os.Stat(runSh); err != nil {
		t.Fatalf("the bundle is missing (make gpu-check builds it; make test does first): %v", err)
	}
	simulation.once.Do(func() {
		if simulation.out, simulation.err = os.MkdirTemp("", "gpu-check-simulated"); simulation.err != nil {
			return
		}
		start := time.Now()
		cmd := exec.Command(runSh, "--simulate", simulation.out)
		simulation.output, simulation.err = cmd.CombinedOutput()
		if cmd.Process != nil {
			simulation.pid = cmd.Process.Pid
		}
		t.Logf("run.sh --simulate took %s", time.Since(start).Round(time.Second))
	})
	if simulation.err != nil {
		t.Fatalf("run.sh --simulate: %v\n%s", simulation.err, simulation.output)
	}
	return simulation.out, simulation.output, simulation.pid
}

func TestMain(m *testing.M) {
	code := m.Run()
	if simulation.out != "" {
		os.RemoveAll(simulation.out)
	}
	os.Exit(code)
}

// The check's simulation mode: every part passes on simgpu, the parts
// that need NVIDIA's tools say why they were skipped, the figures come
// out, and the machine is left as it was.
func TestSimulationMode(t *testing.T) {
	out, b, pid := simulated(t)
	report, err := os.ReadFile(filepath.Join(out, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range parts {
		if !strings.Contains(string(report), "| "+p.title+" | pass |") {
			t.Errorf("part %q did not pass:\n%s", p.title, report)
		}
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`\| driver API: vmm \| pass \|`),
		regexp.MustCompile(`\| PyTorch \| skipped \| simulation mode: needs NVIDIA's driver and PyTorch`),
		regexp.MustCompile(`\| bytes in probe-b \| pass \| agent saw 3 GiB from "ebpf"`),
		regexp.MustCompile(`\| host_pace \| pass \| Python work at the duty cycles of weights 1:2 with 50ms slices`),
		regexp.MustCompile(`\| weighted_1to2_k2ms \| pass \|`),
		regexp.MustCompile(`\| weighted_1to2_k2ms judged \| pass \| the agent holds neither container in breach`),
	} {
		if !want.Match(report) {
			t.Errorf("the report lacks %s:\n%s", want, report)
		}
	}
	// Every function simgpu's cuda.h declares is checked, and passes.
	if m := regexp.MustCompile(`\| cuda\.h functions \| pass \| (\d+) of (\d+) prototypes`).FindSubmatch(report); m == nil ||
		string(m[1]) != string(m[2]) || len(m[1]) < 2 {
		t.Errorf("the report lacks cuda.h's functions all passing, some tens of them:\n%s", report)
	}
	bench, err := os.ReadFile(filepath.Join(out, "bench.txt"))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"launch_capture_ns_overhead", "launch_sync_ns_overhead", "training_interposer_ratio", "training_probes_ratio",
		"shares_weighted_1to2_k2ms_ratio", "shares_fixed_30_70_k2ms_ratio", "probes_launches_counted_ratio"} {
		if !regexp.MustCompile(`(?m)^BENCH gpucheck_` + name + ` -?[0-9.]+ \S+$`).Match(bench) {
			t.Errorf("bench.txt lacks %s:\n%s", name, bench)
		}
	}
	// The agent's own clock holds the weighted row near 1:2 (its figure
	// comes through the API: 0 would say nothing reached it).
	if m := regexp.MustCompile(`(?m)^BENCH gpucheck_shares_weighted_1to2_k2ms_agent_ratio ([0-9.]+) `).FindSubmatch(bench); m == nil {
		t.Errorf("bench.txt lacks the weighted row's agent ratio")
	} else if v, _ := strconv.ParseFloat(string(m[1]), 64); v < 1.3 || v > 2.7 {
		t.Errorf("the agent's clock measured the weighted row at %.3f; want about 2", v)
	}
	// The host-pace row measured both roles: a ratio far from 1 would say
	// one role's work or length was miscounted, not the host.
	if m := regexp.MustCompile(`(?m)^BENCH gpucheck_shares_host_pace_large_over_small ([0-9.]+) `).FindSubmatch(bench); m == nil {
		t.Errorf("bench.txt lacks the host-pace row's ratio")
	} else if v, _ := strconv.ParseFloat(string(m[1]), 64); v < 0.5 || v > 2 {
		t.Errorf("the host-pace row measured the larger role at %.3f the smaller's pace; want about 1", v)
	}
	// The calibration's profile carries the launch's host time as simgpu
	// models it: on simgpu's h200 model, at least the model's own.
	profile, err := os.ReadFile(filepath.Join(out, "simgpu.profile"))
	if err != nil {
		t.Fatal(err)
	}
	for key, floor := range map[string]int{"launch_capture_ns": 604, "launch_exec_ns": 3275} {
		v := 0
		if m := regexp.MustCompile(`(?m)^` + key + ` = (\d+)  #`).FindSubmatch(profile); m != nil {
			v, _ = strconv.Atoi(string(m[1]))
		}
		if v < floor {
			t.Errorf("simgpu.profile: want %s of at least %d ns (the model's):\n%s", key, floor, profile)
		}
	}
	if !strings.Contains(string(b), "BENCH gpucheck_launch_capture_ns_overhead") {
		t.Errorf("run.sh did not print the BENCH lines:\n%s", b)
	}
	// Nothing left behind: no cgroup of the check's, no agent of the bundle's.
	mnt, err := hostcgroup.Mount("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(mnt, fmt.Sprintf("gpuwarden-check-%d", pid))); !os.IsNotExist(err) {
		t.Errorf("the check's cgroups were left behind (%v)", err)
	}
	if ps, _ := exec.Command("pgrep", "-f", filepath.Join("gpu-check", "bin", "gpuwarden")).Output(); len(ps) > 0 {
		t.Errorf("processes left behind: %s", ps)
	}
}
