package collector

import (
	"log/slog"
	"testing"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/agentapi"

	"github.com/gpuwarden/gpuwarden/collector/ledgertrust"
	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
)

func reasonsOf(bs []agentapi.Breach) map[string]bool {
	out := map[string]bool{}
	for _, b := range bs {
		out[b.Reason] = true
	}
	return out
}

// A comparison or a false claim must fail for `sustain` before it is a
// breach; a bypass must be seen by the next view too; a rewound ledger stays
// one for `remember`.
func TestJudgeHold(t *testing.T) {
	jd := newJudge()
	k := Key{Cgroup: 7, GPU: 0}
	t0 := time.Unix(1000, 0)
	over := []agentapi.Breach{{Reason: BreachOverLimit}, {Reason: BreachOverLimit}} // one series per reason
	if got := jd.hold(k, over, t0); len(got) != 0 {
		t.Errorf("a comparison failing once is a breach: %v", got)
	}
	if got := jd.hold(k, over, t0.Add(sustain)); len(got) != 1 || got[0].Reason != BreachOverLimit {
		t.Errorf("after %v: %v, want one over_limit", sustain, got)
	}
	if got := jd.hold(k, nil, t0.Add(sustain+time.Second)); len(got) != 0 {
		t.Errorf("a comparison that passes again is still a breach: %v", got)
	}
	if got := jd.hold(k, over, t0.Add(sustain+2*time.Second)); len(got) != 0 {
		t.Errorf("failing again starts the wait again: %v", got)
	}
	kb := Key{Cgroup: 9, GPU: 0}
	bypass := []agentapi.Breach{{Reason: BreachBypass}}
	if got := jd.hold(kb, bypass, t0); len(got) != 0 {
		t.Errorf("a bypass seen by one view is a breach: %v", got)
	}
	if got := jd.hold(kb, bypass, t0.Add(time.Second)); !reasonsOf(got)[BreachBypass] {
		t.Errorf("a bypass the next view sees again is not a breach: %v", got)
	}

	u := &controlblock.UsageSnapshot{CgroupID: 7}
	l := &ledger{dir: "d", usage: u} // ordinal 0 is GPU 0
	u.LaunchesIssued[0] = 500
	jd.rewound(l, t0)
	u.LaunchesIssued[0] = 3
	jd.rewound(l, t0.Add(time.Second))
	if got := jd.hold(k, nil, t0.Add(30*time.Second)); !reasonsOf(got)[BreachBadLedger] {
		t.Errorf("a rewound ledger is not remembered: %v", got)
	}
	if got := jd.hold(k, nil, t0.Add(remember+2*time.Second)); len(got) != 0 {
		t.Errorf("a rewound ledger is remembered for ever: %v", got)
	}
	// Counted before any view listed the container: a breach all the same.
	k2 := Key{Cgroup: 8, GPU: 0}
	jd.enforcerRewinds(map[Key]uint64{k2: 1}, t0)
	if got := jd.hold(k2, nil, t0); !reasonsOf(got)[BreachBadLedger] {
		t.Errorf("a rewind the enforcer saw is not a breach: %v", got)
	}
}

func TestCompare(t *testing.T) {
	const gib = 1 << 30
	ledgerWith := func(reserved, slots uint64, pid int32) *ledger {
		u := &controlblock.UsageSnapshot{CgroupID: 7}
		u.ReservedBytes[0] = reserved
		p := controlblock.ProcUsage{Pid: pid, StartTime: 42}
		p.Bytes[0] = slots
		u.Procs = []controlblock.ProcUsage{p}
		return &ledger{dir: "d", usage: u}
	}
	k := Key{Cgroup: 7, GPU: 0}
	for _, tt := range []struct {
		name  string
		e     agentapi.ContainerDevice
		l     *ledger
		procs []gpuProc
		nvml  uint64 // what NVML shows for the procs
		want  []string
	}{
		{"within quota and ledger", agentapi.ContainerDevice{MemoryUsedBytes: gib, MemorySource: "ebpf", MemoryLimitBytes: 2 * gib, LedgerBytes: gib + 64<<20},
			ledgerWith(gib+64<<20, gib, 5), []gpuProc{{10, ledgertrust.Proc{NSPid: 5, StartTime: 42}, true}}, gib + 300<<20, nil},
		{"forged reserve", agentapi.ContainerDevice{MemoryUsedBytes: 3 * gib, MemorySource: "ebpf", MemoryLimitBytes: 2 * gib},
			ledgerWith(0, gib, 5), nil, 0, []string{BreachOverLimit, BreachOverLedger, BreachBadLedger}},
		{"a process in no slot", agentapi.ContainerDevice{MemoryUsedBytes: gib, MemorySource: "nvml", MemoryLimitBytes: 2 * gib, LedgerBytes: gib, PIDs: []int{10, 11}},
			ledgerWith(gib, gib, 5), []gpuProc{{10, ledgertrust.Proc{NSPid: 5, StartTime: 42}, true}, {11, ledgertrust.Proc{NSPid: 6, StartTime: 43}, true}},
			gib, []string{BreachUnledgered}},
		{"a limit lowered below what it holds", agentapi.ContainerDevice{MemoryUsedBytes: gib, MemorySource: "ebpf", MemoryLimitBytes: 512 << 20, LedgerBytes: gib + 64<<20},
			ledgerWith(gib+64<<20, gib, 5), nil, 0, nil},
		{"the ledger's own figure is no evidence", agentapi.ContainerDevice{MemoryUsedBytes: 3 * gib, MemorySource: "ledger", MemoryLimitBytes: 2 * gib, LedgerBytes: 3 * gib},
			ledgerWith(3*gib, 3*gib, 5), nil, 0, nil},
		// Two processes of the container's slots; one allocated through a
		// copy of libcuda the probes were not attached to yet.
		{"NVML sees what eBPF missed", agentapi.ContainerDevice{MemoryUsedBytes: 512 << 20, MemorySource: "ebpf", MemoryLimitBytes: gib, LedgerBytes: 512<<20 + 128<<20},
			ledgerWith(512<<20+128<<20, 512<<20, 5), []gpuProc{{10, ledgertrust.Proc{NSPid: 5, StartTime: 42}, true}},
			3*gib + 512<<20, []string{BreachOverLimit, BreachOverLedger}},
		{"NVML's contexts are no breach", agentapi.ContainerDevice{MemoryUsedBytes: gib, MemorySource: "ebpf", MemoryLimitBytes: 2 * gib, LedgerBytes: gib + 64<<20},
			ledgerWith(gib+64<<20, gib, 5), []gpuProc{{10, ledgertrust.Proc{NSPid: 5, StartTime: 42}, true}}, gib + 500<<20, nil},
		{"NVML alone, within its context allowance", agentapi.ContainerDevice{MemoryUsedBytes: gib + 500<<20, MemorySource: "nvml", MemoryLimitBytes: 2 * gib, LedgerBytes: gib + 64<<20},
			ledgerWith(gib+64<<20, gib, 5), []gpuProc{{10, ledgertrust.Proc{NSPid: 5, StartTime: 42}, true}}, gib + 500<<20, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			j := &joiner{c: &Collector{src: Sources{NVMLContextBytes: 512 << 20}}, procs: map[Key][]gpuProc{k: tt.procs},
				ordinals: map[Key]int{k: 0}, nvmlMem: map[Key]uint64{k: tt.nvml}}
			e := tt.e
			got := reasonsOf(j.compare(k, &e, tt.l))
			if len(got) != len(tt.want) {
				t.Errorf("breaches %v, want %v", got, tt.want)
			}
			for _, r := range tt.want {
				if !got[r] {
					t.Errorf("breaches %v lack %s", got, r)
				}
			}
		})
	}
}

// A container held to a share that NVML measures well above it, averaged
// over a minute, for long, is in breach; a little above it, or not held
// (soft, high priority), is not.
func TestOverShare(t *testing.T) {
	k := Key{Cgroup: 7, GPU: 0}
	l := &ledger{dir: "d", usage: &controlblock.UsageSnapshot{CgroupID: 7}}
	for _, tt := range []struct {
		name  string
		held  map[Key]float64
		share float64
		want  bool
	}{
		{"a third held, a half used", map[Key]float64{k: 1. / 3}, 0.51, true},
		{"within the tolerance", map[Key]float64{k: 1. / 3}, 0.45, false},
		{"not held", nil, 0.9, false},
	} {
		j := &joiner{c: &Collector{}, held: tt.held, meanShare: map[Key]float64{k: tt.share}}
		e := agentapi.ContainerDevice{ComputeShare: tt.share, MemorySource: "ledger"}
		if got := reasonsOf(j.compare(k, &e, l))[BreachOverShare]; got != tt.want {
			t.Errorf("%s: over_share %v, want %v", tt.name, got, tt.want)
		}
	}
	jd := newJudge()
	over := []agentapi.Breach{{Reason: BreachOverShare}}
	t0 := time.Unix(1000, 0)
	if got := jd.hold(k, over, t0); len(got) != 0 {
		t.Errorf("an excess of one view is a breach: %v", got)
	}
	if got := jd.hold(k, over, t0.Add(sustain)); len(got) != 0 {
		t.Errorf("an excess of %v is a breach: %v", sustain, got)
	}
	if got := jd.hold(k, over, t0.Add(shareSustain)); len(got) != 1 {
		t.Errorf("an excess held %v is no breach: %v", shareSustain, got)
	}
}

// The share judged is NVML's averaged over a minute of an unchanged target:
// a second's sample stream (a whole period credited to one process) and the
// lag after a target is lowered are not an excess.
func TestShareMean(t *testing.T) {
	jd := newJudge()
	k := Key{Cgroup: 7, GPU: 0}
	t0 := time.Unix(1000, 0)
	// NVIDIA's samples: the container on the engine at 1 of 3 instants, credited 100%.
	var mean float64
	var full bool
	for i := 0; i <= 90; i++ {
		mean, full = jd.meanShare(k, float64(b2f(i%3 == 0)), 1./3, t0.Add(time.Duration(i)*time.Second))
		if i < 60 && full {
			t.Fatalf("after %d s the mean covers a minute", i)
		}
	}
	if !full || mean < 0.2 || mean > 0.5 {
		t.Errorf("mean of a third sampled as 1s and 0s: %.2f (full %v), want about 0.33", mean, full)
	}
	// The target lowered: the window starts again, so the old usage is not judged against it.
	if _, full := jd.meanShare(k, 0.6, 0.2, t0.Add(91*time.Second)); full {
		t.Error("a changed target keeps the old window")
	}
}

func b2f(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestStartingContainerIsNoBypass: a view can read a starting container's
// ledger before its process claims the slot that vouches for it (the
// interposer opens the ledger before cuInit, claims the slot after) and
// then see the context the process made since. That is no bypass: the
// next view reads the ledger vouched. A cgroup with activity and no
// ledger in both views is one.
func TestStartingContainerIsNoBypass(t *testing.T) {
	c := New("node", "test", Sources{}, slog.New(slog.DiscardHandler))
	starting, bypass := Key{Cgroup: 1, GPU: 0}, Key{Cgroup: 2, GPU: 0}
	view := func(at time.Time, ledgers map[uint64]*ledger) map[Key][]agentapi.Breach {
		j := &joiner{c: c, v: &View{Time: at}, procs: map[Key][]gpuProc{}, ordinals: map[Key]int{}, entries: map[Key]*agentapi.ContainerDevice{
			starting: {CgroupID: starting.Cgroup, Unenforced: ledgers[starting.Cgroup] == nil},
			bypass:   {CgroupID: bypass.Cgroup, Unenforced: true},
		}}
		j.judgeAll(ledgers, nil, at)
		out := map[Key][]agentapi.Breach{}
		for k, e := range j.entries {
			out[k] = e.Breaches
		}
		return out
	}
	t0 := time.Unix(1000, 0)
	// The first view: the starting container's ledger refused (no slot
	// vouches yet), its context seen.
	first := view(t0, map[uint64]*ledger{})
	if len(first[starting]) != 0 || len(first[bypass]) != 0 {
		t.Fatalf("one view's reading is a breach: %v", first)
	}
	if !c.Deciding() {
		t.Error("a view that leaves two bypasses to decide does not say so: the enforcer would look again only at its own pace")
	}
	vouched := &ledger{dir: "starting", usage: &controlblock.UsageSnapshot{CgroupID: starting.Cgroup, NDev: 1}}
	second := view(t0.Add(time.Second), map[uint64]*ledger{starting.Cgroup: vouched})
	if len(second[starting]) != 0 {
		t.Errorf("a container whose ledger the next view reads vouched is in breach: %v", second[starting])
	}
	if !reasonsOf(second[bypass])[BreachBypass] {
		t.Errorf("a cgroup active without a ledger in two views is no bypass: %v", second[bypass])
	}
	if c.Deciding() {
		t.Error("a view whose breaches are all decided still asks for a second look")
	}
}
