package collector

import "github.com/gpuwarden/gpuwarden/enforcer/controlblock"

// The interposer counts launches and throttled time per process slot, and a
// slot is freed when its process exits. slotCounters keeps what exited
// processes had counted, so that the container's totals only grow, as
// Prometheus counters must. What a process counted after the last read and
// before it exited is lost (documented).
type slotKey struct {
	cgroup    uint64
	pid       int32
	startTime uint64
}

type slotFigures struct{ launches, throttledNs uint64 }

type slotCounters struct {
	last    map[slotKey]slotFigures
	retired map[uint64]slotFigures // per cgroup: what exited processes counted
}

func newSlotCounters() slotCounters {
	return slotCounters{last: map[slotKey]slotFigures{}, retired: map[uint64]slotFigures{}}
}

// add records a container's live slots and returns its totals.
func (s *slotCounters) add(cg uint64, procs []controlblock.ProcUsage, live map[slotKey]bool) (launches, throttledNs uint64) {
	r := s.retired[cg]
	launches, throttledNs = r.launches, r.throttledNs
	for _, p := range procs {
		k := slotKey{cg, p.Pid, p.StartTime}
		live[k] = true
		f := slotFigures{p.Launches, p.ThrottledNs}
		if prev, ok := s.last[k]; ok && (f.launches < prev.launches || f.throttledNs < prev.throttledNs) {
			f = prev // a slot's counters never go back; a lower value is garbage
		}
		s.last[k] = f
		launches += f.launches
		throttledNs += f.throttledNs
	}
	return launches, throttledNs
}

// retire moves the slots not seen this time into their container's retired totals.
func (s *slotCounters) retire(live map[slotKey]bool) {
	for k, f := range s.last {
		if live[k] {
			continue
		}
		r := s.retired[k.cgroup]
		r.launches += f.launches
		r.throttledNs += f.throttledNs
		s.retired[k.cgroup] = r
		delete(s.last, k)
	}
}
