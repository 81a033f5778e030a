package main

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/agentapi"

	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

// startEnforced starts a training workload under the interposer in a cgroup of its own.
func startEnforced(t *testing.T, m *simtest.Machine, agent *simtest.Agent, name string, env ...string) *simtest.Cgroup {
	t.Helper()
	cg := simtest.NewCgroup(t, name)
	cmd := cg.Place(m.Command(simtest.Bin(t, "simgpu/workload"), "--alloc", "1Gi", "--seconds", "120",
		"--kernels", "8", "--kernel-ns", "2000000"))
	cmd.Env = append(cmd.Env, "LD_PRELOAD="+simtest.Bin(t, "libgpuwarden.so"), "GPUWARDEN_CONTROL_DIR="+agent.ControlDir)
	cmd.Env = append(cmd.Env, env...)
	simtest.Start(t, cmd).WaitLine(t, "ready", 10*time.Second)
	return cg
}

// entry returns the API's entry for a cgroup on GPU 0.
func entry(t *testing.T, agent *simtest.Agent, cg *simtest.Cgroup) (agentapi.ContainerDevice, bool) {
	var resp agentapi.ContainersResponse
	agent.GetJSON(t, "/api/v1/containers", &resp)
	for _, c := range resp.Containers {
		if c.CgroupID == cg.ID && c.GPU == 0 {
			return c, true
		}
	}
	return agentapi.ContainerDevice{}, false
}

func wantTargets(t *testing.T, agent *simtest.Agent, within time.Duration, want map[*simtest.Cgroup]float64) {
	t.Helper()
	simtest.Eventually(t, within, func() error {
		for cg, w := range want {
			e, ok := entry(t, agent, cg)
			if !ok || math.Abs(e.ComputeLimit-w) > 0.01 {
				return fmt.Errorf("%s: target %.3f (listed %v), want %.3f", cg.Rel, e.ComputeLimit, ok, w)
			}
		}
		return nil
	})
}

func ctl(t *testing.T, agent *simtest.Agent, args ...string) (string, error) {
	t.Helper()
	out, err := exec.Command(simtest.Bin(t, "gpuwarden"), append([]string{"ctl", "--agent", agent.Addr,
		"--token-file", agent.TokenFile}, args...)...).CombinedOutput()
	return string(out), err
}

// TestAgentEnforcesWeightsAndHotChanges: the agent puts containers under
// the enforcer on its own (weights from their environment), `gpuwarden ctl`
// changes a weight at run time, and the change outlives an agent restart.
func TestAgentEnforcesWeightsAndHotChanges(t *testing.T) {
	simtest.RequirePrivileged(t, "eBPF and cgroups")
	m := simtest.NewMachine(t, 1, "16Gi")
	agent := simtest.StartAgent(t, m)
	a := startEnforced(t, m, agent, "wa", "GPUWARDEN_COMPUTE_WEIGHT=1")
	b := startEnforced(t, m, agent, "wb", "GPUWARDEN_COMPUTE_WEIGHT=2")
	wantTargets(t, agent, 10*time.Second, map[*simtest.Cgroup]float64{a: 1.0 / 3, b: 2.0 / 3})

	// The heavier container gets more of the device (wide bounds: the
	// precise figures are make bench's).
	simtest.Eventually(t, 15*time.Second, func() error {
		ea, _ := entry(t, agent, a)
		eb, _ := entry(t, agent, b)
		if eb.ComputeShare < 1.3*ea.ComputeShare || ea.ComputeShare == 0 {
			return fmt.Errorf("shares a %.2f b %.2f: want b well above a", ea.ComputeShare, eb.ComputeShare)
		}
		return nil
	})

	// The change is in force when ctl's answer comes: the answer lists the
	// targets the scheduler holds both containers to.
	start := time.Now()
	out, err := ctl(t, agent, "set", b.Rel, "--weight", "3")
	if err != nil {
		t.Fatalf("ctl set: %v: %s", err, out)
	}
	t.Logf("ctl set answered in %v:\n%s", time.Since(start), out)
	for _, want := range []string{"target 25.0%", "target 75.0%"} {
		if !strings.Contains(out, want) {
			t.Errorf("ctl set's answer lacks %q", want)
		}
	}
	wantTargets(t, agent, 5*time.Second, map[*simtest.Cgroup]float64{a: 0.25, b: 0.75})
	t.Logf("the new weight showed in the metrics after %v", time.Since(start))

	// Restart the agent on the same control directory and settings file.
	agent.Stop(t)
	again := simtest.StartAgent(t, m, "GPUWARDEN_CONTROL_DIR="+agent.ControlDir, "GPUWARDEN_ENFORCEMENT_STATE_FILE="+agent.StateFile)
	wantTargets(t, again, 10*time.Second, map[*simtest.Cgroup]float64{a: 0.25, b: 0.75})
}

// TestAgentSetsGracePeriod: every limits file the agent manages carries
// enforcement.gracePeriod, the time the interposer keeps the budgets of an
// agent that stopped answering.
func TestAgentSetsGracePeriod(t *testing.T) {
	simtest.RequirePrivileged(t, "eBPF and cgroups")
	m := simtest.NewMachine(t, 1, "16Gi")
	agent := simtest.StartAgent(t, m, "GPUWARDEN_ENFORCEMENT_GRACE_PERIOD=3s")
	cg := startEnforced(t, m, agent, "grace")
	path := controlblock.LimitsPath(agent.ControlDir, controlblock.ContainerKey(cg.Rel))
	simtest.Eventually(t, 10*time.Second, func() error {
		l, err := controlblock.OpenLimits(path)
		if err != nil {
			return err
		}
		defer l.Close()
		if g := l.Config().GraceNs; g != uint64(3*time.Second) {
			return fmt.Errorf("grace %v, want 3s", time.Duration(g))
		}
		return nil
	})
}

// TestAgentSetsTimeSlice: enforcement.timeSlice is the scheduler's slice:
// two busy containers hand the GPU over about 2.5 times a second at 400 ms
// (20 at the default 50 ms).
func TestAgentSetsTimeSlice(t *testing.T) {
	simtest.RequirePrivileged(t, "eBPF and cgroups")
	m := simtest.NewMachine(t, 1, "16Gi")
	agent := simtest.StartAgent(t, m, "GPUWARDEN_ENFORCEMENT_TIME_SLICE=400ms")
	a, b := startEnforced(t, m, agent, "slice-a"), startEnforced(t, m, agent, "slice-b")
	wantTargets(t, agent, 10*time.Second, map[*simtest.Cgroup]float64{a: 0.5, b: 0.5})
	handovers := func() (uint64, time.Time) {
		var gpu agentapi.GPUInfo
		agent.GetJSON(t, "/api/v1/gpus/0", &gpu)
		return gpu.Slices.Handovers, time.Now()
	}
	n0, t0 := handovers()
	time.Sleep(4 * time.Second)
	n1, t1 := handovers()
	if perSec := float64(n1-n0) / t1.Sub(t0).Seconds(); perSec <= 0 || perSec > 5 {
		t.Errorf("%.1f hand-overs a second, want 0-5 (slices of 400 ms: about 2.5)", perSec)
	}
}

func TestCtlRefusesBadChanges(t *testing.T) {
	simtest.RequirePrivileged(t, "eBPF and cgroups")
	m := simtest.NewMachine(t, 1, "16Gi")
	agent := simtest.StartAgent(t, m)
	a := startEnforced(t, m, agent, "bad", "GPUWARDEN_MEMORY_LIMIT=4Gi")
	wantTargets(t, agent, 10*time.Second, map[*simtest.Cgroup]float64{a: 1})

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"set", "/no/such/cgroup", "--weight", "2"}, "no container"},
		{[]string{"set", a.Rel, "--weight", "0"}, "weight"},
		{[]string{"set", a.Rel, "--compute-limit", "150"}, "compute limit"},
		{[]string{"set", a.Rel, "--priority", "urgent"}, "priority"},
		{[]string{"set", a.Rel, "--memory-limit", "lots"}, "memory limit"},
		{[]string{"gpu", "0", "--policy", "9"}, "policy"},
	} {
		out, err := ctl(t, agent, tc.args...)
		if err == nil || !strings.Contains(strings.ToLower(out), strings.ToLower(tc.want)) {
			t.Errorf("ctl %v: %v %q; want refused naming %q", tc.args, err, out, tc.want)
		}
	}
	// A limit below what the container holds is taken, and reported.
	out, err := ctl(t, agent, "set", a.Rel, "--memory-limit", "512Mi")
	if err != nil || !strings.Contains(out, "already holds") {
		t.Errorf("ctl set --memory-limit 512Mi: %v %q; want ok with a warning", err, out)
	}
	simtest.Eventually(t, 5*time.Second, func() error {
		if e, _ := entry(t, agent, a); e.MemoryLimitBytes != 512<<20 {
			return fmt.Errorf("limit %d", e.MemoryLimitBytes)
		}
		return nil
	})
	// Without the token nothing changes.
	out2, err := exec.Command(simtest.Bin(t, "gpuwarden"), "ctl", "--agent", agent.Addr, "--token-file",
		filepath.Join(t.TempDir(), "none"), "set", a.Rel, "--weight", "2").CombinedOutput()
	if err == nil {
		t.Errorf("ctl without the token: %q", out2)
	}
}

// TestCtlGPUMaxInst: a GPU's max_inst is the configured devicePlugin.maxInst
// (4) until ctl changes it: fair-share gives 1/max_inst, `ctl gpu N` shows it
// with cGPU's free_weight, and a max_inst out of range is refused.
func TestCtlGPUMaxInst(t *testing.T) {
	simtest.RequirePrivileged(t, "eBPF and cgroups")
	m := simtest.NewMachine(t, 1, "16Gi")
	agent := simtest.StartAgent(t, m)
	startEnforced(t, m, agent, "mi")
	simtest.Eventually(t, 10*time.Second, func() error {
		if out, err := ctl(t, agent, "gpu", "0"); err != nil || !strings.Contains(out, "max_inst 4, free_weight 3, 1 containers") {
			return fmt.Errorf("ctl gpu 0: %v %q", err, out)
		}
		return nil
	})
	for _, step := range []struct {
		args []string
		want []string
	}{
		{[]string{"--policy", "fair-share"}, []string{"target 25.0%", "policy fair-share (set), max_inst 4"}},
		{[]string{"--max-inst", "2"}, []string{"target 50.0%", "max_inst 2, free_weight 1"}},
	} {
		out, err := ctl(t, agent, append([]string{"gpu", "0"}, step.args...)...)
		for _, w := range step.want {
			if err != nil || !strings.Contains(out, w) {
				t.Errorf("ctl gpu 0 %v: %v %q; want %q", step.args, err, out, w)
			}
		}
	}
	if out, err := ctl(t, agent, "gpu", "0", "--max-inst", "129"); err == nil || !strings.Contains(out, "max_inst 129: want an integer from 1 to 128") {
		t.Errorf("ctl gpu 0 --max-inst 129: %v %q; want refused", err, out)
	}
}

// TestAgentFreezesBypass: with onBypass: freeze, a cgroup that uses the GPU
// without the interposer is frozen, and thawed when told.
func TestAgentFreezesBypass(t *testing.T) {
	simtest.RequirePrivileged(t, "eBPF and cgroups")
	m := simtest.NewMachine(t, 1, "16Gi")
	agent := simtest.StartAgent(t, m, "GPUWARDEN_ENFORCEMENT_ON_BYPASS=freeze")
	cg := simtest.NewCgroup(t, "bypass")
	simtest.Start(t, cg.Place(m.Command(simtest.Bin(t, "simgpu/workload"), "--alloc", "1Gi", "--hold"))).
		WaitLine(t, "ready", 10*time.Second)
	frozen := func() string {
		b, _ := os.ReadFile(filepath.Join(cg.Path, "cgroup.events"))
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "frozen "); ok {
				return v
			}
		}
		return "?"
	}
	simtest.Eventually(t, 20*time.Second, func() error {
		if f := frozen(); f != "1" {
			return fmt.Errorf("frozen %s", f)
		}
		return nil
	})
	out, err := ctl(t, agent, "events")
	if err != nil || !strings.Contains(out, "bypass") || !strings.Contains(out, cg.Rel) {
		t.Errorf("ctl events: %v %q", err, out)
	}
	if out, err := ctl(t, agent, "unfreeze", "/no/such/cgroup"); err == nil || !strings.Contains(out, "froze no cgroup") {
		t.Errorf("ctl unfreeze of a cgroup never frozen: %v %q", err, out)
	}
	if out, err := ctl(t, agent, "unfreeze", cg.Rel); err != nil {
		t.Fatalf("ctl unfreeze: %v %q", err, out)
	}
	simtest.Eventually(t, 5*time.Second, func() error {
		if f := frozen(); f != "0" {
			return fmt.Errorf("frozen %s", f)
		}
		return nil
	})
}
