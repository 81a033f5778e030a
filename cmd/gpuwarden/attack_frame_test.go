package main

// Attacks that try to turn the judge against a tenant that did nothing, and
// the honest events that must never look like one: each with a real agent
// under onBreach: kill or freeze, real processes in real cgroups on simgpu.

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/gpuwarden/gpuwarden/collector"
	"github.com/gpuwarden/gpuwarden/enforcer/agentapi"
	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

// forgeSlot writes a live slot naming (pid, start) into a ledger, from
// inside cg, two aligned 8-byte words as forge writes them.
func forgeSlot(t *testing.T, cg *simtest.Cgroup, usage string, slot int, pid int, start uint64) {
	t.Helper()
	var u controlblock.Usage
	base := int64(unsafe.Offsetof(u.Slots)) + int64(slot)*int64(unsafe.Sizeof(u.Slots[0]))
	forgeAt(t, cg, usage, base, uint64(controlblock.SlotLive)|uint64(uint32(pid))<<32) // state, pid
	forgeAt(t, cg, usage, base+int64(unsafe.Offsetof(u.Slots[0].StartTime)), start)
}

// Attack 1: a tenant writes another tenant's GPU process (pid and start
// time, read from /proc) into a live slot of its own ledger, so that its
// refused claim names the innocent process. Nothing falls on the innocent:
// the framer, whose directory the ledger is, is the breach, and it is the
// one frozen or killed.
func TestAttackFramesAnInnocent(t *testing.T) {
	for _, action := range []string{"kill", "freeze"} {
		t.Run(action, func(t *testing.T) {
			simtest.RequirePrivileged(t, "eBPF and cgroups")
			m := simtest.NewMachine(t, 1, "16Gi")
			agent := simtest.StartAgent(t, m, "GPUWARDEN_ENFORCEMENT_ON_BREACH="+action)
			victimCg := simtest.NewCgroup(t, "innocent")
			victim := enforcedAlloc(t, m, agent, victimCg, "GPUWARDEN_MEMORY_LIMIT=1Gi")
			victim.Do(t, "alloc linear %d", 256<<20)
			framer := simtest.NewCgroup(t, "framer")
			enforcedAlloc(t, m, agent, framer, "GPUWARDEN_MEMORY_LIMIT=1Gi").Quit(t) // its ledger laid out, no GPU process left

			pid := victim.P.Cmd.Process.Pid
			start, err := controlblock.StartTime("/proc", pid)
			if err != nil {
				t.Fatal(err)
			}
			forgeSlot(t, framer, ledgerOf(agent, framer), 5, pid, start)

			wantBreach(t, agent, framer.Rel, collector.BreachFalseClaim)
			ev := wantEvent(t, agent, "breach", collector.BreachFalseClaim, framer.Rel)
			if !strings.Contains(ev.Message, fmt.Sprint(pid)) {
				t.Errorf("the framer's breach does not name the process its ledger names: %+v", ev)
			}
			stopped := map[string]string{"kill": "killed", "freeze": "frozen"}[action]
			wantEvent(t, agent, stopped, "", framer.Rel)
			var resp agentapi.ContainersResponse
			agent.GetJSON(t, "/api/v1/containers", &resp)
			dir := controlblock.ContainerKey(framer.Rel)
			if i := slices.IndexFunc(resp.RefusedLedgers, func(r agentapi.RefusedLedger) bool { return r.Dir == dir }); i < 0 ||
				!slices.Equal(resp.RefusedLedgers[i].Writers, []string{framer.Rel}) {
				t.Errorf("the API lists refused ledgers %+v; want %s written by %s", resp.RefusedLedgers, dir, framer.Rel)
			}

			time.Sleep(3 * time.Second) // more views, and an enforcer turn, with the forged slot in place
			var evs []event
			agent.GetJSON(t, "/api/v1/events", &evs)
			for _, e := range evs {
				if e.Cgroup == victimCg.Rel || slices.Contains(e.PIDs, pid) {
					t.Errorf("the innocent was judged: %+v", e)
				}
			}
			if frozen(t, victimCg) {
				t.Error("the innocent container is frozen")
			}
			victim.Do(t, "alloc linear %d", 128<<20) // alive, and still held by its interposer
			if e, ok := entry(t, agent, victimCg); !ok || len(e.Breaches) > 0 || !e.Enforced {
				t.Errorf("the innocent's entry: %+v (listed %v)", e, ok)
			}
			agentServes(t, agent)
		})
	}
}

// remakeCgroup removes cg (its processes gone) and makes a cgroup of the
// same path, as a restarted systemd unit or container gets: a new cgroup
// id under the old name.
func remakeCgroup(t *testing.T, cg *simtest.Cgroup) *simtest.Cgroup {
	t.Helper()
	simtest.Eventually(t, 10*time.Second, func() error {
		return os.Remove(cg.Path)
	})
	if err := os.Mkdir(cg.Path, 0o755); err != nil {
		t.Fatal(err)
	}
	again := simtest.OpenCgroup(t, cg.Path, cg.Rel)
	if again.ID == cg.ID {
		t.Fatalf("the cgroup made again kept its id %d", again.ID)
	}
	return again
}

// Attack 2, honest side: a container restarted in a cgroup of the same
// path finds the ledger its first run left (within controlDirGrace). Its
// ledger is bound to the new cgroup, so it is enforced, never judged as a
// bypass or a false claim, and runs on under onBreach: kill.
func TestRestartedContainerRunsOn(t *testing.T) {
	simtest.RequirePrivileged(t, "eBPF and cgroups")
	m := simtest.NewMachine(t, 1, "16Gi")
	agent := simtest.StartAgent(t, m, "GPUWARDEN_ENFORCEMENT_ON_BREACH=kill")
	first := simtest.NewCgroup(t, "restarted")
	run := enforcedAlloc(t, m, agent, first, "GPUWARDEN_MEMORY_LIMIT=1Gi")
	run.Do(t, "alloc linear %d", 256<<20)
	simtest.Eventually(t, breachWithin, func() error {
		if e, ok := entry(t, agent, first); !ok || !e.Enforced {
			return fmt.Errorf("first run not enforced: %+v (listed %v)", e, ok)
		}
		return nil
	})
	if err := run.P.Cmd.Process.Kill(); err != nil { // a crash: its slot is left for the reaper
		t.Fatal(err)
	}
	_, _ = run.P.Wait()

	again := remakeCgroup(t, first)
	if _, err := os.Stat(filepath.Dir(ledgerOf(agent, again))); err != nil {
		t.Fatalf("the control directory is gone before the restart: %v", err)
	}
	rerun := enforcedAlloc(t, m, agent, again, "GPUWARDEN_MEMORY_LIMIT=1Gi")
	rerun.Do(t, "alloc linear %d", 256<<20)
	simtest.Eventually(t, breachWithin, func() error {
		if e, ok := entry(t, agent, again); !ok || !e.Enforced || e.MemoryLimitBytes != 1<<30 {
			return fmt.Errorf("the restarted container is not enforced: %+v (listed %v)", e, ok)
		}
		return nil
	})
	time.Sleep(6 * time.Second) // past the judge's 2 s and an enforcer turn
	var evs []event
	agent.GetJSON(t, "/api/v1/events", &evs)
	for _, e := range evs {
		if e.Cgroup == again.Rel {
			t.Errorf("the restarted container was judged: %+v", e)
		}
	}
	rerun.Do(t, "alloc linear %d", 256<<20) // alive
	if r := rerun.Try(t, "alloc linear %d", 1<<30); r[0] == "ok" {
		t.Error("the restarted container is no longer held to its quota")
	}
	agentServes(t, agent)
}

// A slot is the container's word: one forged to name the agent itself, in
// a ledger whose claim stands, puts no pid in the container's entry that is
// not verified to be in the container.
func TestAttackForgedSlotNotListed(t *testing.T) {
	simtest.RequirePrivileged(t, "eBPF and cgroups")
	m := simtest.NewMachine(t, 1, "16Gi")
	agent := simtest.StartAgent(t, m)
	cg := simtest.NewCgroup(t, "lister")
	a := enforcedAlloc(t, m, agent, cg, "GPUWARDEN_MEMORY_LIMIT=1Gi")
	a.Do(t, "alloc linear %d", 128<<20)
	own := a.P.Cmd.Process.Pid
	agentPID := agent.Proc.Cmd.Process.Pid
	start, err := controlblock.StartTime("/proc", agentPID)
	if err != nil {
		t.Fatal(err)
	}
	forgeSlot(t, cg, ledgerOf(agent, cg), 9, agentPID, start)
	pids := func() error {
		e, ok := entry(t, agent, cg)
		if !ok || !slices.Equal(e.PIDs, []int{own}) {
			return fmt.Errorf("pids %v (listed %v), want only the container's process %d", e.PIDs, ok, own)
		}
		return nil
	}
	simtest.Eventually(t, breachWithin, pids)
	time.Sleep(5 * time.Second) // the slots are read again at least every fourth view
	if err := pids(); err != nil {
		t.Error(err)
	}
	agentServes(t, agent)
}
