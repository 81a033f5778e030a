package interposer_test

import (
	"strings"
	"testing"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
)

// flushWithin is how late the interposer may be in summing its threads'
// launch counts into the ledger (its reaper sums them every 125 ms).
const flushWithin = 250 * time.Millisecond

// openGate gives the container a gate on the devices of mask with grants
// no test reaches, so that every launch is counted on its device and takes
// a ticket, and none waits.
func (b *box) openGate(mask uint32) *controlblock.LimitsFile {
	b.t.Helper()
	lim := b.agent(controlblock.LimitsConfig{GateMask: mask, GraceNs: uint64(60 * time.Second)})
	lim.Heartbeat()
	for d := 0; d < controlblock.MaxDevices; d++ {
		if mask&(1<<d) != 0 {
			if err := lim.RaiseGrant(d, 1<<40); err != nil {
				b.t.Fatal(err)
			}
		}
	}
	return lim
}

// settled polls the ledger until ok holds of it, and fails the test when it
// does not within flushWithin of since.
func (b *box) settled(t *testing.T, since time.Time, ok func(*controlblock.UsageSnapshot) bool) *controlblock.UsageSnapshot {
	t.Helper()
	for {
		l := b.ledger()
		if ok(l) {
			return l
		}
		if time.Since(since) > flushWithin {
			return l
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestLaunchCountsExactFromThreads: launches from threads that exit (their
// counts are summed as they exit) and from the main thread reach the
// process's slot and, under a gate, the per-device counters, exactly and
// within 250 ms of the last launch.
func TestLaunchCountsExactFromThreads(t *testing.T) {
	for _, gated := range []bool{false, true} {
		b := newBox(t, 1, "16Gi")
		if gated {
			b.openGate(1)
		}
		h := b.start("init", "ctx", "0", "threads", "8", "2000", "launch", "1000", "hold")
		pid := h.ready(t)
		last := time.Now()
		const want = 8*2000 + 1000
		l := b.settled(t, last, func(l *controlblock.UsageSnapshot) bool {
			p := proc(l, pid)
			return p != nil && p.Launches == want && (!gated || p.LaunchesPlaced == want)
		})
		p := proc(l, pid)
		if p == nil || p.Launches != want {
			t.Fatalf("gated %v: slot %+v within %v of the last launch, want %d launches", gated, p, flushWithin, want)
		}
		// tickets: one a launch, and each of the 9 threads' last batch may be left part unused
		const unusedAtMost = 9 * (ticketBatch - 1)
		if gated && (p.LaunchesPlaced != want || l.LaunchesDev[0] != want || l.LaunchesIssued[0] < want || l.LaunchesIssued[0] > want+unusedAtMost) {
			t.Errorf("gated: placed %d, on device 0 %d, tickets %d; want %d, %d and %d-%d", p.LaunchesPlaced, l.LaunchesDev[0],
				l.LaunchesIssued[0], want, want, want, want+unusedAtMost)
		}
		if !gated && (p.LaunchesPlaced != 0 || l.LaunchesDev[0] != 0) {
			t.Errorf("ungated: placed %d, on device 0 %d; want none", p.LaunchesPlaced, l.LaunchesDev[0])
		}
		h.resume()
		h.Wait()
	}
}

// TestLaunchCountsFork: a fork child counts its own launches in its own
// slot, from zero; the parent's stay the parent's.
func TestLaunchCountsFork(t *testing.T) {
	b := newBox(t, 1, "16Gi")
	// the child's launches are not waited for: the parent's stream has no worker thread in the child
	h := b.start("init", "ctx", "0", "launch", "5", "fork", "kernel", "0", "kernel", "0", "kernel", "0", "hold")
	child := h.ready(t)
	parent := h.Cmd.Process.Pid
	last := time.Now()
	l := b.settled(t, last, func(l *controlblock.UsageSnapshot) bool {
		pp, cp := proc(l, parent), proc(l, child)
		return pp != nil && cp != nil && pp.Launches == 5 && cp.Launches == 3
	})
	if pp, cp := proc(l, parent), proc(l, child); pp == nil || cp == nil || pp.Launches != 5 || cp.Launches != 3 {
		t.Errorf("parent %+v, child %+v: want 5 and 3 launches", pp, cp)
	}
	h.resume()
	h.Wait()
}

// TestLaunchCountsSignalHandler: launches made by a signal handler that
// interrupted the same thread's launches are counted, and so are the
// interrupted ones: a thread's count is one add no handler can split.
func TestLaunchCountsSignalHandler(t *testing.T) {
	b := newBox(t, 1, "16Gi")
	h := b.start("init", "ctx", "0", "siglaunch", "300", "hold")
	line := h.WaitLine(t, "siglaunch ", 20*time.Second)
	if !strings.HasPrefix(line, "siglaunch CUDA_SUCCESS") {
		t.Fatalf("siglaunch: %s", line)
	}
	want := field(t, line, "main") + field(t, line, "handler")
	if field(t, line, "handler") == 0 {
		t.Fatalf("%s: no launch from the handler", line)
	}
	pid := h.ready(t)
	l := b.settled(t, time.Now(), func(l *controlblock.UsageSnapshot) bool {
		p := proc(l, pid)
		return p != nil && p.Launches == want
	})
	if p := proc(l, pid); p == nil || p.Launches != want {
		t.Errorf("slot %+v after %s: want %d launches", p, line, want)
	}
	h.resume()
	h.Wait()
}

// TestLaunchCountsAtExit: what a process launched, from its main thread and
// from threads, is summed at its exit: the per-device counters of a gated
// container hold every launch once it is gone. Gate tickets are taken a
// batch at a time, so each of the five launching threads may leave up to a
// batch less one unused.
func TestLaunchCountsAtExit(t *testing.T) {
	b := newBox(t, 1, "16Gi")
	b.openGate(1)
	r := b.run("init", "ctx", "0", "launch", "500", "threads", "4", "100", "launch", "1")
	r.expect(t, "init CUDA_SUCCESS", "ctx CUDA_SUCCESS", "launch CUDA_SUCCESS", "threads CUDA_SUCCESS", "launch CUDA_SUCCESS")
	const launches, unusedAtMost = 901, 5 * (ticketBatch - 1)
	if l := b.ledger(); l.LaunchesDev[0] != launches || l.LaunchesIssued[0] < launches ||
		l.LaunchesIssued[0] > launches+unusedAtMost || len(l.Procs) != 0 {
		t.Errorf("after exit: launches on device 0 %d, tickets %d, %d live slots; want %d, %d-%d, none",
			l.LaunchesDev[0], l.LaunchesIssued[0], len(l.Procs), launches, launches, launches+unusedAtMost)
	}
}

// TestGatedLaunchOneDeviceAsksNoDriver: with one visible device a gated
// launch knows its device without a driver call.
func TestGatedLaunchOneDeviceAsksNoDriver(t *testing.T) {
	b := newBox(t, 1, "16Gi", "SIMGPU_COUNT_CALLS=1")
	b.openGate(1)
	r := b.run("init", "ctx", "0", "launch", "1", "calls", "launch", "5000", "calls")
	r.expect(t, "init CUDA_SUCCESS", "ctx CUDA_SUCCESS", "launch CUDA_SUCCESS", "calls CUDA_SUCCESS",
		"launch CUDA_SUCCESS", "calls CUDA_SUCCESS")
	before, after := field(t, r.step(t, "calls", 0), "getdevice"), field(t, r.step(t, "calls", 1), "getdevice")
	if after != before {
		t.Errorf("5000 gated launches asked the driver for the device %d times, want 0", after-before)
	}
	if l := b.ledger(); l.LaunchesDev[0] != 5001 {
		t.Errorf("launches on device 0: %d, want 5001", l.LaunchesDev[0])
	}
}

// TestGatedLaunchDeviceFromHooks: with two devices a gated launch takes its
// device from what the context hooks kept (set, create, destroy), asks the
// driver only to check it, and the check finds no mismatch.
func TestGatedLaunchDeviceFromHooks(t *testing.T) {
	b := newBox(t, 2, "16Gi", "SIMGPU_COUNT_CALLS=1")
	b.openGate(3)
	h := b.start("init", "ctx", "0", "launch", "1", "calls", "launch", "3000", "ctx", "1", "launch", "3000",
		"ctxcreate", "0", "launch", "2000", "ctxdestroy", "launch", "1000", "threads", "2", "500", "calls", "hold")
	before := field(t, h.WaitLine(t, "calls ", 20*time.Second), "getdevice")
	after := field(t, h.WaitLine(t, "calls ", 20*time.Second), "getdevice")
	pid := h.ready(t)
	// the checks (one in 1024 launches a thread), and a thread's first gated launch
	if n := after - before; n > 12 {
		t.Errorf("9999 gated launches asked the driver for the device %d times, want at most 12", n)
	}
	l := b.settled(t, time.Now(), func(l *controlblock.UsageSnapshot) bool {
		return l.LaunchesDev[0] == 5001 && l.LaunchesDev[1] == 5000
	})
	if l.LaunchesDev[0] != 5001 || l.LaunchesDev[1] != 5000 || l.DevMismatches != 0 {
		t.Errorf("launches by device %v, mismatches %d; want 5001 and 5000, none", l.LaunchesDev[:2], l.DevMismatches)
	}
	if p := proc(l, pid); p == nil || p.Launches != 10001 || p.LaunchesPlaced != 10001 {
		t.Errorf("slot %+v: want 10001 launches, all placed", p)
	}
	h.resume()
	h.Wait()
}

// TestGatedLaunchBypassCounted: a context made current behind the hooks'
// back (the driver's cuCtxSetCurrent reached by libc's own dlsym) is found by the
// check, counted in the ledger, and the driver's device taken from then on.
func TestGatedLaunchBypassCounted(t *testing.T) {
	b := newBox(t, 2, "16Gi")
	b.openGate(3)
	h := b.start("init", "ctx", "0", "launch", "10", "bypass", "1", "launch", "2048", "hold")
	if l := h.WaitLine(t, "bypass ", 20*time.Second); l != "bypass CUDA_SUCCESS" {
		t.Fatalf("bypass: %s", l)
	}
	h.ready(t)
	l := b.settled(t, time.Now(), func(l *controlblock.UsageSnapshot) bool {
		return l.LaunchesDev[0]+l.LaunchesDev[1] == 2058
	})
	if l.DevMismatches != 1 || l.LaunchesDev[1] == 0 || l.LaunchesDev[0]+l.LaunchesDev[1] != 2058 {
		t.Errorf("mismatches %d, launches by device %v: want 1 mismatch, device 1's launches counted there after it",
			l.DevMismatches, l.LaunchesDev[:2])
	}
	h.resume()
	h.Wait()
}

// TestLaunchCountsEveryEntryPoint: every launch entry point, by its name and
// by its per-thread-stream variant, counts each launch once. An ungated
// launch jumps to the driver without the re-entry guard once its hook has
// been seen not to come back into the hooks; simgpu's
// cuLaunchKernelEx_ptsz calls cuLaunchKernelEx through the PLT, so that hook
// must stay guarded or each of its launches would count twice.
func TestLaunchCountsEveryEntryPoint(t *testing.T) {
	const n = 300
	for _, how := range []string{"direct", "direct-ptsz"} {
		for _, kind := range []string{"launch", "launchex", "coop", "graph"} {
			b := newBox(t, 1, "16Gi")
			h := b.start("--resolve", how, "init", "ctx", "0", kind, "300", "hold")
			pid := h.ready(t)
			want := uint64(n)
			if kind == "graph" {
				want++ // the kernel launched into the capture
			}
			l := b.settled(t, time.Now(), func(l *controlblock.UsageSnapshot) bool {
				p := proc(l, pid)
				return p != nil && p.Launches == want
			})
			if p := proc(l, pid); p == nil || p.Launches != want {
				t.Errorf("%s %s: slot %+v, want %d launches", how, kind, p, want)
			}
			h.resume()
			h.Wait()
		}
	}
}
