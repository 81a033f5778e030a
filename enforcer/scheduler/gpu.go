package scheduler

import (
	"math"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/policy"
)

const (
	// Before a container's device time per ticket is measured, a slice
	// gives it at most probe tickets, starting at probeStart and doubling
	// each slice it uses them all (a slow start), at an assumed small cost:
	// short kernels are not held to a trickle (which NVML's whole percents
	// could not even measure) and long ones do not get seconds of work.
	priorCostNs = float64(50 * time.Microsecond)
	probeStart  = 8
	costTau     = 5 * time.Second        // window of the cost estimate
	shareTau    = time.Second            // window of the achieved share
	busyHold    = 300 * time.Millisecond // a container that took a ticket this recently is busy
	// Charges are trued up to measured device time at most this often (a
	// longer window when a reading finds no busy time, as NVIDIA's sampled
	// per-process utilization can).
	reconcileEvery = 250 * time.Millisecond
	// Idle containers are looked at in turns, at least this many a tick
	// (all of them, on a GPU shared by fewer) and each at least every
	// Config.IdlePoll: a thousand idle containers do not cost a thousand
	// reads every tick.
	idleBatch = 64
)

// gpu is one device's loop state.
type gpu struct {
	uuid     string
	settings GPUSettings
	eff      policy.Policy
	members  []*member

	owner        *member
	sliceStart   time.Time
	sliceIssued0 uint64  // the owner's tickets when its slice began
	sliceTook    float64 // device time of the tickets it took in the slice, ns
	sliceHeld    float64 // wall time it has held the slice, ns
	lastTick     time.Time
	queued       float64       // ns of the previous owner's work that may still run ahead of the owner's
	sinceRecon   time.Duration // measured time since charges were last trued up

	active  []*member // members looked at every tick: busy, waiting or owning
	cursor  int       // where the next round of idle polls starts in members
	dirty   bool      // plan again: busy states, settings or members changed
	longest float64   // the largest cost per ticket among members, ns
}

// member is one container on one device.
type member struct {
	c   *container
	dev int // the container's CUDA ordinal of this GPU

	lastIssued uint64    // tickets taken, as of the last tick
	charged    uint64    // tickets already charged to credit
	lastTake   time.Time // when it last took a ticket
	waiting    bool      // a launch waits at the gate
	busy       bool
	active     bool      // in gpu.active
	creditAt   time.Time // credit is earned up to here (an idle member's lazily)

	target float64 // share, 0-1
	borrow bool
	credit float64 // ns of device time it may still use

	cost       float64 // ns of device time per ticket; 0: not measured yet
	probe      uint64  // tickets per slice while cost is 0
	sumBusy    float64 // decayed busy ns
	sumTickets float64 // decayed tickets
	measIssued uint64  // tickets at the last measurement
	lastBusy   uint64
	haveBusy   bool
	seen       bool   // the source has reported device time for it
	rewinds    uint64 // times its ledger's tickets went back
	achieved   float64

	// Since the last reconciliation: what it was charged on estimates, the
	// wall time it held slices, and the device time it measurably used.
	provisional float64
	held        float64
	used        float64
}

func newMember(c *container, dev int, now time.Time) *member {
	i := c.usage.Issued(dev)
	return &member{c: c, dev: dev, lastIssued: i, charged: i, measIssued: i, lastTake: now.Add(-busyHold),
		probe: probeStart, creditAt: now}
}

// add makes m a member, looked at from the next tick.
func (g *gpu) add(m *member) {
	g.members = append(g.members, m)
	g.activate(m)
}

// remove forgets m.
func (g *gpu) remove(m *member) {
	g.members = without(g.members, m)
	g.active = without(g.active, m)
	if g.owner == m {
		g.owner = nil
	}
	g.dirty = true
}

func without(ms []*member, m *member) []*member {
	for i, x := range ms {
		if x == m {
			return append(ms[:i], ms[i+1:]...)
		}
	}
	return ms
}

func (g *gpu) activate(m *member) {
	if !m.active {
		m.active = true
		g.active = append(g.active, m)
		g.dirty = true
	}
}

func (m *member) costNs() float64 {
	if m.cost > 0 {
		return m.cost
	}
	return priorCostNs
}

// plan computes the effective policy and each member's share, and sets or
// lifts the gates to match; idle members' credit is settled first, at the
// targets it was earned at.
func (g *gpu) plan(now time.Time, cfg Config) {
	slice := g.sliceLen(cfg)
	for _, m := range g.members {
		if !m.active {
			m.settle(now, slice, cfg)
		}
	}
	g.dirty = false
	cs := make([]policy.Container, len(g.members))
	for i, m := range g.members {
		e := m.c.eff
		// A busy high-priority container is taken at all its share (Demand
		// 0): what it measures is what the others leave it, so feeding that
		// back would let them keep what they took. The others run when it
		// goes idle (and, with soft, while it leaves the device idle).
		cs[i] = policy.Container{Weight: e.Weight, CapPercent: e.CapPercent, High: e.High,
			Present: m.c.reserved[m.dev] > 0 || m.busy, Busy: m.busy}
	}
	g.eff = policy.Effective(g.settings.Policy, g.settings.PolicySet, cs)
	shares := policy.Shares(g.eff, g.maxInst(cfg), cs)
	for i, m := range g.members {
		m.target, m.borrow = shares[i].Target, shares[i].Borrow
		m.c.setGate(m.dev, g.eff.Gated())
	}
}

// maxInst is the GPU's max_inst in force: its own, else the node's.
func (g *gpu) maxInst(cfg Config) int {
	if g.settings.MaxInst > 0 {
		return g.settings.MaxInst
	}
	return policy.MaxInst(cfg.MaxInst)
}

func (g *gpu) status(cfg Config) GPUStatus {
	cs := make([]policy.Container, len(g.members))
	for i, m := range g.members {
		cs[i] = policy.Container{Weight: m.c.eff.Weight}
	}
	n := g.maxInst(cfg)
	return GPUStatus{UUID: g.uuid, Policy: g.eff, PolicySet: g.settings.PolicySet, MaxInst: n,
		FreeWeight: policy.FreeWeight(n, cs), Containers: len(g.members)}
}

// accrue brings credit up to now: earned at the target share of the wall
// time since creditAt, less charge, held between two slices of debt and hi.
func (m *member) accrue(now time.Time, charge, hi, slice float64, cfg Config) {
	m.credit = min(max(m.credit+m.target*float64(now.Sub(m.creditAt))-charge, -2*slice), hi)
	m.creditAt = now
	if m.target >= 1 { // entitled to the whole device: it owes nothing
		m.credit = max(m.credit, float64(cfg.Tick))
	}
}

// settle accrues an idle member's credit lazily: what a tick at a time would
// have given it (an idle member pays nothing and holds at most a slice).
func (m *member) settle(now time.Time, slice float64, cfg Config) {
	m.accrue(now, 0, slice, slice, cfg)
}

// measure takes a new reading of busy ns per container, dt after the last.
func (g *gpu) measure(busy map[string]uint64, dt time.Duration) {
	if dt <= 0 {
		return
	}
	decay := math.Exp(-float64(dt) / float64(costTau))
	alpha := 1 - math.Exp(-float64(dt)/float64(shareTau))
	for _, m := range g.members {
		b, ok := busy[m.c.key]
		m.seen = m.seen || ok
		if !m.haveBusy || b < m.lastBusy { // first reading: the windows start here
			m.lastBusy, m.measIssued, m.haveBusy = b, m.lastIssued, true
			m.provisional, m.held, m.used = 0, 0, 0
			continue
		}
		db, di := float64(b-m.lastBusy), float64(m.lastIssued-m.measIssued)
		m.lastBusy, m.measIssued = b, m.lastIssued
		m.sumBusy = m.sumBusy*decay + db
		m.sumTickets = m.sumTickets*decay + di
		if m.sumTickets >= 4 && m.sumBusy > 0 {
			m.cost = m.sumBusy / m.sumTickets
		}
		m.achieved += (min(db/float64(dt), 1) - m.achieved) * alpha
		m.used += db
	}
	g.longest = 0
	for _, m := range g.members {
		g.longest = max(g.longest, m.costNs())
	}
	g.sinceRecon += dt
	if g.sinceRecon >= reconcileEvery {
		g.reconcile()
	}
}

// reconcile replaces the charges made on estimates since the last call
// (the owner's wall time, tickets at their estimated cost) with measured
// device time, so errors in the estimates do not add up: the shares of
// device time converge on the targets whatever the kernels' length, launch
// pattern or synchronization. The slices' wall time (held) is what is
// charged in all; it is split in proportion to the device time each used,
// so the idle moments of switching are borne in proportion too, and
// credit earned at wall time is paid back in full.
func (g *gpu) reconcile() {
	// A member the source has never reported (it cannot see its processes)
	// keeps its estimated charges: measuring nothing is not using nothing.
	measured := func(m *member) bool { return m.haveBusy && m.seen }
	var held, used float64
	for _, m := range g.members {
		if measured(m) {
			held += m.held
			used += m.used
		}
	}
	if used <= 0 { // nothing measured (yet): wait for a reading with busy time
		if g.sinceRecon < 4*reconcileEvery {
			return
		}
		held = 0 // too long: keep the estimates and start a new window
	}
	for _, m := range g.members {
		if measured(m) && held > 0 && used > 0 {
			m.credit += m.provisional - m.used*held/used
		}
		m.provisional, m.held, m.used = 0, 0, 0
	}
	g.sinceRecon = 0
}

// quiet says the GPU can wait longer than a tick: none of its members uses
// or waits for it, and it has so many that a tick polls only some of them
// (on a GPU shared by fewer, every tick looks at every member, which keeps
// a launch after idling from waiting longer than a tick).
func (g *gpu) quiet() bool {
	return len(g.active) == 0 && !g.dirty && (len(g.members) == 0 || len(g.members) >= idleBatch)
}

// ownerIdle says the owner has stopped using its slice: it waits at no gate and
// has taken no ticket for longer than its released work can last (it may be
// synchronizing on up to a lookahead of work, plus a ticket or two, queued
// behind what the previous owner left on the device).
func (g *gpu) ownerIdle(now time.Time, cfg Config) bool {
	m := g.owner
	after := cfg.Lookahead + 2*cfg.Tick + time.Duration(2*m.costNs()+g.queued)
	return !m.waiting && now.Sub(m.lastTake) > min(after, 200*time.Millisecond)
}

// observe reads a member's gate: the tickets it took and whether a launch
// waits. It says whether the member's busy state changed.
func (g *gpu) observe(m *member, now time.Time) bool {
	issued, grant := m.c.usage.Issued(m.dev), m.c.limits.Grant(m.dev)
	if issued < m.lastIssued { // a forged (or reset) ledger: start counting again
		m.lastIssued, m.charged, m.measIssued = issued, issued, issued
		m.rewinds++
	}
	// A ticket counts as taken when its launch passes the gate: a launch
	// that waited since long ago has only now begun.
	if issued > m.lastIssued || m.waiting {
		m.lastTake = now
	}
	m.lastIssued = max(m.lastIssued, issued)
	m.waiting = issued > grant
	was := m.busy
	m.busy = m.waiting || now.Sub(m.lastTake) < busyHold
	return m.busy != was
}

// pollIdle looks at the next idle members in turn, enough of them for the
// time since the last tick (dt) that each is looked at every
// Config.IdlePoll; one that took a ticket or waits becomes active. A launch
// after idling waits at most about Config.IdlePoll (a tick where a GPU has
// fewer than idleBatch members).
func (g *gpu) pollIdle(now time.Time, dt time.Duration, cfg Config) {
	n := len(g.members)
	k := min(n, max(idleBatch, int(math.Ceil(float64(n)*float64(dt)/float64(cfg.IdlePoll)))))
	for i := 0; i < k; i++ {
		m := g.members[(g.cursor+i)%n]
		if m.active {
			continue
		}
		issued := m.lastIssued
		g.observe(m, now)
		if m.waiting || m.lastIssued != issued || m.busy {
			m.settle(now, g.sliceLen(cfg), cfg)
			g.activate(m)
		}
	}
	g.cursor = (g.cursor + k) % n
}

// deactivate drops members that neither use the device nor wait from the
// every-tick set.
func (g *gpu) deactivate(now time.Time) {
	keep := g.active[:0]
	for _, m := range g.active {
		if m.busy || m.waiting || m == g.owner {
			keep = append(keep, m)
			continue
		}
		m.active, m.creditAt = false, now
		g.dirty = true
	}
	clear(g.active[len(keep):])
	g.active = keep
}

// tick observes the gates, charges credit, picks the slice's owner and
// releases its tickets.
func (g *gpu) tick(now time.Time, cfg Config) {
	elapsed := now.Sub(g.lastTick)
	dt := float64(elapsed)
	g.lastTick = now
	if len(g.members) == 0 {
		g.owner = nil
		return
	}
	for _, m := range g.active {
		if g.observe(m, now) {
			g.dirty = true
		}
	}
	g.pollIdle(now, elapsed, cfg)
	if g.dirty {
		g.plan(now, cfg)
	}
	if !g.eff.Gated() {
		g.owner = nil
		g.deactivate(now)
		return
	}

	// Credit: earned at the target share of wall time. The owner pays the
	// wall time it holds the device (a time slice), and at the slice's end
	// for what it took beyond it (work that runs into the next slice);
	// others pay for tickets they take outside a slice.
	slice := g.sliceLen(cfg)
	for _, m := range g.active {
		took := float64(m.lastIssued-m.charged) * m.costNs()
		m.charged = m.lastIssued
		charge := took
		if m == g.owner {
			charge = dt
			g.sliceTook += took
			g.sliceHeld += dt
			m.held += dt
		}
		m.provisional += charge
		hi := slice
		if m.busy {
			hi = slice * float64(len(g.members)+1)
		}
		m.accrue(now, charge, hi, slice, cfg)
	}

	// The slice: the owner keeps it for the slice's length while it uses the
	// device and no high-priority container waits; then the waiting
	// container with the most (positive) credit takes the device.
	o := g.owner
	highWaits := false
	for _, m := range g.active {
		if m.c.eff.High && m.waiting && m.credit > 0 {
			highWaits = true
		}
	}
	sliceDur := time.Duration(slice)
	if o != nil && (now.Sub(g.sliceStart) >= sliceDur || g.ownerIdle(now, cfg) || (highWaits && !o.c.eff.High)) {
		next := g.pick(o, now, cfg)
		if next != o || now.Sub(g.sliceStart) >= sliceDur || o.credit <= 0 {
			g.begin(next, now, cfg)
		}
	} else if o == nil {
		g.begin(g.pick(nil, now, cfg), now, cfg)
	}
	defer g.deactivate(now)
	if g.owner == nil {
		return
	}
	g.release(g.owner, now, cfg)
	// Soft: while the owner leaves the device idle (it does not wait at its
	// gate), the waiting container that may borrow with the most credit
	// does, paying for the tickets it takes.
	if o := g.owner; !o.waiting {
		var b *member
		for _, m := range g.active {
			if m != o && m.borrow && m.waiting && (b == nil || m.credit > b.credit) {
				b = m
			}
		}
		if b != nil {
			want := b.lastIssued + uint64(max(1, math.Ceil(float64(cfg.Lookahead)/b.costNs())))
			if b.cost == 0 {
				want = min(want, b.lastIssued+b.probe)
			}
			_ = b.c.limits.RaiseGrant(b.dev, want)
		}
	}
}

// pick chooses the next owner among the waiting containers (and the current
// owner while it uses the device).
func (g *gpu) pick(cur *member, now time.Time, cfg Config) *member {
	var cands []*member
	high := false
	for _, m := range g.active {
		if m.waiting || (m == cur && !g.ownerIdle(now, cfg)) {
			cands = append(cands, m)
			if m.c.eff.High && m.credit > 0 {
				high = true
			}
		}
	}
	var best *member
	for _, m := range cands {
		if high && !m.c.eff.High {
			continue
		}
		if m.credit > 0 && (best == nil || m.credit > best.credit) {
			best = m
		}
	}
	if best == nil { // soft: a container may borrow what nobody with credit wants
		for _, m := range cands {
			if m.borrow && (best == nil || m.credit > best.credit) {
				best = m
			}
		}
	}
	return best
}

func (g *gpu) begin(m *member, now time.Time, cfg Config) {
	if o := g.owner; o != nil {
		// Work taken beyond the slice by more than a ticket (long kernels)
		// runs in the next one: it is paid for. Within a ticket it is not:
		// the estimate of cost is a few percent off either way, and every
		// owner leaves about that much.
		if ex := g.sliceTook - g.sliceHeld - o.costNs(); ex > 0 {
			o.credit -= ex
			o.provisional += ex
		}
		if o.cost == 0 && o.lastIssued >= g.sliceIssued0+o.probe && o.probe < 1<<20 {
			o.probe *= 2
		}
	}
	g.sliceTook, g.sliceHeld, g.queued = 0, 0, 0
	if o := g.owner; o != nil && o != m {
		g.queued = float64(cfg.Lookahead) + o.costNs()
	}
	g.owner, g.sliceStart = m, now
	if m != nil {
		g.sliceIssued0 = m.lastIssued
	}
}

// release raises the owner's grant: a lookahead of device time past what it
// has taken, and no further than the end of its slice: work released for
// after the slice would run in another's. A slice always runs its full
// length (the owner's credit may go into debt, paid back before its next
// slice), so that switching costs the same share of every container's time.
// sliceLen is a slice's length: Config.Slice, or longer where kernels are
// long, so that a slice holds several of them (the device would otherwise
// switch, and wait for the previous owner's last kernel, every kernel or two).
func (g *gpu) sliceLen(cfg Config) float64 {
	return max(float64(cfg.Slice), 4*g.longest)
}

func (g *gpu) release(o *member, now time.Time, cfg Config) {
	c := o.costNs()
	tickets := func(ns float64) uint64 { return uint64(max(1, math.Ceil(ns/c))) }
	elapsed := float64(now.Sub(g.sliceStart))
	end := g.sliceLen(cfg)
	ahead := min(float64(cfg.Lookahead), end-elapsed)
	if ahead <= 0 {
		return
	}
	want := o.lastIssued + tickets(ahead)
	want = min(want, g.sliceIssued0+tickets(elapsed+ahead))
	if o.cost == 0 {
		want = min(want, g.sliceIssued0+o.probe)
	}
	if want > o.c.limits.Grant(o.dev) {
		_ = o.c.limits.RaiseGrant(o.dev, want)
	}
}
