package interposer_test

import (
	"os"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
)

// TestLaunchesCountedPerDevice: while the container has a gate on any
// device, each launch and its wait are counted on the device it ran on
// (the gate on device 0 alone here; the 13 launches on device 1 are
// counted there, without a ticket), and the slot says how much of its
// counts the per-device counters hold.
func TestLaunchesCountedPerDevice(t *testing.T) {
	b := newBox(t, 2, "16Gi")
	lim := b.agent(controlblock.LimitsConfig{GateMask: 1, GraceNs: uint64(60 * time.Second)})
	h := b.start("init", "ctx", "1", "launch", "13", "ctx", "0", "launch", "7", "hold")
	deadline := time.Now().Add(10 * time.Second)
	for {
		lim.Heartbeat()
		// The interposer sizes the file before it writes the header: a
		// ledger that does not parse yet is not laid out yet.
		if u, err := os.ReadFile(b.usagePath()); err == nil {
			if l, err := controlblock.ParseUsage(u); err == nil && l.LaunchesIssued[0] >= 1 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no launch reached the gate")
		}
		time.Sleep(20 * time.Millisecond)
	}
	lim.Heartbeat()
	time.Sleep(200 * time.Millisecond) // the launches on device 0 wait this long
	if err := lim.RaiseGrant(0, 1000); err != nil {
		t.Fatal(err)
	}
	pid := h.ready(t)
	time.Sleep(flushWithin) // launch counts reach the ledger within this
	l := b.ledger()
	p := proc(l, pid)
	if p == nil {
		t.Fatalf("no slot for pid %d", pid)
	}
	if l.ABIMinor != controlblock.ABIMinor || l.LaunchesDev[0] != 7 || l.LaunchesDev[1] != 13 || l.LaunchesIssued[1] != 0 {
		t.Errorf("ledger minor %d: launches by device %v, tickets %v; want minor %d, 7 and 13, no tickets on device 1",
			l.ABIMinor, l.LaunchesDev[:2], l.LaunchesIssued[:2], controlblock.ABIMinor)
	}
	if l.ThrottledNsDev[0] < uint64(150*time.Millisecond) || l.ThrottledNsDev[1] != 0 {
		t.Errorf("throttled by device %v, want >= 150ms on device 0 alone", l.ThrottledNsDev[:2])
	}
	if p.Launches != 20 || p.LaunchesPlaced != 20 || p.ThrottledNs != l.ThrottledNsDev[0] || p.ThrottledPlacedNs != p.ThrottledNs {
		t.Errorf("slot %+v: want 20 launches, all placed, its throttled time all on device 0 (%d)", p, l.ThrottledNsDev[0])
	}
	h.resume()
	h.Wait()
}

// TestLaunchesWithoutGateNotPlaced: without a gate the interposer does not
// ask the driver for a launch's device, so the launches are counted in the
// process's slot alone (the collector puts them on its first GPU).
func TestLaunchesWithoutGateNotPlaced(t *testing.T) {
	b := newBox(t, 2, "16Gi")
	h := b.start("init", "ctx", "0", "launch", "5", "ctx", "1", "launch", "6", "hold")
	pid := h.ready(t)
	time.Sleep(flushWithin)
	l := b.ledger()
	p := proc(l, pid)
	if p == nil || p.Launches != 11 || p.LaunchesPlaced != 0 || l.LaunchesDev != [controlblock.MaxDevices]uint64{} {
		t.Errorf("slot %+v, launches by device %v: want 11 launches in the slot, none placed", p, l.LaunchesDev[:2])
	}
	h.resume()
	h.Wait()
}

// TestLedgerOfMinorZero: a ledger laid out by an interposer of minor 0 (a
// container started before an upgrade) keeps working; its reserved space is
// left as it was, so the collector falls back to per-process attribution.
func TestLedgerOfMinorZero(t *testing.T) {
	b := newBox(t, 2, "16Gi")
	lim := b.agent(controlblock.LimitsConfig{GateMask: 1, GraceNs: uint64(60 * time.Second)})
	if err := lim.RaiseGrant(0, 1000); err != nil {
		t.Fatal(err)
	}
	lim.Heartbeat()
	var u controlblock.Usage
	u.Magic, u.ABIMajor, u.ABIMinor, u.Size = controlblock.UsageMagic, controlblock.ABIMajor, 0, uint32(controlblock.UsageSize)
	u.MaxDevices, u.MaxSlots, u.SlotSize = controlblock.MaxDevices, controlblock.MaxSlots, uint32(unsafe.Sizeof(controlblock.Slot{}))
	copy(u.CgroupPath[:], "/old")
	if err := os.WriteFile(b.usagePath(), unsafe.Slice((*byte)(unsafe.Pointer(&u)), controlblock.UsageSize), 0o666); err != nil {
		t.Fatal(err)
	}
	h := b.start("init", "ctx", "0", "launch", "4", "ctx", "1", "launch", "3", "hold")
	pid := h.ready(t)
	time.Sleep(flushWithin)
	raw, err := os.ReadFile(b.usagePath())
	if err != nil {
		t.Fatal(err)
	}
	got := (*controlblock.Usage)(unsafe.Pointer(&raw[0]))
	s := &got.Slots[0]
	if int(s.Pid) != pid || s.Launches != 7 || got.LaunchesIssued[0] < 4 || got.LaunchesIssued[0] > 4+ticketBatch-1 {
		t.Errorf("slot pid %d launches %d, tickets %d: want pid %d, 7 launches, 4 tickets and up to a batch less one unused",
			s.Pid, s.Launches, got.LaunchesIssued[0], pid)
	}
	if got.ABIMinor != 0 || got.LaunchesDev != [controlblock.MaxDevices]uint64{} || s.LaunchesPlaced != 0 ||
		got.DevMismatches != 0 || strings.Trim(string(got.Reserved[:]), "\x00") != "" {
		t.Errorf("minor-0 ledger written past its layout: minor %d, launches by device %v, placed %d",
			got.ABIMinor, got.LaunchesDev[:2], s.LaunchesPlaced)
	}
	h.resume()
	h.Wait()
}
