package main

// Attacks of a hostile tenant on what the agent believes, each made by real
// processes in real cgroups against the real agent on simgpu: the node's
// own view (eBPF, NVML) judges, the breach is reported within seconds, and
// enforcement.onBreach stops the offender and nobody else.

import (
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/gpuwarden/gpuwarden/collector"
	"github.com/gpuwarden/gpuwarden/collector/kubeapi"
	"github.com/gpuwarden/gpuwarden/collector/kubeapi/kubeapitest"
	"github.com/gpuwarden/gpuwarden/collector/kubelet/kubelettest"
	"github.com/gpuwarden/gpuwarden/deploy/allocation"
	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
	"github.com/gpuwarden/gpuwarden/enforcer/hostcgroup"
	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

// breachWithin: how long a breach may take to show in the metrics and the
// events (views are built at most once a second, a comparison must fail for
// 2 s, the enforcer looks every 4 s); wide, for a loaded machine.
const breachWithin = 30 * time.Second

// enforcedAlloc starts cuda-alloc under the interposer in cg, with a context on GPU 0.
func enforcedAlloc(t *testing.T, m *simtest.Machine, agent *simtest.Agent, cg *simtest.Cgroup, env ...string) *simtest.AllocProg {
	t.Helper()
	cmd := cg.Place(m.Command(simtest.Bin(t, "bpf/cuda-alloc")))
	cmd.Env = append(cmd.Env, "LD_PRELOAD="+simtest.Bin(t, "libgpuwarden.so"), "GPUWARDEN_CONTROL_DIR="+agent.ControlDir)
	cmd.Env = append(cmd.Env, env...)
	a := simtest.StartAllocProg(t, cmd)
	a.Do(t, "ctx 0")
	return a
}

// usageOffset is a ledger field's byte offset (the Go mirror of the ABI header).
func usageOffset(field string) int64 {
	var u controlblock.Usage
	switch field {
	case "reserved_bytes":
		return int64(unsafe.Offsetof(u.ReservedBytes))
	case "launches_issued":
		return int64(unsafe.Offsetof(u.LaunchesIssued))
	case "cgroup_id":
		return int64(unsafe.Offsetof(u.CgroupID))
	}
	panic("no ledger field " + field)
}

// forge writes a 64-bit value into a ledger field from inside the
// container's cgroup, as a process of the container would (dd into the
// usage file it is given).
func forge(t *testing.T, cg *simtest.Cgroup, usage, field string, v uint64) {
	t.Helper()
	forgeAt(t, cg, usage, usageOffset(field), v)
}

// forgeAt writes a 64-bit value at an 8-byte aligned offset of a ledger.
func forgeAt(t *testing.T, cg *simtest.Cgroup, usage string, off int64, v uint64) {
	t.Helper()
	src := filepath.Join(t.TempDir(), "word")
	if err := os.WriteFile(src, binary.LittleEndian.AppendUint64(nil, v), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := cg.Place(exec.Command("dd", "if="+src, "of="+usage, "bs=8", "count=1",
		fmt.Sprintf("seek=%d", off/8), "conv=notrunc", "status=none"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("forge at %d: %v: %s", off, err, out)
	}
}

func ledgerOf(agent *simtest.Agent, cg *simtest.Cgroup) string {
	return controlblock.UsagePath(agent.ControlDir, controlblock.ContainerKey(cg.Rel))
}

// wantBreach waits for gpuwarden_container_breach{reason} and
// gpuwarden_container_unenforced of the container labelled container (off
// Kubernetes, its cgroup path).
func wantBreach(t *testing.T, agent *simtest.Agent, container, reason string) {
	t.Helper()
	wantBreachOf(t, agent, map[string]string{"container": container, "gpu": "0"}, reason)
}

func wantBreachOf(t *testing.T, agent *simtest.Agent, labels map[string]string, reason string) {
	t.Helper()
	start := time.Now()
	withReason := map[string]string{"reason": reason}
	for k, v := range labels {
		withReason[k] = v
	}
	simtest.Eventually(t, breachWithin, func() error {
		f := agent.Scrape(t)
		if s, ok := simtest.Find(f, "gpuwarden_container_breach", withReason); !ok || s.Value != 1 {
			return fmt.Errorf("no breach %v; breaches: %v", withReason, f["gpuwarden_container_breach"])
		}
		if s, ok := simtest.Find(f, "gpuwarden_container_unenforced", labels); !ok || s.Value != 1 {
			return fmt.Errorf("unenforced of %v: %v %v", labels, s.Value, ok)
		}
		return nil
	})
	t.Logf("breach %s of %v in the metrics after %v", reason, labels, time.Since(start).Round(100*time.Millisecond))
}

type event struct {
	Kind, Reason, Cgroup, Message string
	PIDs                          []int
}

// wantEvent waits for an event of kind (and reason, if given) on cgroup.
func wantEvent(t *testing.T, agent *simtest.Agent, kind, reason, cgroup string) event {
	t.Helper()
	var got event
	simtest.Eventually(t, breachWithin, func() error {
		var evs []event
		agent.GetJSON(t, "/api/v1/events", &evs)
		for _, e := range evs {
			if e.Kind == kind && e.Cgroup == cgroup && (reason == "" || e.Reason == reason) {
				got = e
				return nil
			}
		}
		return fmt.Errorf("no %s %s event on %s: %+v", kind, reason, cgroup, evs)
	})
	return got
}

func frozen(t *testing.T, cg *simtest.Cgroup) bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(cg.Path, "cgroup.events"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Contains(string(b), "frozen 1")
}

func agentServes(t *testing.T, agent *simtest.Agent) {
	t.Helper()
	if code, body := agent.Get(t, "/healthz"); code != 200 {
		t.Fatalf("/healthz = %d %s", code, body)
	}
}

// contextReserve is what the interposer charges a context against the
// quota (limits.context_reserve's default).
const contextReserve = 64 << 20

// wantFreshAllocation: a new container with a quota can allocate all of it
// (less its context's reserve), so nothing the offender held is lost.
func wantFreshAllocation(t *testing.T, m *simtest.Machine, agent *simtest.Agent, quota string) {
	t.Helper()
	fresh := enforcedAlloc(t, m, agent, simtest.NewCgroup(t, "fresh"), "GPUWARDEN_MEMORY_LIMIT="+quota)
	simtest.Eventually(t, breachWithin, func() error {
		if r := fresh.Try(t, "alloc linear %d", parseSize(t, quota)-contextReserve); r[0] != "ok" {
			return fmt.Errorf("a fresh container's %s allocation: %s", quota, r)
		}
		return nil
	})
}

func parseSize(t *testing.T, s string) uint64 {
	t.Helper()
	var n uint64
	var unit string
	if _, err := fmt.Sscanf(s, "%d%s", &n, &unit); err != nil {
		t.Fatalf("size %q: %v", s, err)
	}
	return n << map[string]uint{"Mi": 20, "Gi": 30}[unit]
}

// Attack 2: a process under the interposer writes 0 into its ledger's
// reserved_bytes, then allocates past its quota. eBPF sees what it holds:
// a breach, and with onBreach: kill its processes are gone and its memory
// comes back.
func TestAttackForgedReservedBytes(t *testing.T) {
	simtest.RequirePrivileged(t, "eBPF and cgroups")
	m := simtest.NewMachine(t, 1, "4Gi")
	agent := simtest.StartAgent(t, m, "GPUWARDEN_ENFORCEMENT_ON_BREACH=kill")
	cg := simtest.NewCgroup(t, "forger")
	bystander := enforcedAlloc(t, m, agent, simtest.NewCgroup(t, "bystander"), "GPUWARDEN_MEMORY_LIMIT=256Mi")
	a := enforcedAlloc(t, m, agent, cg, "GPUWARDEN_MEMORY_LIMIT=2Gi")
	a.Do(t, "alloc linear %d", 1536<<20)
	if r := a.Try(t, "alloc linear %d", 1<<30); r[0] == "ok" {
		t.Fatalf("the interposer let 2.5 GiB through a 2 GiB quota before any forgery")
	}
	forge(t, cg, ledgerOf(agent, cg), "reserved_bytes", 0)
	a.Do(t, "alloc linear %d", 1536<<20) // 3 GiB held on a 2 GiB quota

	wantBreach(t, agent, cg.Rel, collector.BreachOverLimit)
	ev := wantEvent(t, agent, "breach", collector.BreachOverLimit, cg.Rel)
	if !strings.Contains(ev.Message, "quota") {
		t.Errorf("the event gives no evidence: %+v", ev)
	}
	wantEvent(t, agent, "killed", "", cg.Rel)
	if _, err := a.P.Wait(); err == nil {
		t.Error("the forger exited cleanly; want killed")
	}
	if r := bystander.Try(t, "alloc linear %d", 128<<20); r[0] != "ok" {
		t.Errorf("the bystander container no longer works: %s", r)
	}
	agentServes(t, agent)
	wantFreshAllocation(t, m, agent, "2Gi")
}

// Attack 2: resetting launches_issued lifts the launch gate until the next
// true-up; the ledger's counter going back is a breach (seen by the
// scheduler, which reads the tickets every tick).
func TestAttackRewoundLaunches(t *testing.T) {
	simtest.RequirePrivileged(t, "eBPF and cgroups")
	m := simtest.NewMachine(t, 1, "16Gi")
	agent := simtest.StartAgent(t, m)
	cg := startEnforced(t, m, agent, "rewinder", "GPUWARDEN_COMPUTE_LIMIT=50") // gated: it takes launch tickets
	tickets := func() uint64 {
		b, err := os.ReadFile(ledgerOf(agent, cg))
		if err != nil {
			t.Fatal(err)
		}
		u, err := controlblock.ParseUsage(b)
		if err != nil {
			t.Fatal(err)
		}
		return u.LaunchesIssued[0]
	}
	// Under the scheduler (the agent writes its limits as it takes it on;
	// the interposer may have paced itself before), then 100 tickets more,
	// which the scheduler has seen taken.
	simtest.Eventually(t, breachWithin, func() error {
		_, err := os.Stat(controlblock.LimitsPath(agent.ControlDir, controlblock.ContainerKey(cg.Rel)))
		return err
	})
	admitted := tickets()
	simtest.Eventually(t, breachWithin, func() error {
		if n := tickets(); n < admitted+100 {
			return fmt.Errorf("launch tickets taken: %d since the scheduler took it on", n-admitted)
		}
		return nil
	})
	forge(t, cg, ledgerOf(agent, cg), "launches_issued", 0)
	wantBreach(t, agent, cg.Rel, collector.BreachBadLedger)
	ev := wantEvent(t, agent, "breach", collector.BreachBadLedger, cg.Rel)
	if !strings.Contains(ev.Message, "back") {
		t.Errorf("the event gives no evidence: %+v", ev)
	}
	agentServes(t, agent)
}

// Attack 3: one process of the container runs under the interposer (so the
// container has a ledger), another in the same cgroup runs without it. The
// ledger vouches for its own processes only: the other is a breach, and
// with onBreach: freeze the cgroup, and only it, is frozen.
func TestAttackHiddenBypassBesideLedger(t *testing.T) {
	simtest.RequirePrivileged(t, "eBPF and cgroups")
	m := simtest.NewMachine(t, 1, "16Gi")
	agent := simtest.StartAgent(t, m, "GPUWARDEN_ENFORCEMENT_ON_BREACH=freeze")
	innocent := startEnforced(t, m, agent, "innocent", "GPUWARDEN_MEMORY_LIMIT=2Gi")
	cg := simtest.NewCgroup(t, "hider")
	ledgered := enforcedAlloc(t, m, agent, cg, "GPUWARDEN_MEMORY_LIMIT=1Gi")
	ledgered.Do(t, "alloc linear %d", 512<<20)
	hidden := simtest.StartAllocProg(t, cg.Place(m.Command(simtest.Bin(t, "bpf/cuda-alloc")))) // LD_PRELOAD unset
	hidden.Do(t, "ctx 0")
	hidden.Do(t, "alloc linear %d", 2<<30)

	wantBreach(t, agent, cg.Rel, collector.BreachUnledgered)
	ev := wantEvent(t, agent, "breach", collector.BreachUnledgered, cg.Rel)
	if len(ev.PIDs) != 1 || ev.PIDs[0] != hidden.P.Cmd.Process.Pid {
		t.Errorf("the event names pids %v, want the hidden process %d", ev.PIDs, hidden.P.Cmd.Process.Pid)
	}
	wantEvent(t, agent, "frozen", "", cg.Rel)
	if !frozen(t, cg) {
		t.Error("the cgroup in breach is not frozen")
	}
	if frozen(t, innocent) {
		t.Error("a container not in breach was frozen")
	}
	agentServes(t, agent)
}

// Attack 3 with onBreach: kill: the breach names the process without a
// ledger slot, and only it is killed; the container's process under the
// interposer goes on. (The hidden process only holds a context: eBPF sees
// no more memory than the ledger reserves, NVML sees the process.)
func TestAttackHiddenProcessKilledAlone(t *testing.T) {
	simtest.RequirePrivileged(t, "eBPF and cgroups")
	m := simtest.NewMachine(t, 1, "16Gi")
	agent := simtest.StartAgent(t, m, "GPUWARDEN_ENFORCEMENT_ON_BREACH=kill")
	cg := simtest.NewCgroup(t, "hider")
	ledgered := enforcedAlloc(t, m, agent, cg, "GPUWARDEN_MEMORY_LIMIT=1Gi")
	ledgered.Do(t, "alloc linear %d", 256<<20)
	hidden := simtest.StartAllocProg(t, cg.Place(m.Command(simtest.Bin(t, "bpf/cuda-alloc")))) // LD_PRELOAD unset
	hidden.Do(t, "ctx 0")

	wantBreach(t, agent, cg.Rel, collector.BreachUnledgered)
	ev := wantEvent(t, agent, "killed", "", cg.Rel)
	if len(ev.PIDs) != 1 || ev.PIDs[0] != hidden.P.Cmd.Process.Pid {
		t.Errorf("killed %v, want only the hidden process %d", ev.PIDs, hidden.P.Cmd.Process.Pid)
	}
	if _, err := hidden.P.Wait(); err == nil {
		t.Error("the hidden process exited cleanly; want killed")
	}
	ledgered.Do(t, "alloc linear %d", 256<<20) // still alive, still held to its quota
	agentServes(t, agent)
}

// A breach outside enforcement.breachScope (a node's own GPU daemon, a job
// run outside Kubernetes) is reported, never stopped: the process lives on
// under onBreach: kill.
func TestBreachOutsideScopeReportedOnly(t *testing.T) {
	simtest.RequirePrivileged(t, "eBPF and cgroups")
	m := simtest.NewMachine(t, 1, "16Gi")
	cg := simtest.NewCgroup(t, "daemon")
	agent := simtest.StartAgent(t, m, "GPUWARDEN_ENFORCEMENT_ON_BREACH=kill",
		"GPUWARDEN_ENFORCEMENT_BREACH_SCOPE=/gpuwarden-test/tenants,"+cg.Rel+"-sibling")
	daemon := simtest.StartAllocProg(t, cg.Place(m.Command(simtest.Bin(t, "bpf/cuda-alloc")))) // no interposer
	daemon.Do(t, "ctx 0")
	daemon.Do(t, "alloc linear %d", 256<<20)

	wantBreach(t, agent, cg.Rel, collector.BreachBypass)
	wantEvent(t, agent, "breach", collector.BreachBypass, cg.Rel) // acted on, where it is, in the same turn
	var evs []event
	agent.GetJSON(t, "/api/v1/events", &evs)
	for _, ev := range evs {
		if ev.Cgroup == cg.Rel && ev.Kind != "breach" {
			t.Errorf("a breach outside the scope was acted on: %+v", ev)
		}
	}
	daemon.Do(t, "alloc linear %d", 256<<20) // alive
	agentServes(t, agent)
}

// libcudaCopy is a copy of simgpu's libcuda under a name the scan does not
// know: it is found by its exports.
func libcudaCopy(t *testing.T) string {
	t.Helper()
	copied := filepath.Join(t.TempDir(), "libnotcuda.so")
	b, err := os.ReadFile(simtest.Bin(t, "simgpu/libcuda.so.1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(copied, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return copied
}

// Attack 3: a bypass through a renamed copy of libcuda: the eBPF scan finds
// it by its exports, so the bytes are eBPF's, exact, not NVML's.
func TestAttackRenamedLibcuda(t *testing.T) {
	simtest.RequirePrivileged(t, "eBPF and cgroups")
	m := simtest.NewMachine(t, 1, "16Gi")
	agent := simtest.StartAgent(t, m, "GPUWARDEN_ENFORCEMENT_ON_BREACH=kill")
	renamed := libcudaCopy(t)
	cg := simtest.NewCgroup(t, "renamed")
	cmd := cg.Place(m.Command(simtest.Bin(t, "bpf/cuda-alloc")))
	cmd.Env = append(cmd.Env, "LD_PRELOAD="+renamed) // the copy answers for libcuda.so.1: its soname
	a := simtest.StartAllocProg(t, cmd)
	time.Sleep(2 * time.Second) // the scan attaches to the copy before the allocation
	a.Do(t, "ctx 0")
	a.Do(t, "alloc linear %d", 768<<20)
	if maps, _ := os.ReadFile(fmt.Sprintf("/proc/%d/maps", a.P.Cmd.Process.Pid)); strings.Contains(string(maps), "libcuda.so") {
		t.Fatalf("the workload maps a file named libcuda.so; the test needs only the renamed copy:\n%s", maps)
	}
	simtest.Eventually(t, breachWithin, func() error {
		e, ok := entry(t, agent, cg)
		if !ok || e.MemorySource != "ebpf" || e.MemoryUsedBytes != 768<<20 {
			return fmt.Errorf("entry %+v (listed %v): want 768 MiB seen by eBPF", e, ok)
		}
		return nil
	})
	wantBreach(t, agent, cg.Rel, collector.BreachBypass)
	wantEvent(t, agent, "killed", "", cg.Rel)
	if _, err := a.P.Wait(); err == nil {
		t.Error("the bypass exited cleanly; want killed")
	}
	agentServes(t, agent)
}

// Attack 3 before the scan: a process with a ledger slot allocates through
// a copy of libcuda the moment it loads it, before the scan attaches the
// probes to the copy, while a sibling allocates through the interposer. eBPF
// never sees the copy's memory; NVML does, and the larger meter is judged:
// over_limit within seconds. NVML's meter allows each process
// nvml.contextMemory (1 GiB) for its context, so the copy holds more than
// the quota and both processes' allowances.
func TestAttackCopyBeforeScan(t *testing.T) {
	simtest.RequirePrivileged(t, "eBPF and cgroups")
	m := simtest.NewMachine(t, 1, "16Gi")
	agent := simtest.StartAgent(t, m)
	copied := libcudaCopy(t)
	cg := simtest.NewCgroup(t, "copier")
	enforcedAlloc(t, m, agent, cg, "GPUWARDEN_MEMORY_LIMIT=1Gi").Do(t, "alloc linear %d", 256<<20)
	a := enforcedAlloc(t, m, agent, cg, "GPUWARDEN_MEMORY_LIMIT=1Gi") // a slot of the ledger, a context through the interposer
	simtest.Eventually(t, breachWithin, func() error {
		if e, ok := entry(t, agent, cg); !ok || !e.Enforced || e.MemorySource != "ebpf" {
			return fmt.Errorf("the container is not seen by eBPF under its ledger yet: %+v (listed %v)", e, ok)
		}
		return nil
	})
	start := time.Now()
	a.Do(t, "copyalloc %d %s", 5<<30, copied)

	wantBreach(t, agent, cg.Rel, collector.BreachOverLimit)
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("the copy's memory was judged after %v", took)
	}
	ev := wantEvent(t, agent, "breach", collector.BreachOverLimit, cg.Rel)
	if !strings.Contains(ev.Message, "nvml") {
		t.Errorf("the breach does not say NVML saw it: %+v", ev)
	}
	if e, _ := entry(t, agent, cg); e.MemorySource != "nvml" || e.MemoryUsedBytes < 5<<30 {
		t.Errorf("the entry shows %d bytes from %s; want NVML's, above 5 GiB", e.MemoryUsedBytes, e.MemorySource)
	}
	agentServes(t, agent)
}

// Attack 4: on Kubernetes, a container writes another pod's cgroup id into
// its own ledger, in its device-plugin directory. The victim keeps its
// labels; the attacker's claim is refused (the directory the kubelet
// assigned is not the victim pod's, and no process of the ledger is in the
// victim's cgroup) and reported.
func TestAttackClaimsAnotherPodsCgroup(t *testing.T) {
	simtest.RequirePrivileged(t, "cgroup and mount namespaces")
	victimIDs, attackerIDs := []string{"GPU-test::gpu-0"}, []string{"GPU-test::gpu-1"}
	const victimUID, attackerUID = "0a1b2c3d-0000-4000-8000-00000000000a", "0a1b2c3d-0000-4000-8000-00000000000b"
	kl := kubelettest.StartPodResources(t)
	kl.SetPods(
		kubelettest.Pod{Namespace: "ml", Name: "victim-0", Containers: []kubelettest.Container{
			{Name: "main", Devices: map[string][]string{"gpuwarden.io/gpu": victimIDs}}}},
		kubelettest.Pod{Namespace: "evil", Name: "attacker-0", Containers: []kubelettest.Container{
			{Name: "main", Devices: map[string][]string{"gpuwarden.io/gpu": attackerIDs}}}},
	)
	api := kubeapitest.StartTestServer(t)
	api.SetPods("node-k", kubeapi.Pod{Namespace: "ml", Name: "victim-0", UID: victimUID},
		kubeapi.Pod{Namespace: "evil", Name: "attacker-0", UID: attackerUID})
	m := simtest.NewMachine(t, 1, "16Gi")
	agent := simtest.StartAgent(t, m, "GPUWARDEN_KUBELET_POD_RESOURCES_SOCKET="+kl.Socket, "GPUWARDEN_NODE_NAME=node-k",
		"GPUWARDEN_KUBERNETES_API_SERVER="+api.URL, "GPUWARDEN_KUBERNETES_TOKEN_FILE="+api.TokenFile,
		"GPUWARDEN_KUBERNETES_CA_FILE="+api.CAFile)

	victim := podCgroup(t, "victim", victimUID)
	podContainer(t, m, agent, victim, victimIDs, "512Mi")
	attacker := podCgroup(t, "attacker", attackerUID)
	podContainer(t, m, agent, attacker, attackerIDs, "256Mi")

	victimLabels := map[string]string{"namespace": "ml", "pod": "victim-0", "container": "main", "gpu": "0"}
	wantVictim := func() error {
		f := agent.Scrape(t)
		if s, ok := simtest.Find(f, "gpuwarden_container_gpu_memory_used_bytes", victimLabels); !ok || s.Value != 512<<20 {
			return fmt.Errorf("memory used of ml/victim-0/main: %v, %v; series: %v", s.Value, ok,
				f["gpuwarden_container_gpu_memory_used_bytes"])
		}
		if s, ok := simtest.Find(f, "gpuwarden_container_unenforced", victimLabels); !ok || s.Value != 0 {
			return fmt.Errorf("the victim is unenforced: %v %v", s.Value, ok)
		}
		return nil
	}
	simtest.Eventually(t, breachWithin, wantVictim)

	usage := controlblock.UsagePath(agent.ControlDir, allocation.DirName(attackerIDs))
	forge(t, attacker, usage, "cgroup_id", victim.ID)
	// Its ledger refused, the attacker is named by its cgroup path (pod uid, container id).
	wantBreachOf(t, agent, map[string]string{"pod": attackerUID, "gpu": "0"}, collector.BreachFalseClaim)
	ev := wantEvent(t, agent, "breach", collector.BreachFalseClaim, attacker.Rel)
	if !strings.Contains(ev.Message, allocation.DirName(attackerIDs)) {
		t.Errorf("the event does not name the forged ledger: %+v", ev)
	}
	// Some views later the victim still has its labels and figures.
	time.Sleep(3 * time.Second)
	simtest.Eventually(t, breachWithin, wantVictim)
	agentServes(t, agent)
}

// podCgroup makes a container's cgroup inside its pod's, as the kubelet
// lays them out (".../kubepods/pod<uid>/<container>"), so its path names
// its pod.
func podCgroup(t *testing.T, name, uid string) *simtest.Cgroup {
	t.Helper()
	return simtest.NestedCgroup(t, simtest.NewCgroup(t, name), "kubepods/pod"+uid+"/"+strings.Repeat("c", 64))
}

// podContainer runs a workload as the device plugin sets a container up:
// its allocation's directory (with the limits the plugin writes) seen as
// <view>/root, in a cgroup namespace of its own.
func podContainer(t *testing.T, m *simtest.Machine, agent *simtest.Agent, cg *simtest.Cgroup, ids []string, alloc string) {
	t.Helper()
	dir := allocation.DirName(ids)
	if err := os.MkdirAll(filepath.Join(agent.ControlDir, dir), 0o755); err != nil {
		t.Fatal(err)
	}
	lf, err := controlblock.CreateLimits(controlblock.LimitsPath(agent.ControlDir, dir),
		controlblock.LimitsConfig{NDev: 1, MemLimit: [controlblock.MaxDevices]uint64{2 * gib}})
	if err != nil {
		t.Fatal(err)
	}
	lf.Close()
	view := t.TempDir()
	if err := os.Symlink(filepath.Join(agent.ControlDir, dir), filepath.Join(view, allocation.ContainerKey)); err != nil {
		t.Fatal(err)
	}
	mnt, err := hostcgroup.Mount("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	cmd := cg.Place(m.Command("unshare", "--cgroup", "--mount", "--propagation", "private", "sh", "-c",
		`umount -l "$0" && mount -t cgroup2 none "$0" && exec "$@"`, mnt,
		simtest.Bin(t, "simgpu/workload"), "--alloc", alloc, "--seconds", "120", "--kernel-ns", "1000000"))
	cmd.Env = append(cmd.Env, "LD_PRELOAD="+simtest.Bin(t, "libgpuwarden.so"), "GPUWARDEN_CONTROL_DIR="+view)
	simtest.Start(t, cmd).WaitLine(t, "ready", 10*time.Second)
}
