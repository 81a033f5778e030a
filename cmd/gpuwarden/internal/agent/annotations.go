package agent

import (
	"context"
	"sync"
	"time"

	"github.com/gpuwarden/gpuwarden/collector"
	"github.com/gpuwarden/gpuwarden/collector/kubeapi"
	"github.com/gpuwarden/gpuwarden/deploy/allocation"
	"github.com/gpuwarden/gpuwarden/enforcer/scheduler"
)

// podAnnotations keeps the annotations (and uids) of this node's pods, read
// from the API server at most every refresh: the kubelet gives device
// plugins no annotations, and its pod-resources answer no uids.
type podAnnotations struct {
	client  *kubeapi.Client
	node    string
	refresh time.Duration

	mu      sync.Mutex
	byPod   map[string]kubeapi.Pod // by "namespace/name"
	fetched time.Time
}

func (a *Agent) startAnnotations(node string) *podAnnotations {
	server := a.cfg.Kubernetes.APIServer
	if server == "" {
		server = kubeapi.InClusterServer()
	}
	if server == "" {
		return nil // off Kubernetes: settings come from containers' environments
	}
	c, err := kubeapi.New(server, a.cfg.Kubernetes.TokenFile, a.cfg.Kubernetes.CAFile)
	a.parts.set("kubernetes", true, err)
	if err != nil {
		a.log.Error("pod annotations unavailable", "err", err)
		return nil
	}
	return &podAnnotations{client: c, node: node, refresh: 5 * time.Second}
}

// of returns a pod's annotations, refreshing the list when it is old.
func (p *podAnnotations) of(ctx context.Context, a *Agent, namespace, pod string) (map[string]string, bool) {
	pd, ok := p.pod(ctx, a, namespace, pod)
	return pd.Annotations, ok
}

// uid returns a pod's uid, "" when unknown (nil p: off the API server).
func (p *podAnnotations) uid(ctx context.Context, a *Agent, namespace, pod string) string {
	if p == nil {
		return ""
	}
	pd, _ := p.pod(ctx, a, namespace, pod)
	return pd.UID
}

func (p *podAnnotations) pod(ctx context.Context, a *Agent, namespace, pod string) (kubeapi.Pod, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if time.Since(p.fetched) > p.refresh {
		pods, err := p.client.PodsOnNode(ctx, p.node)
		a.parts.set("kubernetes", true, err)
		if err != nil {
			a.log.Warn("cannot list pods for their annotations", "err", err)
		} else {
			p.byPod = make(map[string]kubeapi.Pod, len(pods))
			for _, pd := range pods {
				p.byPod[pd.Namespace+"/"+pd.Name] = pd
			}
		}
		p.fetched = time.Now()
	}
	pd, ok := p.byPod[namespace+"/"+pod]
	return pd, ok
}

// applyAnnotations holds each container of a pod to its pod's
// gpuwarden.io annotations, unless `gpuwarden ctl` set its settings. A
// malformed annotation is logged and changes nothing (never "no limit").
func (e *enforcement) applyAnnotations(ctx context.Context, v *collector.View) {
	if e.pods == nil {
		return
	}
	for _, c := range v.Containers {
		if c.Pod == "" || c.Namespace == "" || !c.Enforced {
			continue
		}
		m := e.memberOf(c.CgroupID)
		if m == nil || e.settings.hasCompute(m.dir) {
			continue
		}
		ann, ok := e.pods.of(ctx, e.a, c.Namespace, c.Pod)
		if !ok {
			continue
		}
		claims, err := allocation.ParseAnnotations(ann, c.Container)
		if err != nil {
			e.a.log.Warn("ignoring the pod's gpuwarden annotations", "pod", c.Namespace+"/"+c.Pod, "err", err)
			continue
		}
		st := scheduler.Settings{FromClaims: true}
		if claims != (allocation.Claims{}) {
			st = scheduler.Settings{Weight: int(claims.Weight), CapPercent: int(claims.ComputeLimit), High: claims.Priority == "high"}
			if st.Weight == 0 {
				st.Weight = 1
			}
		}
		e.mu.Lock()
		changed := m.annotated != st
		m.annotated = st
		e.mu.Unlock()
		if changed {
			if err := e.s.SetContainer(m.dir, st); err != nil {
				e.a.log.Warn("pod annotations refused", "pod", c.Namespace+"/"+c.Pod, "err", err)
			} else {
				e.a.log.Info("pod annotations applied", "pod", c.Namespace+"/"+c.Pod, "container", c.Container,
					"weight", st.Weight, "computeLimit", st.CapPercent, "high", st.High)
			}
		}
	}
}

func (e *enforcement) memberOf(cgroup uint64) *member {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, m := range e.members {
		if m.cgroup == cgroup {
			return m
		}
	}
	return nil
}
