package observe

import (
	"fmt"
	"sort"
	"time"

	"github.com/gpuwarden/gpuwarden/bpf/probes"
)

// Snapshot is the eBPF view at one moment. See bpf/README.md for how exact
// each figure is.
type Snapshot struct {
	Time      time.Time
	Usage     []Usage // one per (cgroup, device) seen, by cgroup then device
	Launch    LaunchSampling
	Probes    ProbeStats
	Libraries []Library
}

// Usage is one (cgroup, device)'s figures. Counters count since the pinned
// maps were made, so they carry on across agent restarts.
type Usage struct {
	Cgroup uint64 // cgroup v2 id (the inode of the cgroup's directory)
	Device int    // CUDA device ordinal; -1: unknown (no context of the caller was seen)

	Bytes             int64  // bytes allocated now (exact for calls the probes saw)
	Allocs            uint64 // successful allocations
	Frees             uint64 // successful frees
	AllocFailures     uint64 // allocations the driver refused
	ExitFreedBytes    uint64 // bytes given back because their process exited
	ContextsCreated   uint64
	ContextsDestroyed uint64

	LaunchesObserved  uint64  // launches counted: every one of processes counted exactly, the others' while the sampling probes were attached
	LaunchesExact     uint64  // of those, launches of processes counted exactly, since this observer started
	LaunchRate        float64 // launches/s: over the last period for processes counted exactly, in the last window for the others
	LaunchesEstimated float64 // launches since this observer started: exact counts, plus sampled ones extrapolated by the duty cycle
}

// LaunchSampling says how launches were sampled.
type LaunchSampling struct {
	Window, Period  time.Duration
	DutyCycle       float64 // configured share of time attached (Window/Period)
	ObservedSeconds float64 // time the probes were attached since this observer started
	ElapsedSeconds  float64 // time since this observer started
	Windows         uint64  // windows completed
	LastWindowEnd   time.Time
	// ExactProcesses is how many processes have their launches counted
	// exactly now (those that map libcuda and keep no ledger).
	ExactProcesses int
}

// ProbeStats are the probes' own counters (for gpuwarden_agent_probe_*).
type ProbeStats struct {
	Events         uint64 // probe hits of every kind
	LostEvents     uint64 // failed-allocation events dropped (ring buffer full, or reader too slow)
	UntrackedFrees uint64 // frees of allocations made before the probes saw them
	TableFull      uint64 // allocations not tracked: pointer table full
	UnknownDevice  uint64 // allocations charged to device -1
	Exits          uint64 // process exits that gave memory or contexts back
}

// Snapshot reads the maps.
func (o *Observer) Snapshot() (Snapshot, error) {
	now := time.Now()
	usage, err := o.probes.Usage()
	if err != nil {
		return Snapshot{}, fmt.Errorf("snapshot: %w", err)
	}
	launches, err := o.probes.Launches()
	if err != nil {
		return Snapshot{}, fmt.Errorf("snapshot: %w", err)
	}
	exact, err := o.probes.ExactLaunchCounts()
	if err != nil {
		return Snapshot{}, fmt.Errorf("snapshot: %w", err)
	}
	st, err := o.probes.Stats()
	if err != nil {
		return Snapshot{}, fmt.Errorf("snapshot: %w", err)
	}

	l := &o.launch
	l.mu.Lock()
	sampling := LaunchSampling{
		Window: o.cfg.LaunchWindow, Period: o.cfg.LaunchPeriod, DutyCycle: o.cfg.DutyCycle(),
		ObservedSeconds: l.observed.Seconds(), ElapsedSeconds: now.Sub(l.start).Seconds(),
		Windows: l.windows, LastWindowEnd: l.lastEnd, ExactProcesses: int(o.exactProcs.Load()),
	}
	rates, exactRates := l.rates, l.exactRates
	baseline, exactBase := l.baseline, l.exactBase
	l.mu.Unlock()
	if l.always {
		sampling.ObservedSeconds = sampling.ElapsedSeconds
	}

	keys := map[probes.Key]bool{}
	for k := range usage {
		keys[k] = true
	}
	for k := range launches {
		keys[k] = true
	}
	for k := range exact {
		keys[k] = true
	}
	s := Snapshot{
		Time: now, Launch: sampling, Libraries: o.Libraries(),
		Probes: ProbeStats{
			Events: st.Events, LostEvents: st.LostEvents + o.drops.Load(), UntrackedFrees: st.UntrackedFrees,
			TableFull: st.TableFull, UnknownDevice: st.UnknownDevice, Exits: st.Exits,
		},
	}
	for k := range keys {
		u := usage[k]
		dev := int(k.Device)
		if k.Device == probes.DeviceUnknown {
			dev = -1
		}
		e := Usage{
			Cgroup: k.Cgroup, Device: dev,
			Bytes: u.Bytes, Allocs: u.Allocs, Frees: u.Frees, AllocFailures: u.AllocFailures,
			ExitFreedBytes: u.ExitFreedBytes, ContextsCreated: u.CtxCreated, ContextsDestroyed: u.CtxDestroyed,
			LaunchesObserved: launches[k] + exact[k], LaunchRate: rates[k] + exactRates[k],
		}
		if sampling.ObservedSeconds > 0 && launches[k] >= baseline[k] {
			e.LaunchesEstimated = float64(launches[k]-baseline[k]) * sampling.ElapsedSeconds / sampling.ObservedSeconds
		}
		if exact[k] >= exactBase[k] {
			e.LaunchesExact = exact[k] - exactBase[k]
			e.LaunchesEstimated += float64(e.LaunchesExact)
		}
		s.Usage = append(s.Usage, e)
	}
	sort.Slice(s.Usage, func(i, j int) bool {
		a, b := s.Usage[i], s.Usage[j]
		if a.Cgroup != b.Cgroup {
			return a.Cgroup < b.Cgroup
		}
		return a.Device < b.Device
	})
	return s, nil
}

// Find returns the usage of one (cgroup, device), zero if none was seen.
func (s Snapshot) Find(cgroup uint64, device int) Usage {
	for _, u := range s.Usage {
		if u.Cgroup == cgroup && u.Device == device {
			return u
		}
	}
	return Usage{Cgroup: cgroup, Device: device}
}
