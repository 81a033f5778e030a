package collector

import (
	"context"
	"os"
	"path/filepath"
	"time"

	"github.com/gpuwarden/gpuwarden/bpf/observe"
	"github.com/gpuwarden/gpuwarden/collector/cgroups"
	"github.com/gpuwarden/gpuwarden/collector/claims"
	"github.com/gpuwarden/gpuwarden/collector/nvmldev"
	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
)

// joiner accumulates one view's per-container entries.
type joiner struct {
	c        *Collector
	live     map[uint64]bool // cgroups whose ledgers were read this time
	v        *View
	entries  map[Key]*ContainerDevice
	uuids    map[int]string
	labels   LabelFunc
	procs    map[Key][]gpuProc // the processes NVML lists, by cgroup and device
	held     map[Key]float64   // shares the scheduler holds containers to (Sources.Held)
	seenPIDs map[int]gpuProc   // identified this time, kept for the next view
}

func (j *joiner) entry(cg uint64, gpu int) *ContainerDevice {
	k := Key{cg, gpu}
	if e, ok := j.entries[k]; ok {
		return e
	}
	e := &ContainerDevice{Node: j.c.node, GPU: gpu, UUID: j.uuids[gpu], CgroupID: cg}
	j.entries[k] = e
	return e
}

func (j *joiner) source(name string, err error) bool {
	s := SourceState{Name: name, OK: err == nil}
	if err != nil {
		s.Error = err.Error()
		j.c.log.Warn("source failed", "source", name, "err", err)
	}
	j.v.Sources = append(j.v.Sources, s)
	return err == nil
}

func (c *Collector) build(ctx context.Context) *View {
	j := &joiner{c: c, v: &View{Node: c.node, Time: time.Now()}, entries: map[Key]*ContainerDevice{},
		uuids: map[int]string{}, live: map[uint64]bool{}, procs: map[Key][]gpuProc{}, seenPIDs: map[int]gpuProc{}}
	var devs []nvmldev.Device
	if c.src.NVML != nil {
		var err error
		devs, err = c.src.NVML()
		if j.source("nvml", err) {
			for _, d := range devs {
				j.uuids[d.Index] = d.UUID
				j.v.Devices = append(j.v.Devices, Device{Node: c.node, Index: d.Index, UUID: d.UUID, Name: d.Name,
					MemoryTotalBytes: d.MemoryTotalBytes, MemoryUsedBytes: d.MemoryUsedBytes, Utilization: d.Utilization})
			}
		}
	}
	if c.src.Labels != nil {
		var err error
		j.labels, err = c.src.Labels(ctx)
		if j.source("kubelet", err) {
			c.labels.Store(&j.labels)
		}
	}
	ledgers, rejected := j.readLedgers()
	if c.src.EBPF != nil {
		snap, err := c.src.EBPF()
		if j.source("ebpf", err) {
			j.addEBPF(snap)
		}
	}
	j.addNVML(devs)
	j.finish(ledgers, rejected)
	return j.v
}

// ledger is one container's interposer ledger, as read this time.
type ledger struct {
	dir     string
	usage   *controlblock.UsageSnapshot
	limits  *controlblock.LimitsConfig
	refused error // why its cgroup claim was refused
}

// readLedgers reads every <controlDir>/<key>/usage. Ledgers are untrusted
// (containers write them): one that cannot be read is logged and skipped,
// one whose cgroup claim is refused is returned apart, so the processes
// that keep it can be found.
func (j *joiner) readLedgers() (out map[uint64]*ledger, rejected []*ledger) {
	out = map[uint64]*ledger{}
	if j.c.src.ControlDir == "" {
		return out, nil
	}
	dirs, err := os.ReadDir(j.c.src.ControlDir)
	if os.IsNotExist(err) {
		err = nil // no container has run under the interposer yet
	}
	if !j.source("ledger", err) {
		return out, nil
	}
	seen := map[string]bool{}
	defer j.c.ledgers.keep(seen)
	defer j.c.judge.keepLedgers(seen)
	for _, d := range dirs {
		if !d.IsDir() {
			continue
		}
		seen[d.Name()] = true
		l, err := j.c.ledgers.read(j.c.src.ControlDir, d.Name())
		if err != nil {
			j.c.log.Debug("skipping ledger", "dir", d.Name(), "err", err)
			continue
		}
		if j.c.src.Claims == nil {
			continue
		}
		if _, err := j.c.src.Claims.Verify(d.Name(), l.usage, j.assigned()); err != nil {
			j.c.log.Debug("ledger's cgroup claim refused", "dir", d.Name(), "cgroup", l.usage.CgroupID, "err", err)
			l.refused = err
			rejected = append(rejected, l)
			continue
		}
		if out[l.usage.CgroupID] != nil {
			j.c.log.Warn("two ledgers vouch for one cgroup; the second is ignored", "dir", d.Name(), "cgroup", l.usage.CgroupID)
			continue
		}
		out[l.usage.CgroupID] = l
		j.c.judge.rewound(d.Name(), l.usage.CgroupID, l.usage, j.v.Time)
	}
	return out, rejected
}

// assigned is the kubelet's word on a directory, for claims.Verify.
func (j *joiner) assigned() claims.Assigned {
	if j.labels == nil {
		return nil
	}
	return assignedBy(j.labels)
}

func assignedBy(labels LabelFunc) claims.Assigned {
	return func(dir, path string) bool {
		_, _, _, ok := labels(dir, path)
		return ok
	}
}

func (j *joiner) addEBPF(s observe.Snapshot) {
	j.v.probesOn = true
	j.v.probeEvents, j.v.probeLost = s.Probes.Events, s.Probes.LostEvents
	for _, u := range s.Usage {
		if u.Device < 0 {
			continue // no context of the caller was seen: no device to charge
		}
		active := u.Bytes > 0 || u.LaunchRate > 0 || u.ContextsCreated > u.ContextsDestroyed
		e, seen := j.entries[Key{u.Cgroup, u.Device}]
		if !seen && !active && u.AllocFailures == 0 {
			continue // a container that used the GPU once and is idle now
		}
		if !seen {
			e = j.entry(u.Cgroup, u.Device)
		}
		if u.Bytes > 0 {
			e.MemoryUsedBytes, e.MemorySource = uint64(u.Bytes), "ebpf"
		}
		e.AllocFailuresDevice = u.AllocFailures
		e.Launches = u.LaunchesEstimated
		e.Unenforced = active // cleared in finish for containers with a ledger
	}
}

func (j *joiner) addNVML(devs []nvmldev.Device) {
	for _, d := range devs {
		for _, p := range d.Processes {
			path, err := cgroups.OfProcess(j.c.src.ProcRoot, int(p.PID))
			if err != nil || j.c.src.Cgroups == nil {
				continue // gone, or in a pid namespace we cannot see
			}
			path = cgroups.HostPath(j.c.src.CgroupNSRoot, path)
			cg, err := j.c.src.Cgroups.ID(path)
			if err != nil {
				continue
			}
			e := j.entry(cg, d.Index)
			j.procs[Key{cg, d.Index}] = append(j.procs[Key{cg, d.Index}], j.identify(int(p.PID)))
			e.CgroupPath = path
			e.ComputeShare += p.Utilization
			e.PIDs = append(e.PIDs, int(p.PID))
			if e.MemorySource != "ebpf" {
				e.MemoryUsedBytes += p.MemoryBytes
				e.MemorySource = "nvml"
			}
			e.Unenforced = true // cleared in finish for containers with a ledger
		}
	}
}

// identify tells a GPU process's pid in its namespace and start time, read
// once while NVML keeps listing the pid. A pid reused meanwhile keeps the
// old identity until it drops out of the list: at worst a process judged
// by its predecessor's slot; a kill checks the start time again.
func (j *joiner) identify(pid int) gpuProc {
	p, ok := j.c.procIDs[pid]
	if !ok {
		id, err := claims.Identify(j.c.src.ProcRoot, pid)
		p = gpuProc{hostPID: pid, id: id, ok: err == nil}
	}
	j.seenPIDs[pid] = p
	return p
}

// finish merges the ledgers, names every container and fills the view.
func (j *joiner) finish(ledgers map[uint64]*ledger, rejected []*ledger) {
	for cg, l := range ledgers {
		j.addLedger(cg, l)
	}
	if j.c.src.Held != nil {
		j.held = j.c.src.Held()
	}
	if j.c.src.Rewinds != nil {
		j.c.judge.enforcerRewinds(j.c.src.Rewinds(), j.v.Time)
	}
	j.judgeAll(ledgers, rejected, j.v.Time)
	var targets map[Key]float64
	if j.c.src.Targets != nil {
		targets = j.c.src.Targets()
	}
	for k, e := range j.entries {
		if e.CgroupPath == "" && j.c.src.Cgroups != nil {
			e.CgroupPath, _ = j.c.src.Cgroups.Path(k.Cgroup)
		}
		l := ledgers[k.Cgroup]
		dir := ""
		if l != nil {
			dir = l.dir
		}
		e.Namespace, e.Pod, e.Container = j.name(dir, e.CgroupPath)
		if t, ok := targets[k]; ok {
			e.ComputeLimit = t
		}
		if e.ComputeShare > 1 {
			e.ComputeShare = 1
		}
		if l != nil {
			e.LaunchesExact = true
		}
		j.v.Containers = append(j.v.Containers, *e)
	}
	for cg := range j.c.totals {
		if !j.live[cg] {
			delete(j.c.totals, cg) // the container is gone, and its series with it
		}
	}
	j.c.procIDs = j.seenPIDs
	j.v.sort()
}

// addLedger adds what the interposer knows, on every device the container
// holds memory on (its context reserve included) or has a quota for.
func (j *joiner) addLedger(cg uint64, l *ledger) {
	u := l.usage
	primary := -1
	for d := 0; d < u.NDev && d < controlblock.MaxDevices; d++ {
		limit := uint64(0)
		if l.limits != nil {
			limit = l.limits.MemLimit[d]
		} else if u.ClaimMemorySet {
			limit = u.ClaimMemLimit[d]
		}
		e, seen := j.entries[Key{cg, d}]
		if !seen && u.ReservedBytes[d] == 0 && u.LaunchesIssued[d] == 0 {
			continue
		}
		if !seen {
			e = j.entry(cg, d)
		}
		if primary < 0 {
			primary = d
		}
		e.Enforced, e.Unenforced = true, false
		e.HighPriority = u.ClaimPriority == controlblock.PriorityHigh
		e.MemoryLimitBytes = limit
		e.LedgerBytes = u.ReservedBytes[d]
		if e.MemorySource == "" {
			e.MemoryUsedBytes, e.MemorySource = u.ReservedBytes[d], "ledger"
		}
		e.AllocFailuresQuota = u.AllocFailures[d]
		if u.ClaimComputeLimit > 0 {
			e.ComputeLimit = float64(u.ClaimComputeLimit) / 100
		}
	}
	if primary < 0 {
		return
	}
	// Per-process figures have no device: they go to the first device the
	// container uses (documented).
	e := j.entries[Key{cg, primary}]
	for _, p := range u.Procs {
		if !containsPID(e.PIDs, int(p.Pid)) {
			e.PIDs = append(e.PIDs, int(p.Pid))
		}
	}
	tot := j.c.totals[cg]
	if tot == nil {
		tot = &controlblock.ProcTotals{}
		j.c.totals[cg] = tot
	}
	tot.Update(u.Procs)
	j.live[cg] = true
	e.Launches, e.ThrottledSeconds = float64(tot.Launches), float64(tot.ThrottledNs)/1e9
}

func containsPID(pids []int, pid int) bool {
	for _, p := range pids {
		if p == pid {
			return true
		}
	}
	return false
}

// name labels a container: from the labeller (Kubernetes), else from what
// its cgroup path says (pod uid, container id), else by the path itself.
func (j *joiner) name(dir, path string) (ns, pod, container string) {
	if j.labels != nil {
		if ns, pod, container, ok := j.labels(dir, path); ok {
			return ns, pod, container
		}
	}
	c := cgroups.ParsePath(path)
	if c.ContainerID != "" {
		return "", c.PodUID, c.ContainerID[:12]
	}
	if path == "" {
		path = filepath.Join("cgroup", "unknown")
	}
	return "", c.PodUID, path
}
