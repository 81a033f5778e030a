package collector

import (
	"path/filepath"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/agentapi"
	"github.com/gpuwarden/gpuwarden/enforcer/hostcgroup"

	"github.com/gpuwarden/gpuwarden/bpf/observe"
	"github.com/gpuwarden/gpuwarden/collector/cgroups"
	"github.com/gpuwarden/gpuwarden/collector/ledgertrust"
	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
	"github.com/gpuwarden/gpuwarden/enforcer/membership"
	"github.com/gpuwarden/gpuwarden/enforcer/nvmldev"
)

// joiner accumulates one view's per-container entries.
type joiner struct {
	c         *Collector
	live      map[uint64]bool // cgroups whose ledgers were read this time
	v         *View
	entries   map[Key]*agentapi.ContainerDevice
	uuids     map[int]string // by NVML index
	index     map[string]int // NVML index by UUID
	node      []string       // the node's GPUs by index; nil: NVML not read
	labels    LabelFunc
	procs     map[Key][]gpuProc       // the processes NVML lists, by cgroup and device
	ordinals  map[Key]int             // the CUDA ordinal of each entry a ledger covers
	nvmlGPUs  map[uint64]map[int]bool // the GPUs NVML lists each container's processes on
	nvmlMem   map[Key]uint64          // the memory NVML shows for each container's processes
	held      map[Key]float64         // shares the scheduler holds containers to (membership.Scheduled.Held)
	meanShare map[Key]float64         // NVML's share over the last minute, where it covers one (judge.meanShare)
	seenPIDs  map[int]gpuProc         // identified this time, kept for the next view
}

// newJoiner starts joining the view of time t, every map made.
func (c *Collector) newJoiner(t time.Time) *joiner {
	return &joiner{c: c, v: &View{Node: c.node, Time: t}, entries: map[Key]*agentapi.ContainerDevice{},
		uuids: map[int]string{}, index: map[string]int{}, live: map[uint64]bool{}, procs: map[Key][]gpuProc{}, ordinals: map[Key]int{}, nvmlGPUs: map[uint64]map[int]bool{}, nvmlMem: map[Key]uint64{},
		seenPIDs: map[int]gpuProc{}}
}

func (j *joiner) entry(cg uint64, gpu int) *agentapi.ContainerDevice {
	k := Key{cg, gpu}
	if e, ok := j.entries[k]; ok {
		return e
	}
	e := &agentapi.ContainerDevice{Node: j.c.node, GPU: gpu, UUID: j.uuids[gpu], CgroupID: cg}
	j.entries[k] = e
	return e
}

func (j *joiner) source(name string, err error) bool {
	s := agentapi.SourceState{Name: name, OK: err == nil}
	if err != nil {
		s.Error = err.Error()
		j.c.log.Warn("source failed", "source", name, "err", err)
	}
	j.v.Sources = append(j.v.Sources, s)
	return err == nil
}

// join makes a view of what read read.
func (c *Collector) join(in *inputs) *View {
	j := c.newJoiner(in.time)
	if c.src.NVML != nil && j.source("nvml", in.nvmlErr) {
		for _, d := range in.devs {
			j.uuids[d.Index], j.index[d.UUID] = d.UUID, d.Index
			j.node = append(j.node, d.UUID)
			j.v.Devices = append(j.v.Devices, agentapi.Device{Node: c.node, Index: d.Index, UUID: d.UUID, Name: d.Name,
				MemoryTotalBytes: d.MemoryTotalBytes, MemoryUsedBytes: d.MemoryUsedBytes, Utilization: d.Utilization})
		}
	}
	if c.src.Labels != nil && j.source("kubelet", in.labelsErr) {
		j.labels = in.labels
	}
	ledgers, rejected := j.verifyLedgers(in)
	c.keepSlots(ledgers)
	j.addNVML(in.devs) // first: where NVML lists a container tells eBPF's ordinals apart
	if c.src.EBPF != nil && j.source("ebpf", in.ebpfErr) {
		j.addEBPF(in.ebpf, ledgers)
	}
	j.finish(ledgers, rejected, in.sched)
	return j.v
}

// ledger is one container's interposer ledger, as read this time.
type ledger struct {
	dir     string
	usage   *controlblock.UsageSnapshot
	limits  *controlblock.LimitsConfig
	file    controlblock.FileID
	refused error // why its cgroup claim was refused
	// gpus is the GPU (NVML index) of each of the container's CUDA
	// ordinals; NoGPU where its UUID is not known.
	gpus  [controlblock.MaxDevices]int
	uuids [controlblock.MaxDevices]string
}

// place maps a ledger's CUDA ordinals to the node's GPUs by the UUIDs it
// records (controlblock's rule); without NVML the index is the ordinal. A
// container using a GPU of unknown UUID is logged once.
func (j *joiner) place(l *ledger) {
	u := l.usage
	uuids := u.GPUs(j.node)
	var unknown []int
	for d := range l.gpus {
		l.uuids[d] = uuids[d]
		switch {
		case uuids[d] == "":
			l.gpus[d] = NoGPU
			if u.ReservedBytes[d] > 0 || u.LaunchesIssued[d] > 0 {
				unknown = append(unknown, d)
			}
		case j.node == nil:
			l.gpus[d] = d
		default:
			l.gpus[d] = j.index[uuids[d]]
		}
	}
	if len(unknown) > 0 && !j.c.unmapped[l.dir] {
		j.c.log.Warn("container's GPUs of unknown UUID reported without a device (gpu -1): its ledger records none (an old interposer?)",
			"dir", l.dir, "ordinals", unknown)
	}
	j.c.unmapped[l.dir] = len(unknown) > 0
}

// gpuOf is the GPU (NVML index) of a CUDA ordinal of container cg, by its
// ledger. Without one, only a node of one GPU, or NVML listing the
// container's processes on one GPU alone, names it.
func (j *joiner) gpuOf(cg uint64, l *ledger, ordinal int) int {
	if l != nil {
		return l.gpus[ordinal]
	}
	if j.node == nil {
		return ordinal
	}
	if u := (&controlblock.UsageSnapshot{}).GPUs(j.node)[ordinal]; u != "" {
		return j.index[u]
	}
	if gpus := j.nvmlGPUs[cg]; len(gpus) == 1 {
		for g := range gpus {
			return g
		}
	}
	return NoGPU
}

// verifyLedgers places the ledgers read and checks their cgroup claims.
// Ledgers are untrusted (containers write them): one that could not be
// read was logged and is skipped, one whose cgroup claim is refused is
// returned apart, so the processes that keep it can be found.
func (j *joiner) verifyLedgers(in *inputs) (out map[uint64]*ledger, rejected []*ledger) {
	out = map[uint64]*ledger{}
	if j.c.src.ControlDir == "" || !j.source("ledger", in.dirsErr) { // none: no container has run under the interposer yet
		return out, nil
	}
	seen := map[string]bool{}
	defer j.c.judge.keepLedgers(seen)
	if j.c.src.Claims != nil {
		defer j.c.src.Claims.Forget(seen)
	}
	defer func() {
		for dir := range j.c.unmapped {
			if !seen[dir] {
				delete(j.c.unmapped, dir)
			}
		}
	}()
	for _, r := range in.ledgers {
		seen[r.dir] = true
		l := r.l
		if l == nil {
			continue
		}
		j.place(l)
		if j.c.src.Claims == nil {
			continue
		}
		if _, err := j.c.src.Claims.Verify(l.dir, l.usage, j.assigned()); err != nil {
			l.refused = err
			rejected = append(rejected, l)
			continue
		}
		if out[l.usage.CgroupID] != nil {
			j.c.log.Warn("two ledgers vouch for one cgroup; the second is ignored", "dir", l.dir, "cgroup", l.usage.CgroupID)
			continue
		}
		out[l.usage.CgroupID] = l
		j.c.judge.rewound(l, j.v.Time)
	}
	return out, rejected
}

// assigned is the kubelet's word on a directory, for ledgertrust.Verify.
func (j *joiner) assigned() ledgertrust.Assigned {
	if j.labels == nil {
		return nil
	}
	return assignedBy(j.labels)
}

func assignedBy(labels LabelFunc) ledgertrust.Assigned {
	return func(dir, path string) bool {
		_, _, _, ok := labels(dir, path)
		return ok
	}
}

// addEBPF adds what the probes saw, by the caller's CUDA ordinal, on the
// GPU its container's ledger names for that ordinal.
func (j *joiner) addEBPF(s observe.Snapshot, ledgers map[uint64]*ledger) {
	j.v.probesOn = true
	j.v.probeEvents, j.v.probeLost = s.Probes.Events, s.Probes.LostEvents
	for _, u := range s.Usage {
		if u.Device < 0 || u.Device >= controlblock.MaxDevices {
			continue // no context of the caller was seen: no device to charge
		}
		gpu := j.gpuOf(u.Cgroup, ledgers[u.Cgroup], u.Device)
		active := u.Bytes > 0 || u.LaunchRate > 0 || u.ContextsCreated > u.ContextsDestroyed
		e, seen := j.entries[Key{u.Cgroup, gpu}]
		if !seen && !active && u.AllocFailures == 0 {
			continue // a container that used the GPU once and is idle now
		}
		if !seen {
			e = j.entry(u.Cgroup, gpu)
		}
		if u.Bytes > 0 {
			if e.MemorySource != "ebpf" {
				e.MemoryUsedBytes = 0 // eBPF's figure, to the byte, replaces NVML's
			}
			e.MemoryUsedBytes, e.MemorySource = e.MemoryUsedBytes+uint64(u.Bytes), "ebpf"
		}
		e.AllocFailuresDevice += u.AllocFailures
		e.Launches += u.LaunchesEstimated
		e.Unenforced = e.Unenforced || active // cleared in finish for containers with a ledger
	}
}

func (j *joiner) addNVML(devs []nvmldev.Device) {
	for _, d := range devs {
		for _, p := range d.Processes {
			path, err := hostcgroup.Of(j.c.src.ProcRoot, int(p.PID))
			if err != nil || j.c.src.Cgroups == nil {
				continue // gone, or in a pid namespace we cannot see
			}
			path = hostcgroup.HostPath(j.c.src.CgroupNSRoot, path)
			cg, err := j.c.src.Cgroups.ID(path)
			if err != nil {
				continue
			}
			e := j.entry(cg, d.Index)
			if j.nvmlGPUs[cg] == nil {
				j.nvmlGPUs[cg] = map[int]bool{}
			}
			j.nvmlGPUs[cg][d.Index] = true
			j.procs[Key{cg, d.Index}] = append(j.procs[Key{cg, d.Index}], j.identify(int(p.PID)))
			e.CgroupPath = path
			e.ComputeShare += p.Utilization
			e.PIDs = append(e.PIDs, int(p.PID))
			j.nvmlMem[Key{cg, d.Index}] += p.MemoryBytes
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
		id, err := ledgertrust.Identify(j.c.src.ProcRoot, pid)
		p = gpuProc{hostPID: pid, id: id, ok: err == nil}
	}
	j.seenPIDs[pid] = p
	return p
}

// finish merges the ledgers and what the enforcer holds containers to,
// names every container and fills the view.
func (j *joiner) finish(ledgers map[uint64]*ledger, rejected []*ledger, scheduled map[membership.GPUKey]membership.Scheduled) {
	for cg, l := range ledgers {
		j.addLedger(cg, l)
	}
	sched := byIndex(j, scheduled)
	j.held = map[Key]float64{}
	rewinds := make(map[Key]uint64, len(sched))
	for k, s := range sched {
		if s.Held {
			j.held[k] = s.Target
		}
		rewinds[k] = s.Rewinds
	}
	if j.c.src.Scheduling != nil {
		j.c.judge.enforcerRewinds(rewinds, j.v.Time)
	}
	j.showLarger()
	j.judgeAll(ledgers, rejected, j.v.Time)
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
		s := sched[k]
		if s.Target > 0 {
			e.ComputeLimit, e.Scheduled = s.Target, true
		}
		e.ScheduledShare, e.ScheduledSeconds = s.Achieved, s.Charged
		if e.ComputeShare > 1 {
			e.ComputeShare = 1
		}
		if l != nil {
			e.LaunchesExact = true
		}
		j.v.Containers = append(j.v.Containers, *e)
	}
	for k := range j.c.totals {
		if !j.live[k.Cgroup] {
			delete(j.c.totals, k) // the container is gone, and its series with it
		}
	}
	j.c.procIDs = j.seenPIDs
	j.v.sort()
}

// addLedger adds what the interposer knows, on every GPU the container
// holds memory on (its context reserve included) or has launched on while
// it had a gate; GPUs of unknown UUID are summed on NoGPU. Launches and
// throttled time are counted per device where the interposer knew the
// device (ledgers of minor 1: every launch made while the container has a
// gate, and every wait); the rest, and all of an older ledger's, go to the
// GPU each process holds memory on, so a process on several GPUs has them
// on its first. The per-device counters are the container's to rewrite: one
// that goes back makes the series go back, a counter reset to Prometheus.
func (j *joiner) addLedger(cg uint64, l *ledger) {
	u := l.usage
	first := -1 // ordinal
	for d := 0; d < u.NDev && d < controlblock.MaxDevices; d++ {
		k := Key{cg, l.gpus[d]}
		e, seen := j.entries[k]
		if !seen && u.ReservedBytes[d] == 0 && u.LaunchesIssued[d] == 0 && u.LaunchesDev[d] == 0 {
			continue
		}
		if !seen {
			e = j.entry(cg, k.GPU)
		}
		if e.UUID == "" {
			e.UUID = l.uuids[d]
		}
		if first < 0 {
			first = d
		}
		j.ordinals[k] = d
		e.Enforced, e.Unenforced = true, false
		e.HighPriority = u.ClaimPriority == controlblock.PriorityHigh
		if k.GPU != NoGPU { // a quota is per device; summed ones mean nothing
			if quota, ok := controlblock.MemoryLimits(l.limits, u); ok {
				e.MemoryLimitBytes = quota[d]
			}
		}
		e.LedgerBytes += u.ReservedBytes[d]
		if e.MemorySource == "" || e.MemorySource == "ledger" {
			e.MemoryUsedBytes, e.MemorySource = e.LedgerBytes, "ledger"
		}
		e.AllocFailuresQuota += u.AllocFailures[d]
		if u.ClaimComputeLimit > 0 {
			e.ComputeLimit = float64(u.ClaimComputeLimit) / 100
		}
	}
	if first < 0 {
		return
	}
	j.entries[Key{cg, l.gpus[first]}].DeviceMismatches = u.DevMismatches
	procs := map[Key][]controlblock.ProcUsage{}
	for _, p := range u.Procs {
		p = unplaced(p)
		k := Key{cg, l.gpus[first]}
		for d, b := range p.Bytes {
			if o, ok := j.ordinals[Key{cg, l.gpus[d]}]; b > 0 && ok && o == d {
				k = Key{cg, l.gpus[d]}
				break
			}
		}
		procs[k] = append(procs[k], p) // its pid is listed where NVML places it in the cgroup: a slot's is the container's word
	}
	launches, throttledNs := map[Key]float64{}, map[Key]float64{} // exact: they replace eBPF's estimates
	for d := 0; d < u.NDev && d < controlblock.MaxDevices; d++ {
		k := Key{cg, l.gpus[d]}
		o, ok := j.ordinals[k]
		if !ok {
			continue // not used
		}
		launches[k] += float64(u.LaunchesDev[d])
		throttledNs[k] += float64(u.ThrottledNsDev[d])
		if o != d {
			continue // summed on NoGPU under another ordinal
		}
		tot := j.c.totals[k]
		if tot == nil {
			tot = &controlblock.ProcTotals{}
			j.c.totals[k] = tot
		}
		tot.Update(procs[k])
		launches[k] += float64(tot.Launches)
		throttledNs[k] += float64(tot.ThrottledNs)
	}
	for k, n := range launches {
		e := j.entries[k]
		e.Launches, e.ThrottledSeconds = n, throttledNs[k]/1e9
	}
	j.live[cg] = true
}

// showLarger shows NVML's figure for a container where it exceeds eBPF's
// by more than its processes' contexts: memory the probes did not see.
func (j *joiner) showLarger() {
	for k, e := range j.entries {
		n := uint64(len(j.procs[k]))
		if e.MemorySource == "ebpf" && n > 0 && j.nvmlMem[k] > e.MemoryUsedBytes+n*j.contextBytes() {
			e.MemoryUsedBytes, e.MemorySource = j.nvmlMem[k], "nvml"
		}
	}
}

// unplaced is what of a process's launches and throttled time its ledger
// does not count per device (all of it in ledgers before minor 1). A
// placed count above the total (a rewritten slot) leaves nothing.
func unplaced(p controlblock.ProcUsage) controlblock.ProcUsage {
	p.Launches -= min(p.LaunchesPlaced, p.Launches)
	p.ThrottledNs -= min(p.ThrottledPlacedNs, p.ThrottledNs)
	return p
}

// byIndex keys what the enforcer reports by GPU UUID by NVML's index, as
// the view keys GPUs; a GPU NVML does not list is left out.
func byIndex[T any](j *joiner, m map[membership.GPUKey]T) map[Key]T {
	out := make(map[Key]T, len(m))
	for k, v := range m {
		if i, ok := j.index[k.UUID]; ok {
			out[Key{k.Cgroup, i}] = v
		}
	}
	return out
}

// name labels a container: a remote session by its client, else from the
// labeller (Kubernetes), else from what its cgroup path says (pod uid,
// container id), else by the path itself.
func (j *joiner) name(dir, path string) (ns, pod, container string) {
	if j.c.src.Sessions != nil {
		if ns, pod, container, ok := j.c.src.Sessions(path); ok {
			return ns, pod, container
		}
	}
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
