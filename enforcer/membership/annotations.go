package membership

import (
	"github.com/gpuwarden/gpuwarden/deploy/allocation"
	"github.com/gpuwarden/gpuwarden/enforcer/scheduler"
	"github.com/gpuwarden/gpuwarden/enforcer/settings"
)

// Annotate holds a container of a pod (namespace/name) to its pod's
// gpuwarden.io annotations, where `gpuwarden ctl` did not set its settings
// (settings.Resolve). A malformed annotation is logged and changes nothing
// (never "no limit").
func (e *Enforcement) Annotate(cgroup uint64, pod, container string, annotations map[string]string) {
	m := e.memberOf(cgroup)
	if m == nil {
		return
	}
	claims, err := allocation.ParseAnnotations(annotations, container)
	e.mu.Lock()
	logged := m.badAnnotations
	if err != nil {
		m.badAnnotations = err.Error()
	} else {
		m.badAnnotations = ""
	}
	e.mu.Unlock()
	if err != nil {
		if err.Error() != logged {
			e.cfg.Log.Warn("ignoring the pod's gpuwarden annotations", "pod", pod, "err", err)
		}
		return
	}
	var annotated *scheduler.Settings
	if claims != (allocation.Claims{}) {
		annotated = &scheduler.Settings{Weight: int(claims.Weight), CapPercent: int(claims.ComputeLimit), High: claims.Priority == "high"}
	}
	st := settings.Resolve(e.cfg.Settings.Compute(m.dir), annotated)
	e.mu.Lock()
	changed := m.applied != st
	m.applied = st
	e.mu.Unlock()
	if changed {
		if err := e.s.SetContainer(m.dir, st); err != nil {
			e.cfg.Log.Warn("pod annotations refused", "pod", pod, "err", err)
		} else {
			e.cfg.Log.Info("pod annotations applied", "pod", pod, "container", container,
				"weight", st.Weight, "computeLimit", st.CapPercent, "high", st.High)
		}
	}
}

func (e *Enforcement) memberOf(cgroup uint64) *member {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, m := range e.members {
		if m.cgroup == cgroup {
			return m
		}
	}
	return nil
}
