package agent

import (
	"context"
	"os"
	"strings"

	"github.com/gpuwarden/gpuwarden/collector"
	"github.com/gpuwarden/gpuwarden/collector/kubelet"
	"github.com/gpuwarden/gpuwarden/deploy/allocation"
	"github.com/gpuwarden/gpuwarden/deploy/dra"
)

// startKubelet connects to the kubelet's pod-resources API when its socket
// exists; off Kubernetes there is none and containers are labelled by
// their cgroup paths.
func (a *Agent) startKubelet(pods *podAnnotations) func(context.Context) (collector.LabelFunc, uint64, error) {
	sock := a.cfg.Kubelet.PodResourcesSocket
	if sock == "" {
		return nil
	}
	if _, err := os.Stat(sock); err != nil {
		a.log.Info("no kubelet pod-resources socket: labelling containers by cgroup path", "socket", sock)
		return nil
	}
	pr, err := kubelet.DialPodResources(sock)
	a.parts.set("kubelet", true, err)
	if err != nil {
		a.log.Error("kubelet pod-resources unavailable", "err", err)
		return nil
	}
	a.closers = append(a.closers, pr.Close)
	a.pods = pr
	return func(ctx context.Context) (collector.LabelFunc, uint64, error) {
		as, err := pr.List(ctx, func(r string) bool { return strings.HasPrefix(r, "gpuwarden.io/") || r == dra.DriverName })
		a.parts.set("kubelet", true, err)
		if err != nil {
			return nil, 0, err
		}
		uid := func(namespace, pod string) string { return pods.uid(ctx, a, namespace, pod) }
		return kubelet.Labels(as, allocation.DirOf, uid), kubelet.Digest(as), nil
	}
}
