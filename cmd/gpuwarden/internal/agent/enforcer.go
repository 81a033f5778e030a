package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/gpuwarden/gpuwarden/collector"
	"github.com/gpuwarden/gpuwarden/collector/cgroups"
	"github.com/gpuwarden/gpuwarden/collector/claims"
	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
	"github.com/gpuwarden/gpuwarden/enforcer/nvmldev"
	"github.com/gpuwarden/gpuwarden/enforcer/policy"
	"github.com/gpuwarden/gpuwarden/enforcer/scheduler"
)

// enforcement puts every container that runs the interposer under the
// scheduler (creating its `limits`, so the interposer switches to the
// agent's budgets), applies the changes `gpuwarden ctl` makes, and reports,
// freezes or kills containers in breach.
type enforcement struct {
	a        *Agent
	s        *scheduler.Scheduler
	resolver *cgroups.Resolver
	claims   *claims.Verifier
	cgroupFS string
	settings *settingsStore
	pods     *podAnnotations // nil off Kubernetes
	// node lists the node's GPUs by UUID, in NVML's index order; nil
	// without NVML (a ledger's UUIDs are then taken as they are).
	node func() ([]string, error)

	mu       sync.Mutex
	members  map[string]*member // by control-block directory
	unmapped map[string]bool    // directories already logged for a GPU of unknown UUID
	breaches breachWatch
	stop     context.CancelFunc
	done     chan struct{}
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
	// annotated is what the pod's annotations last set (zero: none yet).
	annotated scheduler.Settings
}

func (a *Agent) startEnforcement(resolver *cgroups.Resolver, verifier *claims.Verifier, cgroupFS string, pods *podAnnotations) *enforcement {
	store, err := loadSettings(a.cfg.Enforcement.StateFile)
	if err != nil {
		a.parts.set("enforcer", true, err)
		a.log.Error("enforcer not started: its saved settings cannot be read", "err", err)
		return nil
	}
	e := &enforcement{a: a, resolver: resolver, claims: verifier, cgroupFS: cgroupFS, settings: store, pods: pods,
		members: map[string]*member{}, unmapped: map[string]bool{}, done: make(chan struct{})}
	e.breaches.init()
	var src scheduler.Source
	if a.cfg.NVML.Enabled {
		if r, err := nvmldev.Open(a.cfg.NVML.Library); err == nil {
			src = scheduler.NewNVMLSource(r, e.keyOfPid)
			e.node = r.UUIDs
			a.closers = append(a.closers, r.Close)
		} else {
			a.log.Warn("enforcer without NVML: device time per launch is not measured", "err", err)
		}
	}
	// Claims and throttled time change slowly: their ledgers are read every 2 s.
	e.s = scheduler.New(scheduler.Config{Source: src, Ledger: 2 * time.Second, MaxInst: a.cfg.DevicePlugin.MaxInst})
	node, _ := e.nodeGPUs()
	saved, unknown := store.gpus(node)
	if len(unknown) > 0 {
		a.log.Warn("saved settings of GPUs by index dropped: NVML does not name those GPUs", "gpus", unknown)
	}
	for uuid, g := range saved {
		if err := e.s.SetGPU(uuid, g); err != nil {
			a.log.Warn("saved GPU settings refused", "gpu", uuid, "err", err)
		}
		if err := a.setSlots(context.Background(), slices.Index(node, uuid), g.MaxInst); err != nil {
			a.log.Warn("saved max_inst not given to the device plugin", "gpu", uuid, "err", err)
		}
	}
	e.s.Start()
	ctx, cancel := context.WithCancel(context.Background())
	e.stop = cancel
	go e.loop(ctx)
	a.parts.set("enforcer", true, nil)
	a.closers = append(a.closers, e.close)
	return e
}

// nodeGPUs lists the node's GPUs by UUID (nil without NVML).
func (e *enforcement) nodeGPUs() ([]string, error) {
	if e.node == nil {
		return nil, nil
	}
	return e.node()
}

// keyOfPid names the container a host process belongs to, by its cgroup.
func (e *enforcement) keyOfPid(pid uint32) (string, bool) {
	path, err := cgroups.OfProcess(e.a.cfg.Paths.Proc, int(pid))
	if err != nil {
		return "", false
	}
	path = cgroups.HostPath(e.a.nsRoot, path)
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, m := range e.members {
		if m.path == path {
			return m.dir, true
		}
	}
	return "", false
}

func (e *enforcement) loop(ctx context.Context) {
	defer close(e.done)
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	// New containers are taken on every round; breaches and annotations,
	// which need the whole view (a scrape's work: 70 ms of CPU at 1,000
	// containers), every 8th.
	for round := 0; ; round++ {
		e.discover()
		if round%8 == 0 {
			v := e.a.coll.View(ctx)
			e.applyAnnotations(ctx, v)
			e.checkBreaches(v)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// discover adds every container whose ledger is new and verified and
// removes those that are gone.
func (e *enforcement) discover() {
	dirs, _ := os.ReadDir(e.a.cfg.ControlDir)
	seen := map[string]bool{}
	// The node's GPUs are listed once a round, when a container needs them.
	nodeGPUs := sync.OnceValues(e.nodeGPUs)
	for _, d := range dirs {
		if !d.IsDir() {
			continue
		}
		seen[d.Name()] = true
		if err := e.track(d.Name(), nodeGPUs); err != nil {
			e.a.log.Debug("not enforcing", "dir", d.Name(), "err", err)
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for dir, m := range e.members {
		if _, alive := e.resolver.Path(m.cgroup); !seen[dir] || !alive {
			e.dropLocked(m)
		}
	}
	for dir := range e.unmapped {
		if !seen[dir] {
			delete(e.unmapped, dir)
		}
	}
}

func (e *enforcement) track(dir string, nodeGPUs func() ([]string, error)) error {
	if e.unchanged(dir) {
		return nil
	}
	cd := e.a.cfg.ControlDir
	u, err := controlblock.ReadUsage(controlblock.UsagePath(cd, dir))
	if err != nil {
		return err
	}
	// A ledger is the container's word: the same rule as the collector's
	// decides whether it speaks for the cgroup it names.
	path, err := e.claims.Verify(dir, u, e.a.coll.Assigned())
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
		e.a.log.Warn("not scheduled on GPUs its ledger names no UUID for (an old interposer?)", "container", dir, "ordinals", unknown)
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
	if err := e.s.AddContainer(dir, m.limits, m.usage, devices, e.settings.container(dir)); err != nil {
		m.close()
		return err
	}
	e.members[dir] = m
	e.a.log.Info("enforcing", "container", dir, "cgroup", path, "devices", devices)
	return nil
}

// unchanged says whether a container under the scheduler still uses the
// same devices, read from its mapped ledger: re-reading every ledger twice
// a second would cost more than the scheduling itself. One that uses a GPU
// of unknown UUID is read again, until its ledger names it.
func (e *enforcement) unchanged(dir string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	m := e.members[dir]
	if m == nil || len(m.devices) != len(m.used) {
		return false
	}
	n := 0
	for d := 0; d < controlblock.MaxDevices; d++ {
		if m.usage.Reserved(d) > 0 {
			if n >= len(m.used) || m.used[n] != d {
				return false
			}
			n++
		}
	}
	return n == len(m.used)
}

// open adopts a container's directory and maps its files, making `limits`
// from the quota its environment claims when the agent has not made one.
func (e *enforcement) open(dir string, u *controlblock.UsageSnapshot) (*member, error) {
	cd := e.a.cfg.ControlDir
	cfg := controlblock.LimitsConfig{NDev: uint32(u.NDev)}
	if u.ClaimMemorySet {
		cfg.MemLimit = u.ClaimMemLimit
	}
	lf, err := controlblock.AdoptLimits(controlblock.LimitsPath(cd, dir), cfg)
	if err != nil {
		return nil, err
	}
	grace := uint64(e.a.cfg.Enforcement.GracePeriod)
	mem, memSet := e.settings.memory(dir)
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

func (e *enforcement) dropLocked(m *member) {
	_ = e.s.RemoveContainer(m.dir)
	m.close()
	delete(e.members, m.dir)
	e.a.log.Info("no longer enforcing", "container", m.dir)
}

func (m *member) close() {
	m.limits.Close()
	m.usage.Close()
}

// targets gives the collector each container's target share per device.
func (e *enforcement) targets() map[collector.GPUKey]float64 {
	return perContainer(e, func(st scheduler.Status) (float64, bool) {
		return st.Target, st.Target > 0 && st.Policy != policy.Native
	})
}

// held gives the collector the share each container may not exceed: held
// to by the gate, with no borrowing (soft) or priority to take more.
func (e *enforcement) held() map[collector.GPUKey]float64 {
	return perContainer(e, func(st scheduler.Status) (float64, bool) {
		return st.Target, st.Gated && st.Policy != policy.Soft && !st.High && st.Target > 0 && st.Target < 1
	})
}

// rewinds gives the collector how many times the scheduler saw each
// container's launch tickets go back, per device.
func (e *enforcement) rewinds() map[collector.GPUKey]uint64 {
	return perContainer(e, func(st scheduler.Status) (uint64, bool) { return st.Rewinds, true })
}

// perContainer keys what pick takes from each container's scheduler status
// (where it says to keep it) by the container's cgroup and device, as the
// collector knows them.
func perContainer[T any](e *enforcement, pick func(scheduler.Status) (T, bool)) map[collector.GPUKey]T {
	out := map[collector.GPUKey]T{}
	byKey := e.cgroups()
	for _, st := range e.s.Status() {
		if cg, ok := byKey[st.Key]; ok {
			if v, keep := pick(st); keep {
				out[collector.GPUKey{Cgroup: cg, UUID: st.GPU}] = v
			}
		}
	}
	return out
}

// cgroups maps each member's directory to its cgroup id.
func (e *enforcement) cgroups() map[string]uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	byKey := make(map[string]uint64, len(e.members))
	for k, m := range e.members {
		byKey[k] = m.cgroup
	}
	return byKey
}

func (e *enforcement) close() error {
	e.stop()
	<-e.done
	e.s.Stop() // lifts every gate: workloads go on without the agent
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, m := range e.members {
		m.close()
	}
	e.members = map[string]*member{}
	return nil
}

// cgroupDir is a cgroup's directory in the cgroup2 filesystem.
func (e *enforcement) cgroupDir(path string) string { return filepath.Join(e.cgroupFS, path) }
