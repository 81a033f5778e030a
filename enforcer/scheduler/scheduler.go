// Package scheduler holds the containers sharing each GPU to the shares
// enforcer/policy gives them, by raising the launch grants in their control
// blocks (see enforcer/interposer/README.md, "Launch gate").
//
// How it controls: time slices. On each gated GPU at most one container (the
// owner) is given new grants at a time, for a slice of up to Config.Slice;
// the others' launches wait at the gate. The owner is the waiting container
// with the most credit; credit accrues at the container's target share of
// wall time and is spent as it uses the device. Only one container's work
// reaches the device at a time, so the device does not interleave
// containers kernel by kernel (which costs a context switch on a GPU and, on
// simgpu, a hand-off), and the shares do not depend on how the device
// arbitrates between queued work.
//
// How it measures: on its own clock. A slice's owner is charged the wall
// time from the slice's start until the last work it launched has run,
// which the interposer's completion marks say (enforcer/interposer/README.md,
// "Launch gate"): at the slice's end its gate closes (the grant drops to the
// tickets taken, so what it was released and did not use waits for its next
// slice) and its clock runs on while its queued work drains; the next
// owner's gate opens, and its clock starts, when the drain ends. Time in
// which the owner launches nothing and its marks say its work has run is
// not charged. A grant is in tickets (one per launch, a CUDA graph is one
// launch): each container's device time per ticket is estimated from its
// slices (clock time over the tickets that ran in them), and a slice
// releases a lookahead of it at a time; an estimate that is off makes the
// queue deeper or shallower, not the charge wrong. NVML is not the meter:
// NVIDIA's per-process utilization is a sample stream too coarse for 50 ms
// slices. Source feeds only the achieved share of GPUs whose policy does
// not gate launches (it is not read while none has containers); the
// collector judges NVML's share, over a minute, against the target (the
// over_share breach).
//
// What a tick costs: it looks at the containers that use or wait for a GPU,
// and at idle ones in turns (Config.IdlePoll); shares are planned again only
// when a container's busy state, settings or presence change. While no
// container uses or waits for any GPU, and every GPU is shared by many
// (idleBatch or more), the loop ticks every Config.IdlePoll instead,
// looking at every idle container each time: a wakeup costs more than the
// few reads it makes.
//
// A dead agent never stops the workloads: the loop writes each container's
// heartbeat; if the agent dies the interposer lets launches through after the
// limits file's grace period (GraceNs, 10 s by default). Stop and
// RemoveContainer lift the gates at once (gate_mask bit cleared).
package scheduler

import (
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
	"github.com/gpuwarden/gpuwarden/enforcer/policy"
	"github.com/gpuwarden/gpuwarden/enforcer/vocab"
)

// DefaultSlice is Config.Slice's default, the agent's enforcement.timeSlice.
const DefaultSlice = 50 * time.Millisecond

// Config tunes the loop. Zero values take the defaults.
type Config struct {
	Source    Source        // device time per container, for the achieved share where launches are not gated; nil: none
	Tick      time.Duration // how often grants are decided (default 5ms)
	Slice     time.Duration // longest time slice (default 50ms)
	Lookahead time.Duration // device time released ahead of the device (default 10ms)
	Measure   time.Duration // how often Source is read (default 100ms)
	Heartbeat time.Duration // how often heartbeats are written (default 100ms)
	Ledger    time.Duration // how often ledgers are read for claims and throttled time (default 500ms)
	IdlePoll  time.Duration // how often, at most, an idle container's gate is looked at (default 250ms; every tick on GPUs shared by fewer than 64)
	MaxInst   int           // every GPU's max_inst unless SetGPU sets one (0: policy.MaxInst's default)
}

func (c *Config) defaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.Tick, 5*time.Millisecond)
	def(&c.Slice, DefaultSlice)
	def(&c.Lookahead, 10*time.Millisecond)
	def(&c.Measure, 100*time.Millisecond)
	def(&c.Heartbeat, 100*time.Millisecond)
	def(&c.Ledger, 500*time.Millisecond)
	def(&c.IdlePoll, 250*time.Millisecond)
}

// Settings are a container's compute settings.
type Settings struct {
	Weight     int  // 1-vocab.MaxWeight (0: 1, policy.Weight)
	CapPercent int  // hard cap, 1-100; 0: none
	High       bool // high priority
	// FromClaims takes weight, cap and priority from what the container's
	// environment claims in its ledger (off Kubernetes); the fields above
	// are then ignored.
	FromClaims bool
}

// GPUSettings are a GPU's scheduling settings.
type GPUSettings struct {
	Policy    policy.Policy
	PolicySet bool // false: policy.Effective chooses (weighted when a weight is above 1)
	MaxInst   int  // 0: Config.MaxInst
}

// Device is one GPU of a container: its CUDA ordinal in the container (its
// control block's index) and the GPU's UUID (what the scheduler knows the
// GPU by: ordinals are renumbered in each container).
type Device struct {
	Ordinal int
	UUID    string
}

// GPUStatus is one GPU's scheduling state.
type GPUStatus struct {
	UUID       string
	Policy     policy.Policy // in force
	PolicySet  bool
	MaxInst    int // in force
	FreeWeight int // cGPU's free_weight: max_inst less its containers' weights
	Containers int
	Slices     SliceCounts
}

// Status is one container's state on one device.
type Status struct {
	Key              string
	GPU              string // UUID
	Ordinal          int    // the GPU's CUDA ordinal in the container
	Policy           policy.Policy
	Gated            bool
	Busy             bool
	Weight           int // settings in force (from claims where Settings.FromClaims)
	CapPercent       int
	High             bool
	Target           float64 // share it is held to (gpuwarden_container_compute_limit_ratio)
	Achieved         float64 // measured share over about the last second: the clock's charge where gated, else Source's
	ChargedSeconds   float64 // device time the clock charged it on this GPU, ever (monotonic; gated GPUs only)
	ThrottledSeconds float64 // time its launches waited at the gate, all processes, ever (monotonic)
	Launches         uint64  // gate tickets taken on the device
	CostNs           float64 // estimated device time per ticket
	// Rewinds counts the times the container's ledger showed fewer tickets
	// than before: a forged launches_issued, which lets its launches up to
	// the grant through unthrottled until measured device time is charged.
	Rewinds uint64
}

// ErrUnknownContainer is returned for a key that was never added.
var ErrUnknownContainer = errors.New("unknown container")

// Scheduler runs the enforcer's loop for every GPU of a node.
type Scheduler struct {
	cfg Config

	mu         sync.Mutex
	containers map[string]*container
	gpus       map[string]*gpu // by UUID
	stop       chan struct{}
	done       chan struct{}
	lastMeas   time.Time
	ungated    bool // a GPU with containers does not gate launches (set by tick, read by the loop)
	lastBeat   time.Time
	lastLedger time.Time
	// ledgerRound counts ledger rounds; unclaimed holds the containers
	// whose settings come from claims their ledger does not hold yet.
	ledgerRound int
	unclaimed   map[string]*container
}

type container struct {
	key      string
	limits   *controlblock.LimitsFile
	usage    *controlblock.UsageFile
	devices  []Device
	settings Settings
	eff      Settings // settings in force (claims resolved)
	gated    uint32   // gate_mask bits this scheduler set

	claimsSeen bool                    // the ledger's claims were there when last read
	marks      bool                    // its interposer leaves completion marks (ledger minor 3)
	totals     controlblock.ProcTotals // throttled time over processes that came and went
	reserved   [controlblock.MaxDevices]uint64
	pids       []uint32
	members    []*member // one per device
}

// active says the container uses or waits for one of its GPUs.
func (c *container) active() bool {
	for _, m := range c.members {
		if m.active {
			return true
		}
	}
	return false
}

// New makes a scheduler; Start runs it.
func New(cfg Config) *Scheduler {
	cfg.defaults()
	return &Scheduler{cfg: cfg, containers: map[string]*container{}, gpus: map[string]*gpu{}, unclaimed: map[string]*container{}}
}

func validate(st Settings) error {
	if st.FromClaims {
		return nil
	}
	if st.Weight != 0 { // 0: not set
		if err := vocab.CheckWeight(st.Weight); err != nil {
			return err
		}
	}
	if st.CapPercent != 0 { // 0: no cap
		return vocab.CheckCapPercent(st.CapPercent)
	}
	return nil
}

// AddContainer puts a container under the scheduler on the given devices.
// The agent owns the files (it created limits with CreateLimits and maps
// the ledger read-only) and closes them after RemoveContainer.
func (s *Scheduler) AddContainer(key string, limits *controlblock.LimitsFile, usage *controlblock.UsageFile, devices []Device, st Settings) error {
	if limits == nil || usage == nil {
		return errors.New("add container: limits and usage are required")
	}
	if err := validate(st); err != nil {
		return fmt.Errorf("add container %s: %w", key, err)
	}
	for _, d := range devices {
		if d.Ordinal < 0 || d.Ordinal >= controlblock.MaxDevices || d.UUID == "" {
			return fmt.Errorf("add container %s: no device %d (%q)", key, d.Ordinal, d.UUID)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.containers[key]; ok {
		return fmt.Errorf("add container %s: already added", key)
	}
	c := &container{key: key, limits: limits, usage: usage, devices: append([]Device(nil), devices...),
		settings: st, eff: st}
	s.containers[key] = c
	s.readLedger(c)
	limits.Heartbeat()
	now := time.Now()
	for _, d := range devices {
		g := s.gpus[d.UUID]
		if g == nil {
			g = &gpu{uuid: d.UUID, lastTick: now}
			s.gpus[d.UUID] = g
		}
		m := newMember(c, d.Ordinal, now)
		c.members = append(c.members, m)
		g.add(m)
	}
	for _, d := range devices {
		s.gpus[d.UUID].plan(now, s.cfg)
	}
	return nil
}

// RemoveContainer lifts the container's gates and forgets it.
func (s *Scheduler) RemoveContainer(key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.containers[key]
	if c == nil {
		return fmt.Errorf("remove %s: %w", key, ErrUnknownContainer)
	}
	c.setGates(0)
	delete(s.containers, key)
	delete(s.unclaimed, key)
	now := time.Now()
	for _, d := range c.devices {
		g := s.gpus[d.UUID]
		for _, m := range g.members {
			if m.c == c {
				g.remove(m, now)
				break
			}
		}
	}
	return nil
}

// SetContainer changes a container's weight, cap or priority; targets change
// at once, grants from the next tick.
func (s *Scheduler) SetContainer(key string, st Settings) error {
	if err := validate(st); err != nil {
		return fmt.Errorf("set %s: %w", key, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.containers[key]
	if c == nil {
		return fmt.Errorf("set %s: %w", key, ErrUnknownContainer)
	}
	c.settings = st
	s.readLedger(c)
	for _, d := range c.devices {
		s.gpus[d.UUID].plan(time.Now(), s.cfg)
	}
	return nil
}

// SetGPU changes a GPU's policy or max_inst; targets change at once,
// grants from the next tick.
func (s *Scheduler) SetGPU(uuid string, gs GPUSettings) error {
	if gs.PolicySet && !gs.Policy.Valid() {
		return fmt.Errorf("set gpu %s: %v is not a policy", uuid, gs.Policy)
	}
	if gs.MaxInst != 0 {
		if err := vocab.CheckMaxInst(gs.MaxInst); err != nil {
			return fmt.Errorf("set gpu %s: %w", uuid, err)
		}
	}
	if uuid == "" {
		return errors.New("set gpu: no UUID")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.gpus[uuid]
	if g == nil {
		g = &gpu{uuid: uuid, lastTick: time.Now()}
		s.gpus[uuid] = g
	}
	g.settings = gs
	g.plan(time.Now(), s.cfg)
	return nil
}

// Start runs the loop in a goroutine.
func (s *Scheduler) Start() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stop != nil {
		return
	}
	s.stop, s.done = make(chan struct{}), make(chan struct{})
	go s.loop(s.stop, s.done)
}

// Stop ends the loop and lifts every gate it set, so the workloads run on
// ungated (an agent that dies instead relies on the grace period).
func (s *Scheduler) Stop() {
	s.mu.Lock()
	stop, done := s.stop, s.done
	s.stop = nil
	s.mu.Unlock()
	if stop == nil {
		return
	}
	close(stop)
	<-done
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.containers {
		c.setGates(0)
	}
	for _, g := range s.gpus {
		g.owner = nil
	}
}

// Status reports every container on every GPU, ordered by key and ordinal.
func (s *Scheduler) Status() []Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Status
	for _, g := range s.gpus {
		for _, m := range g.members {
			out = append(out, Status{Key: m.c.key, GPU: g.uuid, Ordinal: m.dev, Policy: g.eff, Gated: g.eff.Gated(), Busy: m.busy,
				Weight: m.c.eff.Weight, CapPercent: m.c.eff.CapPercent, High: m.c.eff.High,
				Target: m.target, Achieved: m.achieved, ChargedSeconds: m.paid / 1e9, ThrottledSeconds: float64(m.c.throttledNow()) / 1e9,
				Launches: m.lastIssued, CostNs: m.cost, Rewinds: m.rewinds})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Key != out[j].Key {
			return out[i].Key < out[j].Key
		}
		return out[i].Ordinal < out[j].Ordinal
	})
	return out
}

// GPUs returns the scheduling state of each GPU that has containers or
// settings, by UUID.
func (s *Scheduler) GPUs() []GPUStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []GPUStatus
	for _, g := range s.gpus {
		out = append(out, g.status(s.cfg))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].UUID < out[j].UUID })
	return out
}

// GPU returns one GPU's scheduling state; a GPU with neither containers nor
// settings has the defaults.
func (s *Scheduler) GPU(uuid string) GPUStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.gpus[uuid]
	if g == nil {
		g = &gpu{uuid: uuid, eff: policy.Effective(0, false, nil)}
	}
	return g.status(s.cfg)
}

// PidMapper maps a process to a container by the pids in the ledgers (the
// container's view of pids: right where the agent shares the workloads' pid
// namespace, as in tests and the demo).
func (s *Scheduler) PidMapper() PidMapper {
	return func(pid uint32) (string, bool) {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, c := range s.containers {
			for _, p := range c.pids {
				if p == pid {
					return c.key, true
				}
			}
		}
		return "", false
	}
}

func (s *Scheduler) loop(stop, done chan struct{}) {
	defer close(done)
	t := time.NewTimer(s.cfg.Tick)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		for {
			next := s.round()
			if next >= time.Millisecond {
				t.Reset(next)
				break
			}
			// A drain's end is waited for in a nanosleep: the runtime's
			// timers wake a millisecond late or more (the netpoller sleeps
			// in whole milliseconds), and every hand-over would leave the
			// device that much longer to nobody.
			_ = unix.Nanosleep(&unix.Timespec{Nsec: int64(max(next, 0))}, nil)
			select {
			case <-stop:
				return
			default:
			}
		}
	}
}

// round runs one tick and says how long until the next.
func (s *Scheduler) round() time.Duration {
	var busy map[string]map[string]uint64
	now := time.Now()
	// Only a GPU whose policy does not gate launches takes its shares
	// from the source (gated ones are charged on the loop's clock).
	if s.cfg.Source != nil && s.ungated && now.Sub(s.lastMeas) >= s.cfg.Measure {
		busy, _ = s.cfg.Source.Busy() // on error, shares keep their last values
	}
	next := s.cfg.Tick
	switch quiet, drain := s.tick(now, busy); {
	case drain > 0: // the next owner waits for the drain's end: see it soon
		next = min(next, drain)
	case quiet:
		next = max(next, s.cfg.IdlePoll)
	}
	return next - time.Since(now)
}

// tick runs one round for every GPU; busy is a new measurement or nil. It
// says whether every GPU is quiet, and how soon to look again where a next
// owner waits for a previous owner's work to drain (0: none waits).
func (s *Scheduler) tick(now time.Time, busy map[string]map[string]uint64) (quiet bool, drain time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	full := now.Sub(s.lastLedger) >= s.cfg.Ledger
	if full {
		s.lastLedger = now
	}
	if full {
		// Ledgers of containers that use no GPU now change little: every
		// 4th round.
		s.ledgerRound++
		for _, c := range s.containers {
			if s.ledgerRound%4 == 0 || c.active() {
				s.readLedger(c)
			}
		}
	}
	// A new ledger may not hold its claims yet: read it every tick until it does.
	for _, c := range s.unclaimed {
		s.readLedger(c)
	}
	if busy != nil {
		dt := now.Sub(s.lastMeas)
		first := s.lastMeas.IsZero()
		s.lastMeas = now
		if !first {
			for _, g := range s.gpus {
				g.measure(busy[g.uuid], dt)
			}
		}
	}
	quiet = len(s.unclaimed) == 0
	ungated := false
	for _, g := range s.gpus {
		g.tick(now, s.cfg)
		quiet = quiet && g.quiet()
		ungated = ungated || len(g.members) > 0 && !g.eff.Gated()
		if w := g.drainWait(now); w > 0 && (drain == 0 || w < drain) {
			drain = w
		}
	}
	s.ungated = ungated
	if now.Sub(s.lastBeat) >= s.cfg.Heartbeat {
		s.lastBeat = now
		beat := controlblock.MonotonicNs()
		for _, c := range s.containers {
			c.limits.HeartbeatAt(beat)
		}
	}
	return quiet, drain
}

// readLedger refreshes claims, per-device reservations, pids and throttled
// time; where settings in force or presence on a device change, that GPU
// plans again.
func (s *Scheduler) readLedger(c *container) {
	eff, reserved := c.eff, c.reserved
	defer func() {
		for _, d := range c.devices {
			if g := s.gpus[d.UUID]; g != nil && (c.eff != eff || (c.reserved[d.Ordinal] > 0) != (reserved[d.Ordinal] > 0)) {
				g.dirty = true
			}
		}
	}()
	snap, err := c.usage.Snapshot()
	if err != nil {
		c.eff = c.settings
		if c.eff.FromClaims {
			c.eff = Settings{}
		}
		c.eff.Weight = policy.Weight(c.eff.Weight)
		return
	}
	c.eff = c.settings
	c.marks = snap.ABIMinor >= 3
	c.claimsSeen = snap.ClaimWeight > 0
	if c.settings.FromClaims && !c.claimsSeen {
		s.unclaimed[c.key] = c
	} else {
		delete(s.unclaimed, c.key)
	}
	if c.settings.FromClaims {
		c.eff = Settings{Weight: int(snap.ClaimWeight), CapPercent: int(snap.ClaimComputeLimit),
			High: snap.ClaimPriority == controlblock.PriorityHigh}
	}
	c.eff.Weight = policy.Weight(c.eff.Weight)
	c.reserved = snap.ReservedBytes
	c.pids = c.pids[:0]
	for _, p := range snap.Procs {
		c.pids = append(c.pids, uint32(p.Pid))
	}
	c.totals.Update(snap.Procs)
}

func (c *container) throttledNow() uint64 { return c.totals.ThrottledNs }

// setGates writes the gate_mask bits this scheduler manages; before a bit is
// set, the device's grant is brought up to the tickets already taken, so
// nothing that ran before waits for an old grant.
func (c *container) setGates(mask uint32) {
	if mask == c.gated {
		return
	}
	for d := 0; d < controlblock.MaxDevices; d++ {
		if bit := uint32(1) << d; mask&bit != 0 && c.gated&bit == 0 {
			_ = c.limits.RaiseGrant(d, c.usage.Issued(d))
		}
	}
	managed := c.gated | mask
	c.limits.Update(func(cfg *controlblock.LimitsConfig) { cfg.GateMask = cfg.GateMask&^managed | mask })
	c.gated = mask
}

// setGate opens (on) or lifts the gate of device dev.
func (c *container) setGate(dev int, on bool) {
	mask := c.gated &^ (1 << dev)
	if on {
		mask |= 1 << dev
	}
	c.setGates(mask)
}
