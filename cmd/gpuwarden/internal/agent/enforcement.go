package agent

import (
	"context"
	"time"

	"github.com/gpuwarden/gpuwarden/collector/cgroups"
	"github.com/gpuwarden/gpuwarden/collector/ledgertrust"
	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
	"github.com/gpuwarden/gpuwarden/enforcer/hostcgroup"
	"github.com/gpuwarden/gpuwarden/enforcer/membership"
	"github.com/gpuwarden/gpuwarden/enforcer/nvmldev"
	"github.com/gpuwarden/gpuwarden/enforcer/onbreach"
	"github.com/gpuwarden/gpuwarden/enforcer/settings"
)

// startEnforcement puts the node's containers under the scheduler
// (membership), and reports, freezes or kills containers in breach.
func (a *Agent) startEnforcement(resolver *cgroups.Resolver, verifier *ledgertrust.Verifier, cgroupFS string, pods *podAnnotations) *membership.Members {
	store, err := settings.Load(a.cfg.Enforcement.StateFile)
	if err != nil {
		a.parts.set("enforcer", true, err)
		a.log.Error("enforcer not started: its saved settings cannot be read", "err", err)
		return nil
	}
	cfg := membership.Config{
		ControlDir: a.cfg.ControlDir, GracePeriod: a.cfg.Enforcement.GracePeriod, MaxInst: a.cfg.DevicePlugin.MaxInst,
		TimeSlice: a.cfg.Enforcement.TimeSlice,
		Settings:  store, SetSlots: a.setSlots, Log: a.log,
		Verify: func(dir string, u *controlblock.UsageSnapshot) (string, error) {
			return verifier.Verify(dir, u, a.coll.Assigned())
		},
		Alive: func(cgroup uint64) bool {
			_, ok := resolver.Path(cgroup)
			return ok
		},
		CgroupOf: func(pid int) (string, error) {
			path, err := hostcgroup.Of(a.cfg.Paths.Proc, pid)
			return hostcgroup.HostPath(a.nsRoot, path), err
		},
		PodContainer: func(name string) (uint64, bool) {
			for _, c := range a.coll.View(context.Background()).Containers {
				if c.Namespace+"/"+c.Pod+"/"+c.Container == name {
					return c.CgroupID, true
				}
			}
			return 0, false
		},
	}
	if a.cfg.NVML.Enabled {
		if r, err := nvmldev.Open(a.cfg.NVML.Library); err == nil {
			cfg.NVML = r
			a.closers = append(a.closers, r.Close)
		} else {
			a.log.Warn("enforcer without NVML: device time per launch is not measured", "err", err)
		}
	}
	e := membership.Start(cfg)
	a.settings = store
	a.breaches = onbreach.New(onbreach.Config{Action: a.cfg.BreachAction(), Scope: a.cfg.Enforcement.BreachScope,
		CgroupFS: cgroupFS, ProcRoot: a.cfg.Paths.Proc, NSRoot: a.nsRoot, Log: a.log})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go a.watchContainers(ctx, done, e, pods)
	a.parts.set("enforcer", true, nil)
	a.closers = append(a.closers, func() error {
		cancel()
		<-done
		return e.Close()
	})
	return e
}

// watchContainers holds containers to their pods' annotations and acts on
// breaches, every 4 s: both need the collector's whole view (a scrape's
// work: 70 ms of CPU at 1,000 containers). While a view leaves a breach
// to be decided (a bypass needs a second view), it looks again after a
// second, so the decision is not 4 s late.
func (a *Agent) watchContainers(ctx context.Context, done chan<- struct{}, e *membership.Members, pods *podAnnotations) {
	defer close(done)
	for {
		v := a.coll.View(ctx)
		if pods != nil {
			for _, c := range v.Containers {
				if c.Pod == "" || c.Namespace == "" || !c.Enforced {
					continue
				}
				if ann, ok := pods.of(ctx, a, c.Namespace, c.Pod); ok {
					e.Annotate(c.CgroupID, c.Namespace+"/"+c.Pod, c.Container, ann)
				}
			}
		}
		a.breaches.Check(v.Containers)
		wait := 4 * time.Second
		if a.coll.Deciding() {
			wait = time.Second
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}
