package scheduler

import (
	"os"
	"path/filepath"
	"testing"
	"time"
	"unsafe"

	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
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

// A container whose process ends while the work of its last slice drains
// is removed, and its ledger closed, before the drain is over. The next
// tick read that closed ledger's completion mark, and the agent died; the
// next owner's gate must open instead.
func TestRemovingTheDrainingMemberEndsItsDrain(t *testing.T) {
	dir := t.TempDir()
	newMember := func(key string) *member {
		lim, err := controlblock.CreateLimits(filepath.Join(dir, key, "limits"), controlblock.LimitsConfig{GateMask: 1, NDev: 1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { lim.Close() })
		if err := lim.RaiseGrant(0, 8); err != nil {
			t.Fatal(err)
		}
		usage := testLedger(t, filepath.Join(dir, key, "usage"), 8, 0) // its work has yet to run
		return &member{c: &container{key: key, limits: lim, usage: usage, marks: true, eff: Settings{Weight: 1}},
			lastIssued: 8, charged: 8, busy: true, waiting: true, active: true, probe: probeStart}
	}
	a, b := newMember("a"), newMember("b")
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
