package observe

import (
	"errors"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/cilium/ebpf/link"

	"github.com/gpuwarden/gpuwarden/bpf/libcuda"
)

// exactProc is a process that maps libcuda, as the exact launch counting
// knows it.
type exactProc struct {
	gen      uint64 // the scanner's: another process with the pid is new
	found    time.Time
	asked    time.Time // when Ledgered was last asked about it
	ledgered bool
	links    map[libcuda.FileID]link.Link
	failed   map[libcuda.FileID]bool // not tried again: logged once
}

// A ledger's slot is written as its process starts, and the agent's view of
// the ledgers lags by a few seconds: a young process is asked about often,
// so one that keeps a ledger pays the exact probe's traps only until that
// view names it; then rarely, since a process that leaves its slot while it
// runs is also a breach of its own (NVML lists it outside the ledger).
const (
	askYoung       = time.Second
	youngFor       = 10 * time.Second
	askEstablished = 10 * time.Second
)

func dueAsk(e *exactProc, now time.Time) bool {
	every := askEstablished
	if now.Sub(e.found) < youngFor {
		every = askYoung
	}
	return now.Sub(e.asked) >= every
}

// countExactly keeps the exact launch probe attached, by pid, to every
// process that maps an attached libcuda and keeps no ledger, and off the
// others. Called from the scan, with what it found.
func (o *Observer) countExactly(users map[int]libcuda.User) {
	now := time.Now()
	for pid, u := range users {
		e := o.exact[pid]
		if e != nil && e.gen != u.Gen {
			o.forget(pid, e)
			e = nil
		}
		if e == nil {
			e = &exactProc{gen: u.Gen, found: now, links: map[libcuda.FileID]link.Link{}, failed: map[libcuda.FileID]bool{}}
			o.exact[pid] = e
		}
		if dueAsk(e, now) {
			e.asked = now
			e.ledgered = o.cfg.Ledgered != nil && o.cfg.Ledgered(pid)
		}
		if e.ledgered {
			o.unlink(pid, e)
			continue
		}
		for f, l := range e.links {
			if !slices.Contains(u.Files, f) { // unmapped: the link counts nothing
				delete(e.links, f)
				o.closing.Go(func() { l.Close() })
			}
		}
		marked := len(e.links) > 0
		for _, f := range u.Files {
			if e.links[f] != nil || e.failed[f] {
				continue
			}
			o.mu.Lock()
			a := o.libs[f]
			o.mu.Unlock()
			if a == nil {
				continue // not attached: the scan said why
			}
			// Marked first, so no window counts a launch twice.
			if !marked {
				if err := o.probes.MarkExact(uint32(pid), true); err != nil {
					o.log.Warn("count launches exactly", "pid", pid, "err", err)
					continue
				}
				marked = true
			}
			l, err := o.probes.AttachExact(a.lib, pid)
			if err != nil {
				e.failed[f] = true
				if !errors.Is(err, os.ErrNotExist) { // else: it exited meanwhile
					o.log.Warn("count launches exactly", "pid", pid, "path", a.info.Path, "err", err)
				}
				continue
			}
			e.links[f] = l
		}
		if marked && len(e.links) == 0 {
			o.unmark(pid)
		}
	}
	for pid, e := range o.exact {
		if _, ok := users[pid]; !ok {
			o.forget(pid, e)
		}
	}
	n := 0
	for _, e := range o.exact {
		if len(e.links) > 0 {
			n++
		}
	}
	o.exactProcs.Store(int64(n))
}

// unlink takes the exact probe off a process: its launches are sampled
// again from now on.
func (o *Observer) unlink(pid int, e *exactProc) {
	if len(e.links) == 0 {
		return
	}
	o.unmark(pid)
	links := make([]link.Link, 0, len(e.links))
	for f, l := range e.links {
		links = append(links, l)
		delete(e.links, f)
	}
	// Closing waits for the kernel's grace periods (hundreds of
	// milliseconds): not in the scan's time.
	o.closing.Go(func() { closeLinks(links) })
}

func (o *Observer) forget(pid int, e *exactProc) {
	o.unlink(pid, e)
	delete(o.exact, pid)
}

func (o *Observer) unmark(pid int) {
	if err := o.probes.MarkExact(uint32(pid), false); err != nil {
		o.log.Warn("stop counting launches exactly", "pid", pid, "err", err)
	}
}

// closeLinks closes links side by side: each close waits for handlers in
// flight.
func closeLinks(links []link.Link) {
	var wg sync.WaitGroup
	for _, l := range links {
		wg.Go(func() { l.Close() })
	}
	wg.Wait()
}

// closeExact takes the exact probe off every process, at Close.
func (o *Observer) closeExact() {
	for pid, e := range o.exact {
		o.forget(pid, e)
	}
	o.closing.Wait()
}
