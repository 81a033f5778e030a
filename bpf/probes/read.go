package probes

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// DeviceUnknown is the device of an allocation made while neither the
// calling thread's context nor any context of its process was known.
const DeviceUnknown = ^uint32(0)

// Key is a (cgroup, device) pair.
type Key struct {
	Cgroup uint64 // cgroup v2 id
	Device uint32 // CUDA device ordinal, or DeviceUnknown
}

// Usage is what the programs counted for one Key since the maps were made
// (they survive agent restarts when pinned).
type Usage struct {
	Bytes          int64  // bytes currently allocated
	Allocs         uint64 // successful allocations
	Frees          uint64 // successful frees of tracked allocations
	AllocFailures  uint64 // allocations the driver refused
	CtxCreated     uint64 // contexts created
	CtxDestroyed   uint64 // contexts destroyed, or gone with their process
	ExitFreedBytes uint64 // bytes given back because their process exited
}

// Usage reads the usage map.
func (p *Probes) Usage() (map[Key]Usage, error) {
	out := map[Key]Usage{}
	var k gpuwardenUsageKey
	var v gpuwardenUsageVal
	it := p.objs.Usage.Iterate()
	for it.Next(&k, &v) {
		out[Key{k.Cgroup, k.Device}] = Usage{
			Bytes: v.Bytes, Allocs: v.Allocs, Frees: v.Frees, AllocFailures: v.AllocFailures,
			CtxCreated: v.CtxCreated, CtxDestroyed: v.CtxDestroyed, ExitFreedBytes: v.ExitFreedBytes,
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read usage map: %w", err)
	}
	return out, nil
}

// Launches reads the launches counted while the sampling launch probes were
// attached.
func (p *Probes) Launches() (map[Key]uint64, error) {
	return readLaunches(p.objs.Launches, "launches")
}

// ExactLaunchCounts reads the launches counted by the exact probe (AttachExact)
// per (cgroup, device), since these probes were loaded.
func (p *Probes) ExactLaunchCounts() (map[Key]uint64, error) {
	return readLaunches(p.objs.LaunchesExact, "launches_exact")
}

func readLaunches(m *ebpf.Map, name string) (map[Key]uint64, error) {
	out := map[Key]uint64{}
	var k gpuwardenUsageKey
	var v gpuwardenLaunchVal
	it := m.Iterate()
	for it.Next(&k, &v) {
		out[Key{k.Cgroup, k.Device}] = v.Count
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read %s map: %w", name, err)
	}
	return out, nil
}

// Stats are the programs' own counters, summed over CPUs.
type Stats struct {
	Events         uint64 // probe hits of every kind
	LostEvents     uint64 // failed-allocation events dropped: ring buffer full
	UntrackedFrees uint64 // successful frees of allocations made before the probes saw them
	TableFull      uint64 // allocations not recorded: the pointer table was full
	UnknownDevice  uint64 // allocations charged to DeviceUnknown
	Exits          uint64 // exits of processes that held allocation or context state
}

// Stats reads the stats map.
func (p *Probes) Stats() (Stats, error) {
	read := func(i gpuwardenGwStat) (uint64, error) {
		var per []uint64
		if err := p.objs.Stats.Lookup(uint32(i), &per); err != nil {
			return 0, fmt.Errorf("read stats map: %w", err)
		}
		var sum uint64
		for _, v := range per {
			sum += v
		}
		return sum, nil
	}
	var s Stats
	var err error
	for _, f := range []struct {
		i   gpuwardenGwStat
		dst *uint64
	}{
		{gpuwardenGwStatGW_STAT_EVENTS, &s.Events},
		{gpuwardenGwStatGW_STAT_LOST_EVENTS, &s.LostEvents},
		{gpuwardenGwStatGW_STAT_UNTRACKED_FREES, &s.UntrackedFrees},
		{gpuwardenGwStatGW_STAT_TABLE_FULL, &s.TableFull},
		{gpuwardenGwStatGW_STAT_UNKNOWN_DEVICE, &s.UnknownDevice},
		{gpuwardenGwStatGW_STAT_EXITS, &s.Exits},
	} {
		if *f.dst, err = read(f.i); err != nil {
			return Stats{}, err
		}
	}
	return s, nil
}

// Processes lists the processes (tgids) the programs hold state for.
func (p *Probes) Processes() ([]uint32, error) {
	var tgids []uint32
	var k uint32
	var v gpuwardenProcVal
	it := p.objs.Procs.Iterate()
	for it.Next(&k, &v) {
		tgids = append(tgids, k)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read procs map: %w", err)
	}
	return tgids, nil
}

// Reap gives back what a dead process held, as its exit would have: for a
// process that died while no program watched (the agent was down).
func (p *Probes) Reap(tgid uint32) error {
	if _, err := p.objs.Reap.Run(&ebpf.RunOptions{Context: [1]uint64{uint64(tgid)}}); err != nil {
		return fmt.Errorf("reap process %d: %w", tgid, err)
	}
	return nil
}

// CollectGarbage removes table entries of processes that are gone (their
// exit gave their bytes back already; the entries only take room): pointer
// and handle entries, memory pools and primary contexts. It returns how many
// entries it removed.
func (p *Probes) CollectGarbage() (int, error) {
	// seq looks the process up at decision time, not from an earlier list,
	// so a process that appeared since is never taken for a dead one.
	seq := func(tgid uint32) (uint64, bool) {
		var pv gpuwardenProcVal
		err := p.objs.Procs.Lookup(tgid, &pv)
		return pv.Seq, err == nil
	}
	dead := func(tgid uint32) bool { _, ok := seq(tgid); return !ok }
	allocs, err1 := sweep(p.objs.Allocs, func(k gpuwardenAllocKey, v gpuwardenAllocVal) bool {
		s, ok := seq(k.Tgid)
		return !ok || s != v.Seq // gone, or an earlier process with its pid
	})
	pools, err2 := sweep(p.objs.Pools, func(k gpuwardenCtxKey, _ gpuwardenPoolVal) bool { return dead(k.Tgid) })
	prims, err3 := sweep(p.objs.Primaries, func(k gpuwardenPrimKey, _ uint64) bool { return dead(k.Tgid) })
	removed := allocs + pools + prims
	if err := errors.Join(err1, err2, err3); err != nil {
		return removed, fmt.Errorf("collect garbage: %w", err)
	}
	return removed, nil
}

// sweep deletes the entries of m that stale says are stale, after the
// iteration (deleting while iterating would restart it), and returns how
// many it deleted.
func sweep[K, V any](m *ebpf.Map, stale func(K, V) bool) (int, error) {
	var k K
	var v V
	var keys []K
	it := m.Iterate()
	for it.Next(&k, &v) {
		if stale(k, v) {
			keys = append(keys, k)
		}
	}
	removed := 0
	for _, k := range keys {
		if m.Delete(k) == nil {
			removed++
		}
	}
	return removed, it.Err()
}

// TrackedAllocations counts the pointer and handle entries of a process,
// or of all with tgid 0 (for tests, and the table's fill level).
func (p *Probes) TrackedAllocations(tgid uint32) (int, error) {
	n := 0
	var k gpuwardenAllocKey
	var v gpuwardenAllocVal
	it := p.objs.Allocs.Iterate()
	for it.Next(&k, &v) {
		if tgid == 0 || k.Tgid == tgid {
			n++
		}
	}
	return n, it.Err()
}
