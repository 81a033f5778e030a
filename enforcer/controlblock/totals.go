package controlblock

// ProcTotals keeps a container's launch and throttled-time counters
// monotonic although they live in per-process slots: a slot is freed when
// its process exits, and what it counted stays in the totals. What a
// process counted after the last Update and before it exited is lost.
type ProcTotals struct {
	Launches    uint64
	ThrottledNs uint64
	seen        map[procID]procCounts
}

type procID struct {
	slot      int
	pid       int32
	startTime uint64
}

type procCounts struct{ launches, throttledNs uint64 }

// Update adds what each live process counted since the last Update. A
// slot's counters never go back: a lower value (garbage in an untrusted
// ledger) adds nothing.
func (t *ProcTotals) Update(procs []ProcUsage) {
	seen := make(map[procID]procCounts, len(procs))
	for _, p := range procs {
		id := procID{p.Slot, p.Pid, p.StartTime}
		prev := t.seen[id]
		cur := procCounts{max(p.Launches, prev.launches), max(p.ThrottledNs, prev.throttledNs)}
		t.Launches += cur.launches - prev.launches
		t.ThrottledNs += cur.throttledNs - prev.throttledNs
		seen[id] = cur
	}
	t.seen = seen
}
