package interposer_test

import (
	"strings"
	"testing"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
)

// ticketBatch is the most gate tickets a thread takes at once (GW_BATCH_MAX
// in src/launch.c).
const ticketBatch = 16

// TestTicketBatchLapsesAtClose: a thread takes gate tickets a batch at a
// time, and what it has not used when the agent closes the gate lapses:
// its next launch waits for the next grant instead of running on a ticket
// taken before the close.
func TestTicketBatchLapsesAtClose(t *testing.T) {
	b := newBox(t, 1, "16Gi")
	lim := b.agent(controlblock.LimitsConfig{GateMask: 1, GraceNs: uint64(60 * time.Second)})
	lim.Heartbeat()
	if err := lim.RaiseGrant(0, 1000); err != nil {
		t.Fatal(err)
	}
	h := b.start("init", "ctx", "0", "launch", "10", "hold", "launch", "5", "hold")
	h.ready(t)
	u, err := waitUsage(b)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	issued := u.Issued(0)
	if issued <= 10 || issued > 10+ticketBatch {
		t.Fatalf("after 10 launches under a grant of 1000: %d tickets taken, want a batch ahead (11-%d)", issued, 10+ticketBatch)
	}
	if err := lim.CloseGrant(0, issued); err != nil {
		t.Fatal(err)
	}
	h.resume()
	deadline := time.Now().Add(10 * time.Second)
	for u.Issued(0) <= issued && time.Now().Before(deadline) { // the first launch after the close takes a new ticket
		lim.Heartbeat()
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // a launch that wrongly passed would have been counted by now
	lim.Heartbeat()
	if got := u.Issued(0); got != issued+1 {
		t.Errorf("after the close: %d tickets, want %d: the first launch takes a new ticket and waits, "+
			"none runs on the batch taken before the close", got, issued+1)
	}
	if err := lim.RaiseGrant(0, issued+100); err != nil {
		t.Fatal(err)
	}
	if line := h.WaitLine(t, "launch", 10*time.Second); !strings.Contains(line, "launch CUDA_SUCCESS") {
		t.Fatalf("launch: %s", line)
	}
	h.ready(t)
	h.resume()
	h.Wait()
}

// TestTicketBatchNotShared: a fork child takes its own tickets, never the
// parent's unused batch, and a synchronize gives the thread's batch up, so
// that its completion mark never speaks for launches still to come.
func TestTicketBatchNotShared(t *testing.T) {
	b := newBox(t, 1, "16Gi")
	b.openGate(1)
	// the child's launch is not waited for: the parent's stream has no worker thread in the child
	h := b.start("init", "ctx", "0", "launch", "3", "hold", "fork", "kernel", "0", "hold")
	h.ready(t)
	u, err := waitUsage(b)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	parent := u.Issued(0)
	if parent <= 3 {
		t.Fatalf("after 3 launches: %d tickets, want a batch ahead", parent)
	}
	h.resume()
	h.ready(t) // the child's hold
	if got := u.Issued(0); got <= parent {
		t.Errorf("the fork child's launch took no ticket of its own (%d before, %d after)", parent, got)
	}
	h.resume()
	h.Wait()

	s := newBox(t, 1, "16Gi")
	s.openGate(1)
	hs := s.start("init", "ctx", "0", "launch", "3", "sync", "hold", "launch", "1", "hold")
	hs.ready(t)
	us, err := waitUsage(s)
	if err != nil {
		t.Fatal(err)
	}
	defer us.Close()
	issued := us.Issued(0)
	if done, ok := us.Mark(0, issued); !ok || done == 0 {
		t.Errorf("after a synchronize: no done mark for all %d tickets", issued)
	}
	hs.resume()
	hs.ready(t)
	if got := us.Issued(0); got <= issued {
		t.Errorf("the launch after a synchronize ran on a ticket its mark spoke for (%d tickets before, %d after)", issued, got)
	}
	hs.resume()
	hs.Wait()
}

// TestTicketBatchFitsTheStep: a thread that launches the same number of
// kernels between synchronizes takes tickets for exactly those, once it has
// seen one step: its batches end where the step does, and none lapse.
func TestTicketBatchFitsTheStep(t *testing.T) {
	b := newBox(t, 1, "16Gi")
	b.openGate(1)
	h := b.start("init", "ctx", "0", "launch", "20", "sync", "hold", "launch", "20", "sync", "launch", "20", "sync", "hold")
	h.ready(t)
	u, err := waitUsage(b)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	first := u.Issued(0)
	h.resume()
	h.ready(t)
	if got := u.Issued(0) - first; got != 40 {
		t.Errorf("two steps of 20 launches after the first took %d tickets, want 40", got)
	}
	h.resume()
	h.Wait()
}
