package scheduler

import (
	"math"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
	"github.com/gpuwarden/gpuwarden/enforcer/policy"
)

const (
	// Before a container's device time per ticket is measured, a slice
	// gives it at most probe tickets, starting at probeStart and doubling
	// each slice it uses them all (a slow start), at an assumed small cost:
	// short kernels are not held to a trickle and long ones do not get
	// seconds of work.
	priorCostNs = float64(50 * time.Microsecond)
	probeStart  = 8
	// The cost estimate moves this far towards each slice's measure, and
	// never below minCostNs (no kernel costs less device time).
	costGain  = 0.5
	minCostNs = float64(time.Microsecond)
	// A soft borrower may take the device while the owner has at most this
	// much work yet to run (it synchronizes on it, or computes on the host).
	borrowBelow  = time.Millisecond
	starveFactor = 0.8                    // a tick in which the owner starves lowers its estimate this much
	shareTau     = time.Second            // window of the achieved share
	busyHold     = 300 * time.Millisecond // a container that took a ticket this recently is busy
	// A previous owner's work drains for at most this long on the clock
	// after its gate closed, whatever its completion marks say; while it
	// does, the loop looks every drainPoll for its end, to open the next
	// owner's gate soon after (nobody's time: on an H200, where drains
	// last 0.07-1.2 ms, a 1 ms poll left the device about 1 ms a hand-over
	// to nobody), and every drainPollLate once it has lasted drainLong
	// (longer than a drain of queued 2-20 ms kernels; a container that
	// computes on the host after its last launch, without synchronizing,
	// does not keep the loop polling at drainPoll for its 200 ms).
	maxDrain      = 200 * time.Millisecond
	drainPoll     = 250 * time.Microsecond
	drainLong     = 20 * time.Millisecond
	drainPollLate = time.Millisecond
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
	sliceIssued0 uint64 // the owner's tickets when its slice began
	lastTick     time.Time

	// The device-time clock, charged up to clockAt. A slice's owner is
	// charged until its last launched work has run, not until its gate
	// closed: until then its work drains (draining, since closedAt), the
	// clock is still its own, and the next owner's gate stays closed.
	clockAt     time.Time
	draining    *member
	closedAt    time.Time
	closePassed uint64 // the draining member's tickets that passed its gate before it closed

	active  []*member // members looked at every tick: busy, waiting or owning
	counts  SliceCounts
	cursor  int     // where the next round of idle polls starts in members
	dirty   bool    // plan again: busy states, settings or members changed
	longest float64 // the largest cost per ticket among members, ns
}

// SliceCounts are a GPU's slice hand-overs, ever: how long each previous
// owner's work ran on after its gate closed, and how long the device then
// waited for the next owner's gate to open (nobody's time). A drain that
// ends at maxDrain, not at a completion mark, means the marks did not come.
type SliceCounts struct {
	Handovers    uint64  // gates closed for another container's slice
	DrainsCapped uint64  // drains ended at maxDrain
	DrainSeconds float64 // gate closed to the drained work's end, summed
	GapSeconds   float64 // drained work's end to the next gate's opening, summed
}

// member is one container on one device.
type member struct {
	c   *container
	dev int // the container's CUDA ordinal of this GPU

	lastIssued uint64    // tickets taken, as of the last tick
	charged    uint64    // tickets already charged to credit
	lastTake   time.Time // when it last took a ticket, or waited for one
	lastTicket time.Time // when it last took a ticket
	waiting    bool      // a launch waits at the gate
	busy       bool
	active     bool      // in gpu.active
	creditAt   time.Time // credit is earned up to here (an idle member's lazily)

	target float64 // share, 0-1
	borrow bool
	credit float64 // ns of device time it may still use

	cost     float64 // ns of device time per ticket (costFromSlice); 0: not measured yet
	probe    uint64  // tickets per slice while cost is 0
	slice0   uint64  // its tickets when its latest slice began
	spent    float64 // clock time charged to its latest slice so far, ns
	lastBusy uint64
	haveBusy bool
	rewinds  uint64 // times its ledger's tickets went back
	achieved float64

	clockDue float64 // device time the clock charged it since the last tick, ns
	paid     float64 // device time charged to it, ever, ns
}

func newMember(c *container, dev int, now time.Time) *member {
	i := c.usage.Issued(dev)
	return &member{c: c, dev: dev, lastIssued: i, charged: i, lastTake: now.Add(-busyHold),
		probe: probeStart, creditAt: now}
}

// add makes m a member, looked at from the next tick.
func (g *gpu) add(m *member) {
	g.members = append(g.members, m)
	g.activate(m)
}

// remove forgets m, at now. A drain of its work ends there: its ledger
// closes with it, and the next owner's gate would otherwise wait on marks
// that no longer come.
func (g *gpu) remove(m *member, now time.Time) {
	g.members = without(g.members, m)
	g.active = without(g.active, m)
	if g.owner == m {
		g.owner = nil
	}
	if g.draining == m {
		g.endDrain(now)
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
		FreeWeight: policy.FreeWeight(n, cs), Containers: len(g.members), Slices: g.counts}
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

// measure takes a new reading of busy ns per container, dt after the
// last: the achieved share of a GPU whose policy does not gate launches (a
// gated member's is what the clock charged it, tick).
func (g *gpu) measure(busy map[string]uint64, dt time.Duration) {
	if dt <= 0 {
		return
	}
	alpha := 1 - math.Exp(-float64(dt)/float64(shareTau))
	for _, m := range g.members {
		b := busy[m.c.key]
		if !m.haveBusy || b < m.lastBusy { // first reading: the window starts here
			m.lastBusy, m.haveBusy = b, true
			continue
		}
		db := float64(b - m.lastBusy)
		m.lastBusy = b
		if !g.eff.Gated() {
			m.achieved += (min(db/float64(dt), 1) - m.achieved) * alpha
		}
	}
}

// costFromSlice updates m's device time per ticket from the slice it just
// ended: the clock time it was charged (start to drained) over the tickets
// that ran in it (passed: its tickets past the gate at the slice's end; of a
// slice its owner keeps, some have yet to run, as some that ran in it passed
// before it began, and the two even out). The measure holds whatever the
// estimate was: one too low released more than the device ran, and the
// slice lasted until it had run; one too high released less, but a
// lookahead (more than a tick) at a time, so the device ran more tickets
// than the estimate allowed for, unless the owner itself left it idle (then
// the measure is its own pace).
func (g *gpu) costFromSlice(m *member, passed uint64) {
	tickets := float64(passed - min(passed, m.slice0))
	if tickets >= 1 && m.spent > 0 {
		if sample := max(m.spent/tickets, minCostNs); m.cost == 0 {
			m.cost = sample
		} else {
			m.cost += (sample - m.cost) * costGain
		}
	}
	m.spent = 0
	g.longest = 0
	for _, x := range g.members {
		g.longest = max(g.longest, x.costNs())
	}
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
// behind what the previous owner left on the device). Where its completion
// marks say work it released has yet to run, it is not idle: it is
// synchronizing on more than that (a training step launches ahead of the
// device as fast as each tick releases), and its slice is still in use.
func (g *gpu) ownerIdle(now time.Time, cfg Config) bool {
	m := g.owner
	if m.c.marks && !m.waiting {
		if _, ran := m.ranTo(m.passed()); !ran {
			return false
		}
	}
	after := cfg.Lookahead + 2*cfg.Tick + time.Duration(2*m.costNs())
	if g.draining != nil {
		after += now.Sub(g.closedAt)
	}
	return !m.waiting && now.Sub(m.lastTake) > min(after, 200*time.Millisecond)
}

// observe reads a member's gate: the tickets it took and whether a launch
// waits. It says whether the member's busy state changed.
func (g *gpu) observe(m *member, now time.Time) bool {
	issued, grant := m.c.usage.Issued(m.dev), m.c.limits.Grant(m.dev)
	if issued < m.lastIssued { // a forged (or reset) ledger: start counting again
		m.lastIssued, m.charged = issued, issued
		m.rewinds++
		// and take back the grant above it, which the forgery would
		// otherwise turn into launches outside its slices
		_ = m.c.limits.CloseGrant(m.dev, issued)
	}
	// A ticket counts as taken when its launch passes the gate: a launch
	// that waited since long ago has only now begun.
	if issued > m.lastIssued {
		m.lastTicket = now
	}
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

	// Credit: earned at the target share of wall time. The clock's member
	// pays the wall time it holds the device (a time slice, until its work
	// has run); others pay for tickets they take outside a slice.
	slice := g.sliceLen(cfg)
	g.runClock(now, cfg)
	alpha := 1 - math.Exp(-dt/float64(shareTau))
	for _, m := range g.active {
		// Tickets that passed its gate (not those that wait: they run, and
		// are charged, in its slice).
		passed := m.passed()
		took := float64(passed-min(passed, m.charged)) * m.costNs()
		m.charged = max(m.charged, passed)
		charge := took
		if m == g.owner || m == g.draining {
			charge = 0
		}
		charge += m.clockDue
		m.paid += charge
		if dt > 0 { // what it pays for, in and out of slices
			m.achieved += (min(charge/dt, 1) - m.achieved) * alpha
		}
		m.clockDue = 0
		// A busy member holds up to (members+1) slices of credit at an
		// equal share, and in proportion to its share otherwise: the same
		// standing for all. Credit grows in the wall time nobody is charged
		// for (a drain's end to the loop's next look: about 1 ms a hand-over
		// on an H200 when it looked every millisecond), so the cap is met;
		// a cap the larger share met first handed the smaller what the
		// larger lost there (1:2 held at 1.95:1).
		hi := slice
		if m.busy {
			n := float64(len(g.members))
			hi = slice * (n + 1) * n * m.target
		}
		m.accrue(now, charge, hi, slice, cfg)
	}

	// The slice: the owner keeps it for the slice's length while it uses the
	// device and no high-priority container waits; then the waiting
	// container with (positive) credit that stands best takes the device.
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
	if g.draining != nil && g.closedAt.Equal(now) {
		// A gate closed in this tick: an owner that waited at it with its
		// work run has nothing to drain, and the next owner's gate opens now,
		// not a drain poll later.
		g.runClock(now, cfg)
	}
	defer g.deactivate(now)
	if g.owner == nil {
		return
	}
	g.starve(g.owner)
	g.release(g.owner, now, cfg)
	// Soft: while the owner leaves the device idle (it does not wait at its
	// gate, and its completion marks say at most borrowBelow of its work
	// has yet to run; without marks, not waiting is taken as idle), the
	// waiting container that may borrow with the most credit does, paying
	// for the tickets it takes.
	o = g.owner
	if !o.waiting && (!o.c.marks || o.nearlyRun(borrowBelow)) {
		var b *member
		for _, m := range g.active {
			if m != o && m.borrow && m.waiting && (b == nil || m.standing() > b.standing()) {
				b = m
			}
		}
		if b != nil {
			// Little at a time (borrowBelow): the owner's next launch runs
			// after what was lent.
			want := b.lastIssued + uint64(max(1, math.Ceil(float64(borrowBelow)/b.costNs())))
			if b.cost == 0 {
				want = min(want, b.lastIssued+b.probe)
			}
			_ = b.c.limits.RaiseGrant(b.dev, want)
		}
	}
}

// standing is m's credit in units of its share: how far behind what it is
// owed it is, as the wall time it would take to earn that back. Picking by
// it rather than by credit keeps what each gets in the ratio of their
// shares when some wall time goes to nobody (the gap between one owner's
// drain and the next owner's first tick, idle owners): all earn in that
// time in proportion to their shares, and evening out raw credit would
// hand the larger share the difference (2% at 1:2 when 1% goes to nobody).
func (m *member) standing() float64 { return m.credit / max(m.target, minTarget) }

// minTarget keeps standing finite for a member whose share is 0.
const minTarget = 1e-6

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
		if m.credit > 0 && (best == nil || m.standing() > best.standing()) {
			best = m
		}
	}
	if best == nil { // soft: a container may borrow what nobody with credit wants
		for _, m := range cands {
			if m.borrow && (best == nil || m.standing() > best.standing()) {
				best = m
			}
		}
	}
	return best
}

func (g *gpu) begin(m *member, now time.Time, cfg Config) {
	if o := g.owner; o != nil {
		if o.cost == 0 && o.lastIssued >= g.sliceIssued0+o.probe && o.probe < 1<<20 {
			o.probe *= 2
		}
		if o != m {
			g.close(o, now)
		}
	}
	if m != nil && m == g.owner && m != g.draining && !g.othersWait(m) {
		// The owner keeps the device, nobody else waiting: its slice is
		// measured as one that closed (a container alone on a GPU is never
		// closed, and would otherwise keep the prior estimate, which starves
		// short kernels). Not while others wait: then the owner's gate may
		// have held its launches back for its share (fixed shares, caps),
		// and time without tickets would read as a dear launch, which
		// releases fewer, which slows it again.
		g.costFromSlice(m, m.passed())
	}
	g.owner, g.sliceStart = m, now
	if m != nil {
		g.sliceIssued0 = m.lastIssued
		if m != g.draining {
			m.slice0, m.spent = m.passed(), 0
		}
	}
}

// close ends o's slice: its gate takes back the tickets it was released and
// did not use, and its clock runs on until the work it launched has run.
func (g *gpu) close(o *member, now time.Time) {
	issued := o.c.usage.Issued(o.dev)
	_ = o.c.limits.CloseGrant(o.dev, issued)
	if g.draining != nil { // a drain not over yet ends here
		g.settleDrain(now, now)
	}
	// What passed the gate before it closed (a launch that waits has taken
	// a ticket, and runs in a later slice).
	g.draining, g.closedAt, g.closePassed = o, now, min(issued, o.c.limits.Grant(o.dev))
	g.counts.Handovers++
}

// runClock charges the clock's member the wall time since the last tick:
// the draining previous owner until its work has run, then the owner.
func (g *gpu) runClock(now time.Time, cfg Config) {
	if g.clockAt.IsZero() || g.clockAt.After(now) {
		g.clockAt = now
	}
	if d := g.draining; d != nil {
		end, ok := g.drained(now, cfg)
		if !ok {
			d.charge(float64(now.Sub(g.clockAt)))
			g.clockAt = now
			return
		}
		if now.Sub(g.closedAt) >= maxDrain {
			g.counts.DrainsCapped++
		}
		g.settleDrain(end, now)
	}
	if o := g.owner; o != nil {
		o.charge(float64(g.idleSince(o, now).Sub(g.clockAt)))
	}
	g.clockAt = now
}

// idleSince is when the owner's clock stopped, at the latest now: when it
// launches nothing (it waits at no gate) and a completion mark that covers
// every ticket it took says its work had all run, the device has idled
// since then for want of its work, and the time is not its.
func (g *gpu) idleSince(o *member, now time.Time) time.Time {
	t, ok := ranOut(o, now)
	switch {
	case !ok:
		return now
	case t.Before(g.clockAt):
		return g.clockAt
	}
	return t
}

// ranOut says when m's work had all run, if it has and m launches nothing
// (it waits at no gate): what its latest completion mark says, where that
// mark covers every ticket it took.
func ranOut(m *member, now time.Time) (time.Time, bool) {
	if m.waiting || !m.c.marks {
		return time.Time{}, false
	}
	done, ok := m.ranTo(m.passed())
	if !ok {
		return time.Time{}, false
	}
	return markTime(done, now), true
}

// ranTo says whether m's latest completion mark saw the work of every ticket
// up to ticket run, and when (CLOCK_MONOTONIC ns).
func (m *member) ranTo(ticket uint64) (done uint64, ok bool) {
	done, ok = m.c.usage.Mark(m.dev, ticket)
	return done, ok && done != 0
}

// markTime places a completion mark's CLOCK_MONOTONIC time on the loop's
// clock, no later than now.
func markTime(done uint64, now time.Time) time.Time {
	mono := controlblock.MonotonicNs()
	return now.Add(-time.Duration(mono - min(done, mono)))
}

// drainWait is how soon the loop looks again for the end of a drain that a
// next owner waits for (0: none).
func (g *gpu) drainWait(now time.Time) time.Duration {
	switch {
	case g.draining == nil || g.owner == nil:
		return 0
	case now.Sub(g.closedAt) < drainLong:
		return drainPoll
	}
	return drainPollLate
}

// settleDrain ends the drain at end, seen at now: the previous owner is
// charged up to end, and the owner's clock and slice start now, when its
// gate opens (release, in the same tick). The device idled in between for
// want of a tick, which is nobody's time: charged to the owner, it would
// cost a container that takes the device from another more than one that
// keeps it, and so the smaller share most.
func (g *gpu) settleDrain(end, now time.Time) {
	d := g.draining
	if end.Before(g.clockAt) {
		end = g.clockAt
	}
	d.charge(float64(end.Sub(g.clockAt)))
	g.counts.DrainSeconds += max(end.Sub(g.closedAt), 0).Seconds()
	g.counts.GapSeconds += now.Sub(end).Seconds()
	g.endDrain(now)
	if d != g.owner { // the same member's next slice goes on counting
		g.costFromSlice(d, g.closePassed)
	}
}

// endDrain ends the drain at now: the owner's clock and slice start now.
func (g *gpu) endDrain(now time.Time) {
	g.draining = nil
	g.clockAt = now
	if g.owner != nil {
		g.sliceStart = now
	}
}

// starve lowers the owner's cost estimate when it waits at its gate with
// all its released work run (its completion mark says so): the device
// idles for want of a grant, so the estimate, which sized the grant, is
// too high. Without this, an estimate up to Lookahead/Tick times too high
// would hold: each tick's grant would last until the next.
func (g *gpu) starve(o *member) {
	if o.cost == 0 || !o.waiting || !o.c.marks || g.draining != nil {
		return
	}
	if _, ok := o.ranTo(o.passed()); ok {
		o.cost = max(o.cost*starveFactor, minCostNs)
	}
}

// nearlyRun says m's completion marks show at most about ns of its passed
// work (at its estimated cost) yet to run.
func (m *member) nearlyRun(ns time.Duration) bool {
	passed, left := m.passed(), uint64(float64(ns)/m.costNs())
	_, ok := m.ranTo(passed - min(passed, left))
	return ok
}

// othersWait says a member other than o waits at its gate.
func (g *gpu) othersWait(o *member) bool {
	for _, m := range g.active {
		if m != o && m.waiting {
			return true
		}
	}
	return false
}

// passed is how many of m's tickets have passed its gate: those its grant
// covers (the rest wait).
func (m *member) passed() uint64 { return min(m.lastIssued, m.c.limits.Grant(m.dev)) }

// charge adds ns of the clock to m's due and to its slice's.
func (m *member) charge(ns float64) {
	m.clockDue += ns
	m.spent += ns
}

// drained says when the draining owner's work has run, if it has: when its
// completion marks say so (a launch that waited at its gate, or a
// synchronize, with every ticket that passed before the close behind it saw
// the work before it done), bounded by the close and now.
// A ledger older than marks has none: its work is taken to have run a
// lookahead after the close if it launched within a lookahead before it.
// A drain never lasts longer than maxDrain (a container that computes on
// the host after its last launch, without synchronizing, pays for that
// time until its next launch).
func (g *gpu) drained(now time.Time, cfg Config) (time.Time, bool) {
	d := g.draining
	if now.Sub(g.closedAt) >= maxDrain {
		return now, true
	}
	done, marked := d.c.usage.Mark(d.dev, g.closePassed)
	if marked && done == 0 {
		return time.Time{}, false
	}
	if marked {
		t := markTime(done, now)
		if t.Before(g.closedAt) {
			t = g.closedAt
		}
		return t, true
	}
	if d.c.marks {
		return time.Time{}, false // its next launch or synchronize marks it
	}
	t := g.closedAt
	if g.closedAt.Sub(d.lastTicket) < cfg.Lookahead {
		t = g.closedAt.Add(cfg.Lookahead)
	}
	return t, !t.After(now)
}

// release raises the owner's grant: a lookahead of device time past what it
// has taken and, while another container waits, no further than the end of
// its slice (what it does not use by then is taken back when its gate
// closes; an owner that nobody waits for keeps the device, and a grant cut
// at each slice's end would idle it until the next tick). A slice always
// runs its full length (the owner's credit may go into debt, paid back
// before its next slice), so that switching costs the same share of every
// container's time.
// sliceLen is a slice's length: Config.Slice, or longer where kernels are
// long, so that a slice holds several of them (the device would otherwise
// switch, and wait for the previous owner's last kernel, every kernel or two).
func (g *gpu) sliceLen(cfg Config) float64 {
	return max(float64(cfg.Slice), 4*g.longest)
}

func (g *gpu) release(o *member, now time.Time, cfg Config) {
	if g.draining != nil && g.draining != o {
		return // its slice starts once the previous owner's work has run
	}
	c := o.costNs()
	tickets := func(ns float64) uint64 { return uint64(max(1, math.Ceil(ns/c))) }
	ahead := float64(cfg.Lookahead)
	if g.othersWait(o) {
		ahead = min(ahead, g.sliceLen(cfg)-float64(now.Sub(g.sliceStart)))
	}
	if ahead <= 0 {
		return
	}
	want := o.lastIssued + tickets(ahead)
	if o.cost == 0 {
		want = min(want, g.sliceIssued0+o.probe)
	}
	if want > o.c.limits.Grant(o.dev) {
		_ = o.c.limits.RaiseGrant(o.dev, want)
	}
}
