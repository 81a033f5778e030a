// Package onbreach acts on the collector's verdicts (collector/breach.go
// judges; this package only acts): it reports each new breach, with a log
// line and an event, and as enforcement.onBreach says freezes the
// container's cgroup or kills its offending processes, within
// enforcement.breachScope, and never the root cgroup, the agent's own or
// an ancestor of it.
package onbreach

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpuwarden/gpuwarden/enforcer/agentapi"
	"github.com/gpuwarden/gpuwarden/enforcer/changeapi"
	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
	"github.com/gpuwarden/gpuwarden/enforcer/hostcgroup"
)

// What the agent does with a container in breach (enforcement.onBreach).
const (
	Report = "report"
	Freeze = "freeze"
	Kill   = "kill"
)

// InScope says whether a breach of the container of cgroup path may be
// acted on: the path is one of scope's (enforcement.breachScope) or lies
// below it; an empty scope is every cgroup.
func InScope(scope []string, cgroup string) bool {
	if len(scope) == 0 {
		return true
	}
	for _, p := range scope {
		if hostcgroup.Within(cgroup, p) {
			return true
		}
	}
	return false
}

// Config is what a Responder acts by.
type Config struct {
	Action   string   // Report, Freeze or Kill
	Scope    []string // the cgroups Freeze and Kill may stop (InScope)
	CgroupFS string   // where the host's cgroup2 hierarchy is mounted
	ProcRoot string   // normally "/proc"
	// NSRoot is the host path of the agent's cgroup namespace root, which
	// /proc/<pid>/cgroup paths are relative to ("/": none).
	NSRoot string
	Log    *slog.Logger
}

// Responder reports, freezes or kills containers in breach.
type Responder struct {
	cfg   Config
	watch watch
}

// New returns a Responder acting by cfg.
func New(cfg Config) *Responder {
	r := &Responder{cfg: cfg}
	r.watch.init()
	return r
}

// Events is the latest events.
func (r *Responder) Events() []agentapi.Event { return r.watch.list() }

// Unfreeze thaws a cgroup the agent froze.
func (r *Responder) Unfreeze(path string) error {
	r.watch.mu.Lock()
	frozen := r.watch.frozen[path]
	r.watch.mu.Unlock()
	if !frozen {
		return changeapi.ErrNotFrozen
	}
	if err := r.freeze(path, false); err != nil {
		return err
	}
	r.watch.record(agentapi.Event{Kind: "unfrozen", Cgroup: path, Message: "unfrozen by gpuwarden ctl"})
	return nil
}

// cgroupDir is a cgroup's directory in the cgroup2 filesystem.
func (r *Responder) cgroupDir(path string) string { return filepath.Join(r.cfg.CgroupFS, path) }

// watch remembers which breaches were reported (and which cgroups
// frozen), and keeps the latest events.
type watch struct {
	mu      sync.Mutex
	flagged map[string]bool // cgroup path + reason
	frozen  map[string]bool
	events  []agentapi.Event
}

const maxEvents = 200

func (b *watch) init() {
	b.flagged, b.frozen = map[string]bool{}, map[string]bool{}
}

func (b *watch) record(ev agentapi.Event) {
	b.mu.Lock()
	defer b.mu.Unlock()
	ev.Time = time.Now()
	b.events = append(b.events, ev)
	if len(b.events) > maxEvents {
		b.events = b.events[len(b.events)-maxEvents:]
	}
}

func (b *watch) list() []agentapi.Event {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]agentapi.Event{}, b.events...)
}

// fresh marks the containers' breaches as reported and returns those that
// were not yet; a breach that ends is forgotten, so its return is reported
// again.
func (b *watch) fresh(containers []agentapi.ContainerDevice) []breachAt {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := map[string]bool{}
	var out []breachAt
	for _, c := range containers {
		if c.CgroupPath == "" {
			continue
		}
		for _, br := range c.Breaches {
			k := c.CgroupPath + "\x00" + br.Reason
			if !now[k] && !b.flagged[k] {
				out = append(out, breachAt{c: c, b: br})
			}
			now[k] = true
		}
	}
	b.flagged = now
	return out
}

// breachAt is one breach of one container.
type breachAt struct {
	c agentapi.ContainerDevice
	b agentapi.Breach
}

// Check reports each new breach of containers (the collector's view: a log
// line and an event with the evidence) and acts on it as Config.Action
// says.
func (r *Responder) Check(containers []agentapi.ContainerDevice) {
	for _, f := range r.watch.fresh(containers) {
		c, b := f.c, f.b
		ev := agentapi.Event{Kind: "breach", Reason: b.Reason, Cgroup: c.CgroupPath, Namespace: c.Namespace, Pod: c.Pod,
			Container: c.Container, GPU: c.GPU, PIDs: pidsOf(b.Procs), Message: b.Reason + ": " + b.Evidence}
		r.cfg.Log.Warn("container in breach", "reason", b.Reason, "evidence", b.Evidence, "cgroup", c.CgroupPath,
			"pod", c.Pod, "container", c.Container, "gpu", c.GPU)
		r.watch.record(ev)
		r.act(ev, b)
	}
}

// act applies Config.Action to one breach.
func (r *Responder) act(ev agentapi.Event, b agentapi.Breach) {
	action := r.cfg.Action
	if action != Report && !InScope(r.cfg.Scope, ev.Cgroup) {
		r.cfg.Log.Info("breach reported only: its cgroup is outside enforcement.breachScope", "cgroup", ev.Cgroup,
			"scope", r.cfg.Scope)
		return
	}
	switch action {
	case Freeze:
		if err := r.freeze(ev.Cgroup, true); err != nil {
			r.cfg.Log.Error("cannot freeze a cgroup in breach", "cgroup", ev.Cgroup, "err", err)
			return
		}
		ev.Kind, ev.Message = "frozen", "frozen: "+ev.Message
	case Kill:
		pids, err := r.kill(ev.Cgroup, b.Procs)
		if err != nil {
			r.cfg.Log.Error("cannot kill a container in breach", "cgroup", ev.Cgroup, "err", err)
			return
		}
		ev.Kind, ev.PIDs, ev.Message = "killed", pids, "killed: "+ev.Message
	default:
		return
	}
	r.cfg.Log.Warn("container in breach stopped", "action", ev.Kind, "cgroup", ev.Cgroup, "pids", ev.PIDs)
	r.watch.record(ev)
}

// stoppable refuses the cgroups the agent must never freeze or kill: the
// root, its own, and any ancestor of its own.
func (r *Responder) stoppable(path string) error {
	if path == "/" || path == "" {
		return errors.New("the root cgroup is never stopped")
	}
	own, err := hostcgroup.Of(r.cfg.ProcRoot, os.Getpid())
	if err != nil {
		return fmt.Errorf("cannot tell the agent's own cgroup: %w", err)
	}
	own = hostcgroup.HostPath(r.cfg.NSRoot, own)
	if hostcgroup.Within(own, path) {
		return fmt.Errorf("cgroup %s holds the agent (%s): never stopped", path, own)
	}
	return nil
}

// freeze freezes or thaws a cgroup (cgroup v2 cgroup.freeze).
func (r *Responder) freeze(path string, on bool) error {
	if on {
		if err := r.stoppable(path); err != nil {
			return err
		}
	}
	val := "0"
	if on {
		val = "1"
	}
	if err := os.WriteFile(filepath.Join(r.cgroupDir(path), "cgroup.freeze"), []byte(val), 0); err != nil {
		return fmt.Errorf("freeze %s: %w", path, err)
	}
	r.watch.mu.Lock()
	defer r.watch.mu.Unlock()
	if on {
		r.watch.frozen[path] = true
	} else {
		delete(r.watch.frozen, path) // still flagged: not frozen again while the breach lasts
	}
	return nil
}

// kill SIGKILLs the offending processes: those named, else every process
// of the cgroup (cgroup.kill). It returns the pids killed.
func (r *Responder) kill(path string, procs []agentapi.Process) ([]int, error) {
	if err := r.stoppable(path); err != nil {
		return nil, err
	}
	if len(procs) == 0 {
		b, _ := os.ReadFile(filepath.Join(r.cgroupDir(path), "cgroup.procs"))
		if err := os.WriteFile(filepath.Join(r.cgroupDir(path), "cgroup.kill"), []byte("1"), 0); err != nil {
			return nil, fmt.Errorf("kill %s: %w", path, err)
		}
		return fieldsInts(string(b)), nil
	}
	var killed []int
	var errs []error
	for _, p := range procs {
		if err := r.killIn(path, p); err != nil {
			errs = append(errs, err)
			continue
		}
		killed = append(killed, p.PID)
	}
	return killed, errors.Join(errs...)
}

// killIn SIGKILLs a process if it is still the one judged (same start
// time) and still in the cgroup. The pidfd pins the process before both
// are read, so a pid reused meanwhile is never signalled.
func (r *Responder) killIn(path string, p agentapi.Process) error {
	pid := p.PID
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return fmt.Errorf("open pid %d: %w", pid, err)
	}
	defer unix.Close(fd)
	if st, err := controlblock.StartTime(r.cfg.ProcRoot, pid); err != nil || st != p.StartTime {
		return fmt.Errorf("pid %d is no longer the process judged", pid)
	}
	now, err := hostcgroup.Of(r.cfg.ProcRoot, pid)
	if err != nil || hostcgroup.HostPath(r.cfg.NSRoot, now) != path {
		return fmt.Errorf("pid %d is no longer in %s", pid, path)
	}
	if err := unix.PidfdSendSignal(fd, syscall.SIGKILL, nil, 0); err != nil {
		return fmt.Errorf("kill pid %d: %w", pid, err)
	}
	return nil
}

func fieldsInts(s string) []int {
	var out []int
	for _, f := range strings.Fields(s) {
		var n int
		if _, err := fmt.Sscan(f, &n); err == nil {
			out = append(out, n)
		}
	}
	return out
}

func pidsOf(ps []agentapi.Process) []int {
	out := make([]int, len(ps))
	for i, p := range ps {
		out[i] = p.PID
	}
	return out
}
