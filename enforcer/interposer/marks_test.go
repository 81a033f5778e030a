package interposer_test

import (
	"strings"
	"testing"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
)

// TestCompletionMarks: a launch that waits at the gate leaves a completion
// mark for the tickets before its own, done once their work has run (here
// at once: nothing runs); a synchronize that returns marks the device done
// with every ticket taken. The agent reads them with UsageFile.Mark.
func TestCompletionMarks(t *testing.T) {
	b := newBox(t, 1, "16Gi")
	lim := b.agent(controlblock.LimitsConfig{GateMask: 1, GraceNs: uint64(60 * time.Second)})
	lim.Heartbeat()
	if err := lim.RaiseGrant(0, 5); err != nil { // the 6th launch waits
		t.Fatal(err)
	}
	h := b.start("init", "ctx", "0", "launch", "10", "sync", "hold")
	u, err := waitUsage(b)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	before := controlblock.MonotonicNs()
	deadline := time.Now().Add(10 * time.Second)
	var done uint64
	for ok := false; !ok || done == 0; done, ok = u.Mark(0, 5) {
		lim.Heartbeat()
		if time.Now().After(deadline) {
			t.Fatalf("no completed mark for tickets 1-5 (issued %d)", u.Issued(0))
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, ok := u.Mark(0, 6); ok {
		t.Error("the 6th launch's mark speaks for its own ticket")
	}
	if after := controlblock.MonotonicNs(); done > after || done+uint64(10*time.Second) < before {
		t.Errorf("mark done at %d, not near now (%d-%d)", done, before, after)
	}
	if err := lim.RaiseGrant(0, 1000); err != nil {
		t.Fatal(err)
	}
	if line := h.WaitLine(t, "sync", 10*time.Second); !strings.Contains(line, "sync CUDA_SUCCESS") {
		t.Fatalf("sync: %s", line)
	}
	if done, ok := u.Mark(0, 10); !ok || done == 0 {
		t.Errorf("after a synchronize: mark for ticket 10 %v done %d, want done", ok, done)
	}
	h.ready(t)
	h.resume()
	h.Wait()
}

// waitUsage opens the container's ledger once its first process made it.
func waitUsage(b *box) (*controlblock.UsageFile, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		u, err := controlblock.OpenUsage(b.usagePath())
		if err == nil || time.Now().After(deadline) {
			return u, err
		}
		time.Sleep(10 * time.Millisecond)
	}
}
