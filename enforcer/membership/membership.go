// Package membership puts every container that runs the interposer under
// the scheduler: it adopts each verified ledger's directory (creating its
// `limits`, so the interposer switches to the agent's budgets), keeps each
// container's settings, and applies the changes `gpuwarden ctl` makes.
package membership

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
	"github.com/gpuwarden/gpuwarden/enforcer/nvmldev"
	"github.com/gpuwarden/gpuwarden/enforcer/policy"
	"github.com/gpuwarden/gpuwarden/enforcer/scheduler"
	"github.com/gpuwarden/gpuwarden/enforcer/settings"
)

// Config is what enforcement needs from the rest of the agent.
type Config struct {
	ControlDir  string
	GracePeriod time.Duration // the interposer's grace before a gate closes
	MaxInst     int           // the default max_inst of every GPU
	TimeSlice   time.Duration // the scheduler's slice (0: its default)
	Settings    *settings.Store
	// NVML measures device time per launch; nil: not measured.
	NVML *nvmldev.Reader
	// Verify says which cgroup a container's ledger speaks for (the same
	// rule as the collector's), or why it speaks for none.
	Verify func(dir string, u *controlblock.UsageSnapshot) (cgroupPath string, err error)
	// Alive says whether a cgroup still exists.
	Alive func(cgroup uint64) bool
	// CgroupOf gives a host process's cgroup path, in the host's tree.
	CgroupOf func(pid int) (string, error)
	// PodContainer finds the cgroup of a container named
	// namespace/pod/container; nil off Kubernetes.
	PodContainer func(name string) (cgroup uint64, ok bool)
	// SetSlots gives the device plugin's GPU dev (NVML's index, -1: not on
	// the node) n slots, or says why not; nil without a device plugin.
	SetSlots func(ctx context.Context, dev, n int) error
	Log      *slog.Logger
}

// Members is the containers under the scheduler.
type Members struct {
	cfg Config
	s   *scheduler.Scheduler
	// node lists the node's GPUs by UUID, in NVML's index order; nil
	// without NVML (a ledger's UUIDs are then taken as they are).
	node func() ([]string, error)

	mu       sync.Mutex
	members  map[string]*member // by control-block directory
	unmapped map[string]bool    // directories already logged for a GPU of unknown UUID
	dirs     *controlblock.Dirs
	listed   uint64   // the generation of dirs last looked at whole
	pending  []string // its directories not taken on then
	// retry is when a directory that could not be taken on (its ledger
	// unreadable or its claim refused) is looked at again.
	retry map[string]retry
	stop  context.CancelFunc
	done  chan struct{}
}

// member is one container under the scheduler.
type member struct {
	dir     string
	cgroup  uint64
	path    string
	limits  *controlblock.LimitsFile
	usage   *controlblock.UsageFile
	used    []int // ordinals it holds memory on
	devices []scheduler.Device
	// applied is the compute settings last given to the scheduler.
	applied scheduler.Settings
	// badAnnotations is the fault last logged in its pod's annotations.
	badAnnotations string
}

// Start starts the scheduler with the saved GPU settings and takes in
// containers until Close.
func Start(cfg Config) *Members {
	e := &Members{cfg: cfg, members: map[string]*member{}, unmapped: map[string]bool{}, retry: map[string]retry{}, done: make(chan struct{}),
		dirs: controlblock.NewDirs(cfg.ControlDir)}
	var src scheduler.Source
	if cfg.NVML != nil {
		src = scheduler.NewNVMLSource(cfg.NVML, e.keyOfPid)
		e.node = cfg.NVML.UUIDs
	}
	// Claims and throttled time change slowly: their ledgers are read every 2 s.
	e.s = scheduler.New(scheduler.Config{Source: src, Ledger: 2 * time.Second, MaxInst: cfg.MaxInst, Slice: cfg.TimeSlice})
	node, _ := e.NodeGPUs()
	saved, unknown := cfg.Settings.GPUSettings(node)
	if len(unknown) > 0 {
		cfg.Log.Warn("saved settings of GPUs by index dropped: NVML does not name those GPUs", "gpus", unknown)
	}
	for uuid, g := range saved {
		if err := e.s.SetGPU(uuid, g); err != nil {
			cfg.Log.Warn("saved GPU settings refused", "gpu", uuid, "err", err)
		}
		if err := e.setSlots(context.Background(), slices.Index(node, uuid), g.MaxInst); err != nil {
			cfg.Log.Warn("saved max_inst not given to the device plugin", "gpu", uuid, "err", err)
		}
	}
	e.s.Start()
	// The first round before Start returns: an agent that says it is
	// ready has taken on the ledgers already there.
	e.discover(true)
	ctx, cancel := context.WithCancel(context.Background())
	e.stop = cancel
	go e.loop(ctx)
	return e
}

// setSlots gives the device plugin, when there is one, a GPU's slots.
func (e *Members) setSlots(ctx context.Context, dev, n int) error {
	if e.cfg.SetSlots == nil {
		return nil
	}
	return e.cfg.SetSlots(ctx, dev, n)
}

// NodeGPUs lists the node's GPUs by UUID (nil without NVML).
func (e *Members) NodeGPUs() ([]string, error) {
	if e.node == nil {
		return nil, nil
	}
	return e.node()
}

// keyOfPid names the container a host process belongs to, by its cgroup.
func (e *Members) keyOfPid(pid uint32) (string, bool) {
	path, err := e.cfg.CgroupOf(int(pid))
	if err != nil {
		return "", false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, m := range e.members {
		if m.path == path {
			return m.dir, true
		}
	}
	return "", false
}

func (e *Members) loop(ctx context.Context) {
	defer close(e.done)
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for round := 1; ; round++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// New containers are taken on within half a second; members are
		// looked at again (their GPUs, their cgroup) every 2 s: a thousand
		// of them twice a second would cost more than it holds.
		e.discover(round%4 == 0)
	}
}

// discover adds every container whose ledger is new and verified and
// removes those whose directory is gone; with members, it also follows the
// GPUs members use and removes those whose cgroup is gone.
func (e *Members) discover(members bool) {
	dirs, gen, err := e.dirs.Names()
	if err != nil { // keep every member until it can be read again
		e.cfg.Log.Warn("list the control directory", "err", err)
		return
	}
	// The node's GPUs are listed once a round, when a container needs them.
	nodeGPUs := sync.OnceValues(e.NodeGPUs)
	if !members && gen == e.listed {
		// The same directories: only those not taken on yet may change.
		for _, dir := range e.pending {
			e.trackLogged(dir, nodeGPUs)
		}
		e.pending = e.notMembers(e.pending)
		return
	}
	seen := make(map[string]bool, len(dirs))
	for _, dir := range dirs {
		seen[dir] = true
		if !members && e.isMember(dir) {
			continue
		}
		e.trackLogged(dir, nodeGPUs)
	}
	e.listed, e.pending = gen, e.notMembers(dirs)
	e.mu.Lock()
	defer e.mu.Unlock()
	for dir, m := range e.members {
		if !seen[dir] || (members && !e.cfg.Alive(m.cgroup)) {
			e.dropLocked(m)
		}
	}
	for dir := range e.unmapped {
		if !seen[dir] {
			delete(e.unmapped, dir)
		}
	}
	for dir := range e.retry {
		if !seen[dir] {
			delete(e.retry, dir)
		}
	}
}

// retry is a directory's next look after a failure: the wait doubles from
// retryFirst to retryMax while it keeps failing, so junk directories cost
// a few reads a minute each, not two a second (each read maps and unmaps
// the ledger). A container restarted in a new cgroup after its directory
// was refused for a while waits at most retryMax to be held by the
// scheduler again; its memory limits hold all along, and the judge sees
// the new claim at once.
type retry struct {
	at   time.Time
	wait time.Duration
}

const retryFirst, retryMax = 500 * time.Millisecond, 16 * time.Second

func (e *Members) trackLogged(dir string, nodeGPUs func() ([]string, error)) {
	now := time.Now()
	r, failed := e.retry[dir]
	if failed && now.Before(r.at) {
		return
	}
	err := e.track(dir, nodeGPUs)
	if err == nil {
		delete(e.retry, dir)
		return
	}
	e.cfg.Log.Debug("not enforcing", "dir", dir, "err", err)
	r.wait = min(max(2*r.wait, retryFirst), retryMax)
	e.retry[dir] = retry{at: now.Add(r.wait), wait: r.wait}
}

// notMembers is the directories of dirs not taken on.
func (e *Members) notMembers(dirs []string) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, dir := range dirs {
		if e.members[dir] == nil {
			out = append(out, dir)
		}
	}
	return out
}

func (e *Members) isMember(dir string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.members[dir] != nil
}

func (e *Members) track(dir string, nodeGPUs func() ([]string, error)) error {
	if e.unchanged(dir) {
		return nil
	}
	u, err := controlblock.ReadUsage(controlblock.UsagePath(e.cfg.ControlDir, dir))
	if err != nil {
		return err
	}
	// A ledger is the container's word: the same rule as the collector's
	// decides whether it speaks for the cgroup it names.
	path, err := e.cfg.Verify(dir, u)
	if err != nil {
		return fmt.Errorf("cgroup claim refused: %w", err)
	}
	node, err := nodeGPUs()
	if err != nil {
		return fmt.Errorf("list the node's GPUs: %w", err)
	}
	gpus := u.GPUs(node)
	var used, unknown []int
	var devices []scheduler.Device
	for d := 0; d < u.NDev; d++ {
		if u.ReservedBytes[d] == 0 {
			continue
		}
		used = append(used, d)
		if gpus[d] == "" {
			unknown = append(unknown, d)
			continue
		}
		devices = append(devices, scheduler.Device{Ordinal: d, UUID: gpus[d]})
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(unknown) > 0 && !e.unmapped[dir] {
		e.unmapped[dir] = true
		e.cfg.Log.Warn("not scheduled on GPUs its ledger names no UUID for (an old interposer?)", "container", dir, "ordinals", unknown)
	}
	if m := e.members[dir]; m != nil {
		if m.cgroup == u.CgroupID && slices.Equal(m.used, used) && slices.Equal(m.devices, devices) {
			return nil
		}
		e.dropLocked(m) // another cgroup, or other devices: start again
	}
	if len(devices) == 0 {
		return nil // no context yet: nothing to schedule
	}
	m, err := e.open(dir, u)
	if err != nil {
		return err
	}
	m.cgroup, m.path, m.used, m.devices = u.CgroupID, path, used, devices
	m.applied = settings.Resolve(e.cfg.Settings.Compute(dir), nil) // its pod's annotations come with the next view
	if err := e.s.AddContainer(dir, m.limits, m.usage, devices, m.applied); err != nil {
		m.close()
		return err
	}
	e.members[dir] = m
	e.cfg.Log.Info("enforcing", "container", dir, "cgroup", path, "devices", devices)
	return nil
}

// unchanged says whether a container under the scheduler still uses the
// same devices, read from its mapped ledger: re-reading every ledger twice
// a second would cost more than the scheduling itself. One that uses a GPU
// of unknown UUID is read again, until its ledger names it.
func (e *Members) unchanged(dir string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	m := e.members[dir]
	if m == nil || len(m.devices) != len(m.used) {
		return false
	}
	n := 0
	for d, r := range m.usage.ReservedAll() {
		if r > 0 {
			if n >= len(m.used) || m.used[n] != d {
				return false
			}
			n++
		}
	}
	return n == len(m.used)
}

// open adopts a container's directory and maps its files, making `limits`
// from the quota its environment claims when there is none yet.
func (e *Members) open(dir string, u *controlblock.UsageSnapshot) (*member, error) {
	cd := e.cfg.ControlDir
	cfg := controlblock.LimitsConfig{NDev: uint32(u.NDev)}
	cfg.MemLimit, _ = controlblock.MemoryLimits(nil, u)
	lf, err := controlblock.AdoptLimits(controlblock.LimitsPath(cd, dir), cfg)
	if err != nil {
		return nil, err
	}
	grace := uint64(e.cfg.GracePeriod)
	mem, memSet := e.cfg.Settings.Memory(dir)
	lf.Update(func(c *controlblock.LimitsConfig) {
		c.GraceNs = grace
		if memSet {
			c.MemLimit = mem
		}
	})
	uf, err := controlblock.OpenUsage(controlblock.UsagePath(cd, dir))
	if err != nil {
		lf.Close()
		return nil, err
	}
	return &member{dir: dir, limits: lf, usage: uf}, nil
}

func (e *Members) dropLocked(m *member) {
	_ = e.s.RemoveContainer(m.dir)
	m.close()
	delete(e.members, m.dir)
	e.cfg.Log.Info("no longer enforcing", "container", m.dir)
}

func (m *member) close() {
	m.limits.Close()
	m.usage.Close()
}

// GPUKey is a container's cgroup (its id) and one of its GPUs, by UUID as
// the enforcer knows GPUs; the collector reads Scheduling by it.
type GPUKey struct {
	Cgroup uint64
	UUID   string
}

// Scheduled is what the scheduler holds one container to on one GPU.
type Scheduled struct {
	// Target is its target share, 0-1; 0: none (the native policy).
	Target float64
	// Held: the gate holds it to Target, with no borrowing (soft) or
	// priority to take more, and Target is below the whole device.
	Held bool
	// Rewinds counts the times the scheduler (which reads launch tickets
	// every few milliseconds) saw its ledger's tickets go back.
	Rewinds uint64
	// Achieved is the share of the device the scheduler measured it take
	// over about the last second: on the agent's own clock where its
	// launches are gated (each slice from its start until its work ran).
	Achieved float64
	// Charged is the device time its clock charged it, ever, in seconds.
	Charged float64
}

// Scheduling gives what the scheduler holds each container to, per device:
// one reading of its state for a whole view.
func (e *Members) Scheduling() map[GPUKey]Scheduled {
	byKey := e.cgroups()
	status := e.s.Status()
	out := make(map[GPUKey]Scheduled, len(status))
	for _, st := range status {
		cg, ok := byKey[st.Key]
		if !ok {
			continue
		}
		var s Scheduled
		if st.Target > 0 && st.Policy != policy.Native {
			s.Target = st.Target
		}
		s.Held = st.Gated && st.Policy != policy.Soft && !st.High && st.Target > 0 && st.Target < 1
		s.Rewinds, s.Achieved, s.Charged = st.Rewinds, st.Achieved, st.ChargedSeconds
		out[GPUKey{Cgroup: cg, UUID: st.GPU}] = s
	}
	return out
}

// cgroups maps each member's directory to its cgroup id.
func (e *Members) cgroups() map[string]uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	byKey := make(map[string]uint64, len(e.members))
	for k, m := range e.members {
		byKey[k] = m.cgroup
	}
	return byKey
}

// Close stops taking in containers and stops the scheduler, which lifts
// every gate: workloads go on without the agent.
func (e *Members) Close() error {
	e.stop()
	<-e.done
	e.s.Stop()
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, m := range e.members {
		m.close()
	}
	e.members = map[string]*member{}
	return nil
}
