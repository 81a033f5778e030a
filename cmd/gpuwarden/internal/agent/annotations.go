package agent

import (
	"context"
	"sync"
	"time"

	"github.com/gpuwarden/gpuwarden/collector/kubeapi"
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
		p.fetch(ctx, a)
	}
	pd, ok := p.byPod[namespace+"/"+pod]
	if !ok && time.Since(p.fetched) > missRefetch {
		// A pod that started since the last list (the kubelet names it, so
		// it exists): its first GPU call comes seconds after it starts.
		p.fetch(ctx, a)
		pd, ok = p.byPod[namespace+"/"+pod]
	}
	return pd, ok
}

// missRefetch is how old the list must be before a pod it lacks makes the
// agent list again: one list at most this often, however many new pods.
const missRefetch = 500 * time.Millisecond

func (p *podAnnotations) fetch(ctx context.Context, a *Agent) {
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
