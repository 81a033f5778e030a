package scheduler

import (
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"
	"unsafe"

	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
	"github.com/gpuwarden/gpuwarden/enforcer/policy"
)

// At weights 1:2, after 30 ms of wall time went to nobody (a drain's end
// to the next tick, say), a earned 10 ms of it and b 20 ms: both are as far
// behind what they are owed, in their own shares. Picking by raw credit
// would hand b the device, and over a run b would get more than twice a's.
func TestPickByStandingNotRawCredit(t *testing.T) {
	a := &member{c: &container{key: "a"}, target: 1.0 / 3, waiting: true, credit: 10e6}
	b := &member{c: &container{key: "b"}, target: 2.0 / 3, waiting: true, credit: 19e6}
	g := &gpu{members: []*member{a, b}, active: []*member{a, b}}
	if got := g.pick(nil, time.Now(), Config{}); got != a {
		t.Fatalf("picked %s: a stands at %.0f ms of wall time, b at %.0f", got.c.key, a.standing()/1e6, b.standing()/1e6)
	}
	b.credit = 21e6
	if got := g.pick(nil, time.Now(), Config{}); got != b {
		t.Fatalf("picked %s: b stands at %.0f ms of wall time, a at %.0f", got.c.key, b.standing()/1e6, a.standing()/1e6)
	}
}

// A training step launches ahead of the device as fast as each tick
// releases tickets, then synchronizes on all of it: the owner takes no
// ticket for tens of ms while its work runs. Its completion marks say the
// work has yet to run, so its slice is still in use; taken for idle, it
// lost its turn at every slice's end while its queue drained.
func TestOwnerSynchronizingOnQueuedWorkIsNotIdle(t *testing.T) {
	dir := t.TempDir()
	lim, err := controlblock.CreateLimits(filepath.Join(dir, "c", "limits"), controlblock.LimitsConfig{GateMask: 1, NDev: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	if err := lim.RaiseGrant(0, 64); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	cfg := Config{Lookahead: 10 * time.Millisecond, Tick: time.Millisecond}
	m := &member{c: &container{key: "a", limits: lim, usage: testLedger(t, filepath.Join(dir, "usage"), 64, 0), marks: true},
		lastIssued: 64, lastTake: now.Add(-40 * time.Millisecond), cost: 800e3}
	g := &gpu{owner: m}
	if g.ownerIdle(now, cfg) {
		t.Fatal("an owner whose released work has yet to run was taken for idle")
	}
	m.c.usage = testLedger(t, filepath.Join(dir, "usage"), 64, controlblock.MonotonicNs())
	if !g.ownerIdle(now, cfg) {
		t.Fatal("an owner whose work has all run, with no ticket taken for 40 ms, was not taken for idle")
	}
}

// testLedger writes a one-device ledger at path with issued tickets taken
// and a completion mark for all of them, seen run at done (0: pending).
func testLedger(t *testing.T, path string, issued, done uint64) *controlblock.UsageFile {
	t.Helper()
	var u controlblock.Usage
	u.Magic, u.ABIMajor, u.ABIMinor, u.Size = controlblock.UsageMagic, controlblock.ABIMajor, controlblock.ABIMinor, uint32(controlblock.UsageSize)
	u.MaxDevices, u.MaxSlots, u.SlotSize, u.NDev = controlblock.MaxDevices, controlblock.MaxSlots, uint32(unsafe.Sizeof(controlblock.Slot{})), 1
	u.LaunchesIssued[0], u.MarkRecNs[0], u.MarkTicket[0], u.MarkDoneNs[0] = issued, 1, issued, done
	if err := os.WriteFile(path, unsafe.Slice((*byte)(unsafe.Pointer(&u)), controlblock.UsageSize), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := controlblock.OpenUsage(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// gatedMember is a busy, waiting member with one gated device: grant
// tickets granted, issued taken, and a completion mark for all of them
// seen run at done (0: pending).
func gatedMember(t *testing.T, dir, key string, grant, issued, done uint64) *member {
	t.Helper()
	lim, err := controlblock.CreateLimits(filepath.Join(dir, key, "limits"), controlblock.LimitsConfig{GateMask: 1, NDev: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	if err := lim.RaiseGrant(0, grant); err != nil {
		t.Fatal(err)
	}
	usage := testLedger(t, filepath.Join(dir, key, "usage"), issued, done)
	return &member{c: &container{key: key, limits: lim, usage: usage, marks: true, eff: Settings{Weight: 1}, gated: 1},
		lastIssued: issued, charged: issued, busy: true, waiting: true, active: true, probe: probeStart}
}

// A container whose process ends while the work of its last slice drains
// is removed, and its ledger closed, before the drain is over. The next
// tick read that closed ledger's completion mark, and the agent died; the
// next owner's gate must open instead.
func TestRemovingTheDrainingMemberEndsItsDrain(t *testing.T) {
	dir := t.TempDir()
	// 8 tickets taken and granted, their work yet to run
	a, b := gatedMember(t, dir, "a", 8, 8, 0), gatedMember(t, dir, "b", 8, 8, 0)
	now := time.Now()
	cfg := Config{}
	cfg.defaults()
	g := &gpu{members: []*member{a, b}, active: []*member{a, b}, lastTick: now, clockAt: now, dirty: true}
	g.plan(now, cfg)
	g.owner = a
	g.begin(b, now, cfg)
	if g.draining != a {
		t.Fatal("a's slice ended without a drain")
	}
	now = now.Add(cfg.Tick)
	g.remove(a, now)
	if err := a.c.usage.Close(); err != nil {
		t.Fatal(err)
	}
	g.tick(now.Add(cfg.Tick), cfg)
	if g.draining != nil {
		t.Fatal("a removed container still drains")
	}
	if grant := b.c.limits.Grant(0); grant <= 8 {
		t.Fatalf("b's gate stays closed (grant %d) after a was removed", grant)
	}
}

// An owner whose grant ran out at its slice's end waits at its gate, and
// its completion mark says its work has run: closing its gate leaves
// nothing to drain, and the next owner's gate must open in that same tick,
// not a drain poll later (a millisecond of nobody's time a hand-over, on
// an H200, had the loop waited for its next tick).
func TestAGateClosedWithItsWorkRunOpensTheNextAtOnce(t *testing.T) {
	dir := t.TempDir()
	// a took 9 tickets, 8 granted: its 9th launch waits, marked behind the
	// 8 that ran; b waits with its second (a new gate grants one).
	a := gatedMember(t, dir, "a", 8, 9, controlblock.MonotonicNs())
	b := gatedMember(t, dir, "b", 1, 2, 0)
	a.cost, b.cost = 20e3, 20e3 // measured: no probing
	cfg := Config{}
	cfg.defaults()
	now := time.Now()
	g := &gpu{members: []*member{a, b}, active: []*member{a, b}, lastTick: now.Add(-cfg.Tick), clockAt: now.Add(-cfg.Tick), dirty: true}
	g.plan(now, cfg)
	g.owner, g.sliceStart = a, now.Add(-cfg.Slice)
	a.creditAt, b.creditAt, b.credit = now, now, float64(cfg.Slice)
	g.tick(now, cfg)
	if g.owner != b {
		t.Fatalf("a's slice ran its length and b waits with credit, yet the owner is %v", g.owner.c.key)
	}
	if g.draining != nil {
		t.Fatal("a's work had run, yet its drain goes on to the next tick")
	}
	if grant := b.c.limits.Grant(0); grant < 2 {
		t.Fatal("b's gate stays closed until the next tick")
	}
	if c := g.counts; c.Handovers != 1 || c.GapSeconds != 0 {
		t.Fatalf("slices %+v: want one hand-over and no time to nobody", c)
	}
}

// hostBound is a container in the virtual-time model below: a process
// that launches a ticket every hostNs while its gate lets it, each
// ticket's work done devNs after its launch (the device idles between:
// PyTorch's training steps on an H200), and that waits at its gate with a
// completion mark once its grant runs out, as the interposer does.
type hostBound struct {
	m        *member
	ledger   *os.File
	ran      uint64    // tickets launched
	blocked  bool      // a launch waits at the gate
	doneAt   time.Time // when the work of the tickets launched has run
	launched time.Time // when it could next launch
}

const hostNs, devNs = 20 * time.Microsecond, 8 * time.Microsecond

// h200DrainPoll is how often the loop looked for a drain's end on the H200
// run the model reproduces: the runtime's timers woke it about every
// millisecond, so nobody's time was about 1 ms a hand-over there (the loop
// now waits in a nanosleep). The model keeps the H200's figure: the cap
// must hold shares however much time goes to nobody.
const h200DrainPoll = time.Millisecond

// run launches what the grant allows from from to to.
func (h *hostBound) run(from, to time.Time) {
	grant := h.m.c.limits.Grant(0)
	if h.launched.Before(from) {
		h.launched = from
	}
	h.blocked = false
	for h.launched.Before(to) {
		if h.ran >= grant {
			h.blocked = true
			break
		}
		h.ran++
		h.doneAt = h.launched.Add(devNs)
		h.launched = h.launched.Add(hostNs)
	}
}

// publish writes the ledger as the interposer would at now: tickets taken
// (one more than launched while a launch waits) and the waiting launch's
// completion mark, done once its work has run.
func (h *hostBound) publish(t *testing.T, now time.Time) {
	var u controlblock.Usage
	issued, rec, ticket, done := h.ran, uint64(0), uint64(0), uint64(0)
	if h.blocked {
		issued, rec, ticket = h.ran+1, 1, h.ran
		if !now.Before(h.doneAt) {
			done = controlblock.MonotonicNs() - uint64(now.Sub(h.doneAt))
		}
	}
	for _, w := range []struct {
		off uintptr
		v   uint64
	}{{unsafe.Offsetof(u.LaunchesIssued), issued}, {unsafe.Offsetof(u.MarkTicket), ticket},
		{unsafe.Offsetof(u.MarkDoneNs), done}, {unsafe.Offsetof(u.MarkRecNs), rec}} {
		if _, err := h.ledger.WriteAt(unsafe.Slice((*byte)(unsafe.Pointer(&w.v)), 8), int64(w.off)); err != nil {
			t.Fatal(err)
		}
	}
}

// Between one owner's drained work and the next owner's first tick the
// device is nobody's: about 1 ms a hand-over, a hand-over every 80 ms, on
// an H200 where training is host-bound and drains last microseconds. Had
// that time been earned as credit by both containers, their credit would
// grow until it met its cap, which the larger share meets first; at
// weights 1:2 the smaller share was handed what the larger lost there, and
// the clock split 1.95:1 on the H200. Driven here in virtual time, with
// the loop's own tick and drain cadence, the clock must split as the
// shares do, at 1:2 and at fixed 30/70.
func TestNobodysTimeDoesNotTiltShares(t *testing.T) {
	for _, tc := range []struct {
		name     string
		settings GPUSettings
		weights  [2]int
	}{
		{"weighted_1to2", GPUSettings{}, [2]int{1, 2}},
		{"fixed_30_70", GPUSettings{Policy: policy.Fixed, PolicySet: true, MaxInst: 10}, [2]int{3, 7}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b, counts := runHostBound(t, tc.settings, tc.weights)
			t.Logf("charged a %.3f s, b %.3f s; slices %+v", a.paid/1e9, b.paid/1e9, counts)
			if counts.Handovers < 500 || counts.GapSeconds < 0.3 {
				t.Fatalf("slices %+v: the model did not hand the device over as the H200 run did", counts)
			}
			want := float64(tc.weights[1]) / float64(tc.weights[0])
			if r := b.paid / a.paid; math.Abs(r/want-1) > 0.01 {
				t.Errorf("the clock split b:a %.3f:1, want %.3f:1 within 1%%", r, want)
			}
		})
	}
}

// runHostBound runs two hostBound containers of the given weights for 60 s
// of virtual time.
func runHostBound(t *testing.T, settings GPUSettings, weights [2]int) (a, b *member, counts SliceCounts) {
	dir := t.TempDir()
	now := time.Now()
	cfg := Config{}
	cfg.defaults()
	g := &gpu{settings: settings, lastTick: now, clockAt: now}
	var hs []*hostBound
	for i, w := range weights {
		key := string(rune('a' + i))
		lim, err := controlblock.CreateLimits(filepath.Join(dir, key, "limits"), controlblock.LimitsConfig{GateMask: 1, NDev: 1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { lim.Close() })
		path := filepath.Join(dir, key, "usage")
		usage := testLedger(t, path, 0, 0)
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		c := &container{key: key, limits: lim, usage: usage, marks: true, eff: Settings{Weight: w}}
		m := newMember(c, 0, now)
		g.add(m)
		hs = append(hs, &hostBound{m: m, ledger: f})
	}
	for end := now.Add(60 * time.Second); now.Before(end); {
		next := now.Add(cfg.Tick)
		if g.draining != nil {
			next = now.Add(h200DrainPoll)
		}
		for _, h := range hs {
			h.run(now, next)
		}
		now = next
		for _, h := range hs {
			h.publish(t, now)
		}
		g.tick(now, cfg)
	}
	return hs[0].m, hs[1].m, g.counts
}
