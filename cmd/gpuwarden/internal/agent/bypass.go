package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/gpuwarden/gpuwarden/collector"
)

// Event is something the enforcer saw or did, for /api/v1/events.
type Event struct {
	Time      time.Time `json:"time"`
	Kind      string    `json:"kind"` // bypass, frozen, unfrozen, changed
	Cgroup    string    `json:"cgroup"`
	Namespace string    `json:"namespace,omitempty"`
	Pod       string    `json:"pod,omitempty"`
	Container string    `json:"container,omitempty"`
	GPU       int       `json:"gpu"`
	Message   string    `json:"message"`
}

// bypassWatch remembers which cgroups were flagged (and frozen), and keeps
// the latest events.
type bypassWatch struct {
	mu      sync.Mutex
	flagged map[string]bool // cgroup paths
	frozen  map[string]bool
	events  []Event
}

const maxEvents = 200

func (b *bypassWatch) init() {
	b.flagged, b.frozen = map[string]bool{}, map[string]bool{}
}

func (b *bypassWatch) record(ev Event) {
	b.mu.Lock()
	defer b.mu.Unlock()
	ev.Time = time.Now()
	b.events = append(b.events, ev)
	if len(b.events) > maxEvents {
		b.events = b.events[len(b.events)-maxEvents:]
	}
}

func (b *bypassWatch) list() []Event {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]Event{}, b.events...)
}

// checkBypass flags each cgroup the collector sees using a GPU without the
// interposer: a log line and an event, and with onBypass: freeze, its
// cgroup frozen (cgroup v2 cgroup.freeze) until `gpuwarden ctl unfreeze`.
func (e *enforcement) checkBypass(v *collector.View) {
	for _, c := range v.Containers {
		if !c.Unenforced || c.CgroupPath == "" {
			continue
		}
		e.bypass.mu.Lock()
		seen := e.bypass.flagged[c.CgroupPath]
		e.bypass.flagged[c.CgroupPath] = true
		e.bypass.mu.Unlock()
		if seen {
			continue
		}
		ev := Event{Kind: "bypass", Cgroup: c.CgroupPath, Namespace: c.Namespace, Pod: c.Pod, Container: c.Container, GPU: c.GPU,
			Message: "GPU activity without the interposer"}
		e.a.log.Warn("GPU used without the interposer", "cgroup", c.CgroupPath, "pod", c.Pod, "container", c.Container, "gpu", c.GPU)
		e.bypass.record(ev)
		if e.a.cfg.Enforcement.OnBypass == "freeze" {
			if err := e.freeze(c.CgroupPath, true); err != nil {
				e.a.log.Error("cannot freeze a bypassing cgroup", "cgroup", c.CgroupPath, "err", err)
				continue
			}
			ev.Kind, ev.Message = "frozen", "frozen: GPU activity without the interposer"
			e.bypass.record(ev)
		}
	}
}

// freeze freezes or thaws a cgroup. The root cgroup and the agent's own are
// never frozen.
func (e *enforcement) freeze(path string, on bool) error {
	if path == "/" || path == "" {
		return errors.New("the root cgroup is never frozen")
	}
	if own, err := os.ReadFile("/proc/self/cgroup"); err == nil && string(own) == "0::"+path+"\n" {
		return errors.New("the agent's own cgroup is never frozen")
	}
	val := "0"
	if on {
		val = "1"
	}
	if err := os.WriteFile(filepath.Join(e.cgroupDir(path), "cgroup.freeze"), []byte(val), 0); err != nil {
		return fmt.Errorf("freeze %s: %w", path, err)
	}
	e.bypass.mu.Lock()
	defer e.bypass.mu.Unlock()
	if on {
		e.bypass.frozen[path] = true
	} else {
		delete(e.bypass.frozen, path) // still flagged: not frozen again while it runs
	}
	return nil
}
