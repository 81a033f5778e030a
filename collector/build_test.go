package collector

import (
	"log/slog"
	"testing"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/agentapi"
	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
	"github.com/gpuwarden/gpuwarden/enforcer/membership"
)

// TestLedgerOrdinalsLandOnTheirGPUs: a ledger's CUDA ordinals are the
// container's own (CUDA_VISIBLE_DEVICES renumbers them), so the view puts
// them on the GPUs whose UUIDs the ledger records, each process's figures
// on the GPU it holds memory on, and a GPU of unknown UUID on no GPU.
func TestLedgerOrdinalsLandOnTheirGPUs(t *testing.T) {
	var raw [4][16]byte
	node := make([]string, 4)
	j := New("node", "test", Sources{}, slog.New(slog.DiscardHandler)).newJoiner(time.Time{})
	for i := range raw {
		raw[i] = [16]byte{0x5a, 15: byte(i)}
		node[i] = controlblock.UUIDString(raw[i])
		j.uuids[i], j.index[node[i]] = node[i], i
	}
	j.node = node
	add := func(dir string, cg uint64, u *controlblock.UsageSnapshot) {
		u.CgroupID = cg
		l := &ledger{dir: dir, usage: u}
		j.place(l)
		j.addLedger(cg, l)
	}
	// On GPU 2, which it sees as ordinal 0.
	one := &controlblock.UsageSnapshot{NDev: 1}
	one.DevUUID[0], one.ReservedBytes[0] = raw[2], 100
	p := controlblock.ProcUsage{Slot: 0, Pid: 10, Launches: 7, ThrottledNs: 2e9}
	p.Bytes[0] = 50
	one.Procs = []controlblock.ProcUsage{p}
	add("one", 1, one)
	// On GPUs 3 and 1 (ordinals 0 and 1), a process on each.
	two := &controlblock.UsageSnapshot{NDev: 2}
	two.DevUUID[0], two.DevUUID[1] = raw[3], raw[1]
	two.ReservedBytes[0], two.ReservedBytes[1] = 300, 200
	a := controlblock.ProcUsage{Slot: 0, Pid: 20, Launches: 5}
	a.Bytes[0] = 10
	b := controlblock.ProcUsage{Slot: 1, Pid: 21, Launches: 9, ThrottledNs: 1e9}
	b.Bytes[1] = 10
	two.Procs = []controlblock.ProcUsage{a, b}
	add("two", 2, two)
	// An old interposer's: no UUID recorded, on a node of four.
	old := &controlblock.UsageSnapshot{NDev: 1}
	old.ReservedBytes[0] = 400
	add("old", 3, old)

	for _, tt := range []struct {
		k                  Key
		uuid               string
		ledger             uint64
		launches, throttle float64
	}{
		{Key{1, 2}, node[2], 100, 7, 2},
		{Key{2, 3}, node[3], 300, 5, 0},
		{Key{2, 1}, node[1], 200, 9, 1},
		{Key{3, NoGPU}, "", 400, 0, 0},
	} {
		e := j.entries[tt.k]
		if e == nil {
			t.Errorf("no entry for cgroup %d on GPU %d; entries %v", tt.k.Cgroup, tt.k.GPU, j.entries)
			continue
		}
		if e.GPU != tt.k.GPU || e.UUID != tt.uuid || e.LedgerBytes != tt.ledger || e.Launches != tt.launches || e.ThrottledSeconds != tt.throttle {
			t.Errorf("cgroup %d: gpu %d %q, ledger %d, launches %v, throttled %v; want gpu %d %q, %d, %v, %v", tt.k.Cgroup,
				e.GPU, e.UUID, e.LedgerBytes, e.Launches, e.ThrottledSeconds, tt.k.GPU, tt.uuid, tt.ledger, tt.launches, tt.throttle)
		}
	}
	if len(j.entries) != 4 {
		t.Errorf("%d entries, want 4: %v", len(j.entries), j.entries)
	}
	if !j.c.unmapped["old"] || j.c.unmapped["one"] {
		t.Errorf("ledgers logged for GPUs of unknown UUID: %v, want old alone", j.c.unmapped)
	}
}

// TestOrdinalsWithoutLedger: a container without a ledger (a bypass) is
// placed by where NVML lists its processes, never by its ordinal alone.
func TestOrdinalsWithoutLedger(t *testing.T) {
	node := []string{"GPU-a", "GPU-b", "GPU-c"}
	j := &joiner{node: node, index: map[string]int{"GPU-a": 0, "GPU-b": 1, "GPU-c": 2},
		nvmlGPUs: map[uint64]map[int]bool{1: {2: true}, 2: {0: true, 1: true}}}
	for _, tt := range []struct {
		cg      uint64
		ordinal int
		want    int
	}{
		{1, 0, 2},     // NVML lists it on GPU 2 alone
		{2, 0, NoGPU}, // on two GPUs: which is ordinal 0 is not known
		{3, 1, NoGPU}, // NVML lists none of its processes
	} {
		if got := j.gpuOf(tt.cg, nil, tt.ordinal); got != tt.want {
			t.Errorf("cgroup %d ordinal %d: GPU %d, want %d", tt.cg, tt.ordinal, got, tt.want)
		}
	}
	one := &joiner{node: node[:1], index: map[string]int{"GPU-a": 0}}
	if got := one.gpuOf(3, nil, 0); got != 0 {
		t.Errorf("on a node of one GPU, ordinal 0: GPU %d, want 0", got)
	}
}

// TestSessionsNameRemoteClients: a remote session's cgroup is named by its
// client (the Sessions source) before any other labeller; other cgroups
// keep their names.
func TestSessionsNameRemoteClients(t *testing.T) {
	src := Sources{Sessions: func(path string) (string, string, string, bool) {
		if path == "/gpuwarden-remote/s-1" {
			return "team-a", "train-0", "main", true
		}
		return "", "", "", false
	}}
	j := &joiner{c: New("node", "test", src, slog.New(slog.DiscardHandler)), v: &View{},
		labels: func(dir, path string) (string, string, string, bool) { return "kube", "pod", "c", true }}
	if ns, pod, c := j.name("gpuwarden-remote+s-1", "/gpuwarden-remote/s-1"); ns != "team-a" || pod != "train-0" || c != "main" {
		t.Errorf("session named %s/%s/%s", ns, pod, c)
	}
	if ns, pod, c := j.name("x", "/kubepods/x"); ns != "kube" || pod != "pod" || c != "c" {
		t.Errorf("other cgroup named %s/%s/%s", ns, pod, c)
	}
}

// TestPerDeviceLaunchesLandOnTheirGPUs: a ledger of minor 1 counts
// launches and throttled time per device, so one process on two GPUs has
// each GPU's on that GPU; what it counted without a device (no gate) goes
// to its first GPU, as an older ledger's. A container rewriting its
// counters down makes the series go back (a counter reset), never negative.
func TestPerDeviceLaunchesLandOnTheirGPUs(t *testing.T) {
	var raw [3][16]byte
	node := make([]string, 3)
	j := New("node", "test", Sources{}, slog.New(slog.DiscardHandler)).newJoiner(time.Time{})
	for i := range raw {
		raw[i] = [16]byte{0x5b, 15: byte(i)}
		node[i] = controlblock.UUIDString(raw[i])
		j.uuids[i], j.index[node[i]] = node[i], i
	}
	j.node = node
	ledgerOf := func(launches0, launches1, placed uint64) *controlblock.UsageSnapshot {
		// Ordinals 0 and 1 are GPUs 2 and 1; one process holds memory on both.
		u := &controlblock.UsageSnapshot{ABIMinor: 1, NDev: 2, CgroupID: 7}
		u.DevUUID[0], u.DevUUID[1] = raw[2], raw[1]
		u.ReservedBytes[0], u.ReservedBytes[1] = 100, 100
		u.LaunchesDev[0], u.LaunchesDev[1] = launches0, launches1
		u.ThrottledNsDev[0], u.ThrottledNsDev[1] = 1e9, 3e9
		p := controlblock.ProcUsage{Slot: 0, Pid: 10, StartTime: 1, Launches: 110, LaunchesPlaced: placed,
			ThrottledNs: 4e9, ThrottledPlacedNs: 4e9}
		p.Bytes[0], p.Bytes[1] = 50, 50
		u.Procs = []controlblock.ProcUsage{p}
		return u
	}
	scrape := func(u *controlblock.UsageSnapshot) (gpu2, gpu1 *agentapi.ContainerDevice) {
		j.entries = map[Key]*agentapi.ContainerDevice{}
		j.ordinals = map[Key]int{}
		l := &ledger{dir: "two", usage: u}
		j.place(l)
		j.addLedger(7, l)
		if len(j.entries) != 2 || j.entries[Key{7, 2}] == nil || j.entries[Key{7, 1}] == nil {
			t.Fatalf("entries %v, want the container on GPUs 2 and 1", j.entries)
		}
		return j.entries[Key{7, 2}], j.entries[Key{7, 1}]
	}
	check := func(what string, e *agentapi.ContainerDevice, launches, throttled float64) {
		t.Helper()
		if e.Launches != launches || e.ThrottledSeconds != throttled {
			t.Errorf("%s: GPU %d: %v launches, %vs throttled; want %v, %vs", what, e.GPU, e.Launches, e.ThrottledSeconds, launches, throttled)
		}
	}
	// 30 launches on ordinal 0, 70 on ordinal 1, 10 without a device.
	u := ledgerOf(30, 70, 100)
	u.DevMismatches = 3
	a, b := scrape(u)
	check("first scrape", a, 40, 1)
	check("first scrape", b, 70, 3)
	if a.DeviceMismatches != 3 || b.DeviceMismatches != 0 { // container-wide: on its first GPU alone
		t.Errorf("device mismatches %d on GPU 2, %d on GPU 1; want 3 and 0", a.DeviceMismatches, b.DeviceMismatches)
	}
	// Rewritten down, and a slot claiming more placed than launched.
	a, b = scrape(ledgerOf(30, 5, 1000))
	check("rewound", a, 40, 1) // the process's 10 undeviced launches stay counted
	check("rewound", b, 5, 3)
	if a.Launches < 0 || b.Launches < 0 {
		t.Errorf("negative launches %v %v", a.Launches, b.Launches)
	}
	// Minor 0 (as parsed: no per-device counters): a new process's
	// launches and throttled time all on its first GPU, beside the 10
	// launches counted there before.
	old := ledgerOf(0, 0, 0)
	old.ABIMinor = 0
	old.ThrottledNsDev = [controlblock.MaxDevices]uint64{}
	old.Procs[0].ThrottledPlacedNs = 0
	old.Procs[0].Pid = 11
	a, b = scrape(old)
	check("minor 0", a, 10+110, 4)
	check("minor 0", b, 0, 0)
}

// TestScheduledShareOnlyWhereTheSchedulerHoldsIt: a compute limit that only
// a container's ledger claims is shown, but with no scheduler holding the
// container there is no measured share to show: no series, rather than a
// share of 0 that reads as a starved container.
func TestScheduledShareOnlyWhereTheSchedulerHoldsIt(t *testing.T) {
	raw := [16]byte{0x5a, 15: 1}
	uuid := controlblock.UUIDString(raw)
	c := New("node", "test", Sources{}, slog.New(slog.DiscardHandler))
	metrics := func(sched map[membership.GPUKey]membership.Scheduled) map[string]float64 {
		t.Helper()
		j := c.newJoiner(time.Time{})
		j.uuids[0], j.index[uuid], j.node = uuid, 0, []string{uuid}
		u := &controlblock.UsageSnapshot{NDev: 1, ClaimComputeLimit: 30, CgroupID: 7}
		u.DevUUID[0], u.ReservedBytes[0] = raw, 1<<20
		l := &ledger{dir: "c1", usage: u}
		j.place(l)
		j.finish(map[uint64]*ledger{7: l}, nil, sched)
		fams, err := c.gather(j.v)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]float64{}
		for _, f := range fams {
			for _, m := range f.GetMetric() {
				out[f.GetName()] = m.GetGauge().GetValue() + m.GetCounter().GetValue()
			}
		}
		return out
	}

	got := metrics(nil)
	if got["gpuwarden_container_compute_limit_ratio"] != 0.3 {
		t.Errorf("claimed limit %v, want 0.3; metrics %v", got["gpuwarden_container_compute_limit_ratio"], got)
	}
	for _, name := range []string{"gpuwarden_container_scheduled_share_ratio", "gpuwarden_container_scheduled_seconds_total"} {
		if v, ok := got[name]; ok {
			t.Errorf("no scheduler holds the container, yet %s = %v", name, v)
		}
	}

	got = metrics(map[membership.GPUKey]membership.Scheduled{{Cgroup: 7, UUID: uuid}: {Target: 0.25, Achieved: 0.24, Charged: 3}})
	if got["gpuwarden_container_compute_limit_ratio"] != 0.25 || got["gpuwarden_container_scheduled_share_ratio"] != 0.24 ||
		got["gpuwarden_container_scheduled_seconds_total"] != 3 {
		t.Errorf("held by the scheduler: limit, share, seconds %v, %v, %v; want 0.25, 0.24, 3",
			got["gpuwarden_container_compute_limit_ratio"], got["gpuwarden_container_scheduled_share_ratio"],
			got["gpuwarden_container_scheduled_seconds_total"])
	}
}
