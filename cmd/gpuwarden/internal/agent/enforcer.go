package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/gpuwarden/gpuwarden/collector"
	"github.com/gpuwarden/gpuwarden/collector/cgroups"
	"github.com/gpuwarden/gpuwarden/collector/claims"
	"github.com/gpuwarden/gpuwarden/collector/nvmldev"
	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
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

	mu       sync.Mutex
	members  map[string]*member // by control-block directory
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
	devices []int
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
		members: map[string]*member{}, done: make(chan struct{})}
	e.breaches.init()
	var src scheduler.Source
	if a.cfg.NVML.Enabled {
		if r, err := nvmldev.Open(a.cfg.NVML.Library); err == nil {
			src = scheduler.NewNVMLSource(r, e.keyOfPid)
			a.closers = append(a.closers, r.Close)
		} else {
			a.log.Warn("enforcer without NVML: device time per launch is not measured", "err", err)
		}
	}
	// Claims and throttled time change slowly: their ledgers are read every 2 s.
	e.s = scheduler.New(scheduler.Config{Source: src, Ledger: 2 * time.Second, MaxInst: a.cfg.DevicePlugin.MaxInst})
	for dev, g := range store.gpus() {
		if err := e.s.SetGPU(dev, g); err != nil {
			a.log.Warn("saved GPU settings refused", "gpu", dev, "err", err)
		}
		if err := a.setSlots(context.Background(), dev, g.MaxInst); err != nil {
			a.log.Warn("saved max_inst not given to the device plugin", "gpu", dev, "err", err)
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
	for _, d := range dirs {
		if !d.IsDir() {
			continue
		}
		seen[d.Name()] = true
		if err := e.track(d.Name()); err != nil {
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
}

func (e *enforcement) track(dir string) error {
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
	var devices []int
	for d := 0; d < u.NDev; d++ {
		if u.ReservedBytes[d] > 0 {
			devices = append(devices, d)
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if m := e.members[dir]; m != nil {
		if m.cgroup == u.CgroupID && sameInts(m.devices, devices) {
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
	m.cgroup, m.path, m.devices = u.CgroupID, path, devices
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
// a second would cost more than the scheduling itself.
func (e *enforcement) unchanged(dir string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	m := e.members[dir]
	if m == nil {
		return false
	}
	n := 0
	for d := 0; d < controlblock.MaxDevices; d++ {
		if m.usage.Reserved(d) > 0 {
			if n >= len(m.devices) || m.devices[n] != d {
				return false
			}
			n++
		}
	}
	return n == len(m.devices)
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

func sameInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// targets gives the collector each container's target share per device.
func (e *enforcement) targets() map[collector.Key]float64 {
	return perContainer(e, func(st scheduler.Status) (float64, bool) {
		return st.Target, st.Target > 0 && st.Policy != policy.Native
	})
}

// held gives the collector the share each container may not exceed: held
// to by the gate, with no borrowing (soft) or priority to take more.
func (e *enforcement) held() map[collector.Key]float64 {
	return perContainer(e, func(st scheduler.Status) (float64, bool) {
		return st.Target, st.Gated && st.Policy != policy.Soft && !st.High && st.Target > 0 && st.Target < 1
	})
}

// rewinds gives the collector how many times the scheduler saw each
// container's launch tickets go back, per device.
func (e *enforcement) rewinds() map[collector.Key]uint64 {
	return perContainer(e, func(st scheduler.Status) (uint64, bool) { return st.Rewinds, true })
}

// perContainer keys what pick takes from each container's scheduler status
// (where it says to keep it) by the container's cgroup and device, as the
// collector knows them.
func perContainer[T any](e *enforcement, pick func(scheduler.Status) (T, bool)) map[collector.Key]T {
	out := map[collector.Key]T{}
	byKey := e.cgroups()
	for _, st := range e.s.Status() {
		if cg, ok := byKey[st.Key]; ok {
			if v, keep := pick(st); keep {
				out[collector.Key{Cgroup: cg, GPU: st.Device}] = v
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
