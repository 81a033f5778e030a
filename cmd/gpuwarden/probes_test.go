package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/cilium/ebpf/features"

	"github.com/gpuwarden/gpuwarden/bpf/probes"
	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

// The agent's launch probe counts every launch of a process that keeps no
// ledger, from any thread, and none of a process under the interposer,
// whose ledger counts them: real agent, interposer and cgroups, the counts
// read from the agent's own eBPF map. Enforcing, the agent reads the
// ledgers every 4 s; without, the probes' question has them read.
func TestAgentCountsLaunchesOnlyWithoutLedger(t *testing.T) {
	simtest.RequirePrivileged(t, "eBPF")
	if err := features.HaveBPFLinkUprobeMulti(); err != nil {
		t.Skipf("launches are counted one process at a time from Linux 6.6 (uprobe-multi links): %v", err)
	}
	for _, enforce := range []bool{true, false} {
		t.Run(fmt.Sprintf("enforcement=%t", enforce), func(t *testing.T) {
			countsLaunchesOnlyWithoutLedger(t, fmt.Sprintf("GPUWARDEN_ENFORCEMENT_ENABLED=%t", enforce))
		})
	}
}

func countsLaunchesOnlyWithoutLedger(t *testing.T, env ...string) {
	m := simtest.NewMachine(t, 1, "4Gi")
	agent := simtest.StartAgent(t, m, env...)
	pid := agent.Proc.Cmd.Process.Pid
	ledgered, bypassing := simtest.NewCgroup(t, "ledgered"), simtest.NewCgroup(t, "bypassing")
	exact := func(cg *simtest.Cgroup) uint64 {
		t.Helper()
		counts, err := probes.ProcessExactLaunches(pid)
		if err != nil {
			t.Fatal(err)
		}
		var n uint64
		for k, v := range counts {
			if k.Cgroup == cg.ID {
				n += v
			}
		}
		return n
	}

	led := enforcedAlloc(t, m, agent, ledgered)
	byp := simtest.StartAllocProg(t, bypassing.Place(m.Command(simtest.Bin(t, "bpf/cuda-alloc"))))
	byp.Do(t, "ctx 0")
	// Each is counted exactly from the scan that finds it; the ledgered
	// one until the agent's view of the ledgers names it (a view every 4 s).
	// The scan that finds the bypassing process has found the other too.
	within(t, 30*time.Second, func() (bool, string) {
		before := exact(bypassing)
		byp.Do(t, "launch 1")
		return exact(bypassing) > before, "the bypassing process's launches are not counted"
	})
	within(t, 30*time.Second, func() (bool, string) {
		before := exact(ledgered)
		led.Do(t, "launch 100")
		n := exact(ledgered) - before
		return n == 0, fmt.Sprintf("the ledgered process still has its launches probed (%d of 100)", n)
	})

	l0, b0 := exact(ledgered), exact(bypassing)
	for _, p := range []*simtest.AllocProg{led, byp} {
		p.Do(t, "launch 1000")
		p.Do(t, "launch 10 ex")
		p.Do(t, "launch 5 graph") // one cuLaunchKernel while capturing, then 5 cuGraphLaunch
		p.Do(t, "launchthread 100")
	}
	if n := exact(ledgered) - l0; n != 0 {
		t.Errorf("the probe counted %d launches of the process under the interposer, want none", n)
	}
	if n := exact(bypassing) - b0; n != 1116 {
		t.Errorf("the probe counted %d launches of the bypassing process, want all 1116", n)
	}
	led.Quit(t)
	byp.Quit(t)
}

// within polls cond until it holds, failing with what it last said.
func within(t *testing.T, timeout time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", timeout, why)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
