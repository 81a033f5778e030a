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
	ledger := func(done uint64) *controlblock.UsageFile {
		var u controlblock.Usage
		u.Magic, u.ABIMajor, u.ABIMinor, u.Size = controlblock.UsageMagic, controlblock.ABIMajor, controlblock.ABIMinor, uint32(controlblock.UsageSize)
		u.MaxDevices, u.MaxSlots, u.SlotSize, u.NDev = controlblock.MaxDevices, controlblock.MaxSlots, uint32(unsafe.Sizeof(controlblock.Slot{})), 1
		u.LaunchesIssued[0], u.MarkRecNs[0], u.MarkTicket[0], u.MarkDoneNs[0] = 64, 1, 64, done
		path := filepath.Join(dir, "usage")
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
	now := time.Now()
	cfg := Config{Lookahead: 10 * time.Millisecond, Tick: time.Millisecond}
	m := &member{c: &container{key: "a", limits: lim, usage: ledger(0), marks: true}, lastIssued: 64, lastTake: now.Add(-40 * time.Millisecond), cost: 800e3}
	g := &gpu{owner: m}
	if g.ownerIdle(now, cfg) {
		t.Fatal("an owner whose released work has yet to run was taken for idle")
	}
	m.c.usage = ledger(controlblock.MonotonicNs())
	if !g.ownerIdle(now, cfg) {
		t.Fatal("an owner whose work has all run, with no ticket taken for 40 ms, was not taken for idle")
	}
}
