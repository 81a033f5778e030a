package membership

import (
	"github.com/gpuwarden/gpuwarden/enforcer/scheduler"
	"github.com/gpuwarden/gpuwarden/enforcer/settings"
	"github.com/gpuwarden/gpuwarden/enforcer/vocab"
)

// Annotate holds a container of a pod (namespace/name) to its pod's
// gpuwarden.io annotations, where `gpuwarden ctl` did not set its settings
// (settings.Resolve). A malformed annotation is logged and changes nothing
// (never "no limit").
func (e *Members) Annotate(cgroup uint64, pod, container string, annotations map[string]string) {
	m := e.memberOf(cgroup)
	if m == nil {
		return
	}
	ann, err := vocab.ParseAnnotations(annotations, container)
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
	if ann != (vocab.Annotated{}) {
		annotated = &scheduler.Settings{Weight: ann.Weight, CapPercent: ann.CapPercent, High: ann.Priority == vocab.PriorityHigh}
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

func (e *Members) memberOf(cgroup uint64) *member {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, m := range e.members {
		if m.cgroup == cgroup {
			return m
		}
	}
	return nil
}
