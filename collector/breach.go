package collector

import (
	"fmt"
	"math"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/agentapi"

	"github.com/gpuwarden/gpuwarden/collector/ledgertrust"
	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
)

// Why a container is in breach: the label `reason` of
// gpuwarden_container_breach. What the node saw (eBPF, NVML) judges what
// the container's ledger says.
const (
	// BreachBypass: GPU activity of a cgroup that keeps no ledger at all.
	BreachBypass = "bypass"
	// BreachOverLimit: the node saw the container hold more than its quota.
	BreachOverLimit = "over_limit"
	// BreachOverLedger: the node saw it hold more than its ledger reserves.
	BreachOverLedger = "over_ledger"
	// BreachUnledgered: a process of the cgroup uses the GPU from no live
	// slot of its ledger (a second libcuda, a child without the interposer).
	BreachUnledgered = "unledgered_process"
	// BreachBadLedger: the ledger's counters went backwards or are
	// impossible (slots holding more than the container reserves).
	BreachBadLedger = "bad_ledger"
	// BreachFalseClaim: the container writes a ledger whose cgroup claim
	// is refused: its processes map it, or its slots name processes of
	// other containers.
	BreachFalseClaim = "false_claim"
	// BreachOverShare: the device time NVML measures, averaged over a
	// minute, stays above the share the scheduler holds the container to.
	BreachOverShare = "over_share"
)

// BreachReasons lists every reason, for help texts and tests.
var BreachReasons = []string{BreachBypass, BreachOverLimit, BreachOverLedger, BreachUnledgered, BreachBadLedger, BreachFalseClaim,
	BreachOverShare}

const (
	// memoryTolerance is what the node may see above a ledger or a quota
	// without a breach: a context's own memory, and the moment between a
	// free and its ledger update.
	memoryTolerance = 64 << 20
	// sustain is how long a comparison must fail before it is a breach, so
	// two reads a few microseconds apart never make one.
	sustain = 2 * time.Second
	// bypassSustain makes a bypass wait for the next view (a second or
	// more later: see Deciding): a view reads the ledgers, then eBPF, and a
	// starting process opens its ledger before cuInit but claims the slot
	// that vouches for it only after, so one view can read its ledger
	// unvouched and then see its first context. The next view reads both
	// settled.
	bypassSustain = 200 * time.Millisecond
	// remember keeps an instant breach (a counter that went back) reported
	// for this long, so alerts and scrapes see it.
	remember = time.Minute
	// shareTolerance, shareWindow and shareSustain: NVIDIA's per-process
	// utilization is a sample stream (each sample credits a whole period,
	// 1/6 s to 1 s, to the one process on the engine then), so a second's
	// figure says little: the share judged is NVML's averaged over about a
	// minute, of a target unchanged that long, and only a wide excess held
	// for a while is a breach.
	shareTolerance = 0.15
	shareWindow    = time.Minute
	shareSustain   = 10 * time.Second
)

// judge keeps what breach detection needs between views.
type judge struct {
	since    map[Key]map[string]time.Time       // a failing comparison's first sight
	instant  map[Key]map[string]agentapi.Breach // instant breaches and when they end
	until    map[Key]map[string]time.Time
	launches map[string]ledgerMarks // by ledger directory
	rewinds  map[Key]uint64         // the enforcer's count, as last seen
	shares   map[Key]*shareMean     // NVML's share, averaged
	at       time.Time              // of the last judgement
}

// shareMean is a container's NVML share averaged over about shareWindow
// since its held share last changed.
type shareMean struct {
	mean, held  float64
	since, last time.Time
}

// meanShare adds this view's share to k's average; full says the average
// covers shareWindow of an unchanged target.
func (jd *judge) meanShare(k Key, share, held float64, now time.Time) (mean float64, full bool) {
	m := jd.shares[k]
	switch {
	case m == nil || m.held != held:
		m = &shareMean{mean: share, held: held, since: now, last: now}
		jd.shares[k] = m
	case now.After(m.last):
		m.mean += (share - m.mean) * (1 - math.Exp(-now.Sub(m.last).Seconds()/shareWindow.Seconds()))
		m.last = now
	}
	return m.mean, now.Sub(m.since) >= shareWindow
}

// ledgerMarks are a ledger's counters that never go back.
type ledgerMarks struct {
	cgroup   uint64
	launches [controlblock.MaxDevices]uint64
}

func newJudge() judge {
	return judge{since: map[Key]map[string]time.Time{}, instant: map[Key]map[string]agentapi.Breach{},
		until: map[Key]map[string]time.Time{}, launches: map[string]ledgerMarks{}, rewinds: map[Key]uint64{},
		shares: map[Key]*shareMean{}}
}

// gpuProc is a process NVML lists on a device, as the agent identified it.
type gpuProc struct {
	hostPID int
	id      ledgertrust.Proc
	ok      bool // identified (else it exited meanwhile)
}

// judgeAll sets every entry's breaches and Unenforced.
func (j *joiner) judgeAll(ledgers map[uint64]*ledger, rejected []*ledger, now time.Time) {
	jd := &j.c.judge
	jd.at = now
	accused := j.judgeRefused(rejected)
	seen := map[Key]bool{}
	j.meanShare = map[Key]float64{}
	for k, e := range j.entries {
		seen[k] = true
		if held, ok := j.held[k]; ok {
			if mean, full := jd.meanShare(k, e.ComputeShare, held, now); full {
				j.meanShare[k] = mean
			}
		}
		var fails []agentapi.Breach
		if l := ledgers[k.Cgroup]; l != nil {
			fails = j.compare(k, e, l)
		} else if e.Unenforced {
			fails = append(fails, agentapi.Breach{Reason: BreachBypass, Evidence: "GPU activity without the interposer"})
		}
		fails = append(fails, accused[k.Cgroup]...)
		e.Breaches = jd.hold(k, fails, now)
		e.Unenforced = len(e.Breaches) > 0
	}
	jd.forget(seen)
}

// compare judges a container's ledger against what the node saw.
func (j *joiner) compare(k Key, e *agentapi.ContainerDevice, l *ledger) []agentapi.Breach {
	var out []agentapi.Breach
	d := k.GPU
	for _, m := range j.meters(k, e) {
		if m.bytes <= e.LedgerBytes+m.tolerance {
			continue
		}
		// Held above the quota but within the ledger is a limit lowered
		// below what the container holds (it keeps it): no breach.
		if e.MemoryLimitBytes > 0 && m.bytes > e.MemoryLimitBytes+m.tolerance {
			out = append(out, agentapi.Breach{Reason: BreachOverLimit, Evidence: fmt.Sprintf(
				"%s sees %d bytes held on GPU %d, quota %d", m.name, m.bytes, d, e.MemoryLimitBytes)})
		}
		out = append(out, agentapi.Breach{Reason: BreachOverLedger, Evidence: fmt.Sprintf(
			"%s sees %d bytes held on GPU %d, the ledger reserves %d", m.name, m.bytes, d, e.LedgerBytes)})
	}
	if b, ok := j.unledgered(k, l); ok {
		out = append(out, b)
	}
	ordinal, covered := j.ordinals[k]
	if !covered {
		ordinal = -1
	}
	if b, ok := impossible(ordinal, l.usage); ok {
		out = append(out, b)
	}
	if held, ok := j.held[k]; ok {
		if mean, ok := j.meanShare[k]; ok && mean > held+shareTolerance {
			out = append(out, agentapi.Breach{Reason: BreachOverShare, Evidence: fmt.Sprintf(
				"NVML measures %.0f%% of GPU %d's time over the last minute, the scheduler holds it to %.0f%%", mean*100, d, held*100)})
		}
	}
	return out
}

// meter is what one of the node's meters sees a container hold on a GPU,
// and what it may see beyond the ledger without a breach.
type meter struct {
	name             string
	bytes, tolerance uint64
}

// meters are the node's two meters of a container's memory on a GPU, each
// judged on its own, so the larger wins: eBPF's, exact to the byte where a
// probe saw the allocations; NVML's, which sees every allocation of every
// process it lists (a copy of libcuda used before the scan attached to it
// too) but also each process's context, which no ledger counts in full.
func (j *joiner) meters(k Key, e *agentapi.ContainerDevice) []meter {
	var out []meter
	if e.MemorySource == "ebpf" {
		out = append(out, meter{"ebpf", e.MemoryUsedBytes, memoryTolerance})
	}
	if n := uint64(len(j.procs[k])); n > 0 {
		out = append(out, meter{"nvml", j.nvmlMem[k], memoryTolerance + n*j.contextBytes()})
	}
	return out
}

// contextBytes is what NVML may show per process beyond the ledger: at
// least memoryTolerance, the figure before it was configurable.
func (j *joiner) contextBytes() uint64 { return max(j.c.src.NVMLContextBytes, memoryTolerance) }

// unledgered finds processes of the cgroup that NVML lists on the device
// but no live slot of the ledger names.
func (j *joiner) unledgered(k Key, l *ledger) (agentapi.Breach, bool) {
	var ps []agentapi.Process
	for _, p := range j.procs[k] {
		if p.ok && !ledgertrust.InSlots(p.id, l.usage.Procs) {
			ps = append(ps, agentapi.Process{PID: p.hostPID, StartTime: p.id.StartTime})
		}
	}
	if len(ps) == 0 {
		return agentapi.Breach{}, false
	}
	return agentapi.Breach{Reason: BreachUnledgered, Procs: ps, Evidence: fmt.Sprintf(
		"processes %v use GPU %d from no slot of ledger %s", pidsOf(ps), k.GPU, l.dir)}, true
}

// impossible says whether a ledger contradicts itself: its slots hold more
// than the container reserves on ordinal d (the interposer reserves first,
// and releases last; -1: none), or the validation dropped fields.
func impossible(d int, u *controlblock.UsageSnapshot) (agentapi.Breach, bool) {
	if len(u.Problems) > 0 {
		return agentapi.Breach{Reason: BreachBadLedger, Evidence: fmt.Sprintf("ledger fails validation: %v", u.Problems)}, true
	}
	if d < 0 {
		return agentapi.Breach{}, false
	}
	var slots uint64
	for _, p := range u.Procs {
		slots += p.Bytes[d]
	}
	if slots > u.ReservedBytes[d] {
		return agentapi.Breach{Reason: BreachBadLedger, Evidence: fmt.Sprintf(
			"ledger's processes hold %d bytes on GPU %d, it reserves %d", slots, d, u.ReservedBytes[d])}, true
	}
	return agentapi.Breach{}, false
}

// rewound reports a ledger whose launch tickets went back: a reset lifts
// the launch gate until the next true-up.
func (jd *judge) rewound(l *ledger, now time.Time) {
	dir, cg, u := l.dir, l.usage.CgroupID, l.usage
	prev, had := jd.launches[dir]
	jd.launches[dir] = ledgerMarks{cgroup: cg, launches: u.LaunchesIssued}
	if !had || prev.cgroup != cg {
		return
	}
	for d := 0; d < controlblock.MaxDevices; d++ {
		if u.LaunchesIssued[d] < prev.launches[d] {
			jd.remember(Key{cg, l.gpus[d]}, agentapi.Breach{Reason: BreachBadLedger, Evidence: fmt.Sprintf(
				"ledger %s: launches issued on its CUDA device %d went back from %d to %d", dir, d, prev.launches[d], u.LaunchesIssued[d])}, now)
		}
	}
}

// enforcerRewinds reports the ledgers whose tickets the enforcer saw go
// back since the last view: it reads them every tick, where a view (at
// most once a second) misses a reset the container's launches overtake.
func (jd *judge) enforcerRewinds(counts map[Key]uint64, now time.Time) {
	for k, n := range counts {
		if n > jd.rewinds[k] { // counted since the scheduler took the container on
			jd.remember(k, agentapi.Breach{Reason: BreachBadLedger, Evidence: fmt.Sprintf(
				"the enforcer saw the ledger's launch tickets on GPU %d go back (%d times)", k.GPU, n)}, now)
		}
	}
	jd.rewinds = counts
}

// keepLedgers drops the marks of directories not in seen.
func (jd *judge) keepLedgers(seen map[string]bool) {
	for dir := range jd.launches {
		if !seen[dir] {
			delete(jd.launches, dir)
		}
	}
}

// hold turns this view's failing comparisons into breaches once they held
// for their sustainOf (a bypass: the next view), and keeps a rewound ledger
// one for `remember` after it was seen.
func (jd *judge) hold(k Key, fails []agentapi.Breach, now time.Time) []agentapi.Breach {
	since := jd.since[k]
	if since == nil {
		since = map[string]time.Time{}
		jd.since[k] = since
	}
	var out []agentapi.Breach
	failing := map[string]bool{}
	for _, b := range fails {
		if failing[b.Reason] {
			continue // one series per reason: the first evidence stands
		}
		failing[b.Reason] = true
		first, ok := since[b.Reason]
		if !ok {
			first = now
			since[b.Reason] = now
		}
		if now.Sub(first) >= sustainOf(b.Reason) {
			out = append(out, b)
		}
	}
	for r := range since {
		if !failing[r] {
			delete(since, r)
		}
	}
	for r, b := range jd.instant[k] {
		if now.After(jd.until[k][r]) {
			delete(jd.instant[k], r)
		} else if !failing[r] {
			out = append(out, b)
		}
	}
	return out
}

// sustainOf is how long a reason's evidence must hold: a bypass until the
// next view; comparisons of figures read apart need time, and so does a
// false claim, which a container restarted in a new cgroup makes for the
// moment between mapping its ledger and binding it to the new cgroup.
func sustainOf(reason string) time.Duration {
	switch reason {
	case BreachBypass:
		return bypassSustain
	case BreachOverShare:
		return shareSustain
	}
	return sustain
}

// remember keeps an instant breach reported for `remember`.
func (jd *judge) remember(k Key, b agentapi.Breach, now time.Time) {
	if jd.instant[k] == nil {
		jd.instant[k], jd.until[k] = map[string]agentapi.Breach{}, map[string]time.Time{}
	}
	jd.instant[k][b.Reason], jd.until[k][b.Reason] = b, now.Add(remember)
}

// forget drops the state of containers no longer seen.
func (jd *judge) forget(seen map[Key]bool) {
	for k := range jd.since {
		if !seen[k] {
			delete(jd.since, k)
			delete(jd.instant, k)
			delete(jd.until, k)
		}
	}
	for k := range jd.shares {
		if !seen[k] {
			delete(jd.shares, k)
		}
	}
}

func pidsOf(ps []agentapi.Process) []int {
	out := make([]int, len(ps))
	for i, p := range ps {
		out[i] = p.PID
	}
	return out
}

// deciding says whether evidence the last judgement saw has not yet held
// for its sustainOf: a later view makes it a breach or drops it.
func (jd *judge) deciding() bool {
	for _, f := range jd.since {
		for reason, first := range f {
			if jd.at.Sub(first) < sustainOf(reason) {
				return true
			}
		}
	}
	return false
}

// timing says whether a comparison is failing but not yet long enough to be
// a breach, or an instant breach is still reported: the next view may
// differ from this one with nothing else changed.
func (jd *judge) timing() bool {
	for _, f := range jd.since {
		if len(f) > 0 {
			return true
		}
	}
	for _, b := range jd.instant {
		if len(b) > 0 {
			return true
		}
	}
	return false
}
