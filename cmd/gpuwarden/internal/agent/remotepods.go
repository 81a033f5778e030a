package agent

import (
	"context"
	"errors"
	"fmt"

	"github.com/gpuwarden/gpuwarden/collector/cgroups"
	"github.com/gpuwarden/gpuwarden/deploy/allocation"
	"github.com/gpuwarden/gpuwarden/deploy/deviceplugin"
	"github.com/gpuwarden/gpuwarden/deploy/dra"
	"github.com/gpuwarden/gpuwarden/deploy/remotepool"
	"github.com/gpuwarden/gpuwarden/enforcer/hostcgroup"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/client"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/pki"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/relay"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/session"
)

// startRemoteDevicePlugin serves gpuwarden.io/remote-gpu on a node without
// GPUs: slots of the configured servers' GPUs, healthy while their server
// answers, and a relay that opens each allocated container's sessions with
// this node's certificate.
func (a *Agent) startRemoteDevicePlugin(ctx context.Context, pods *podAnnotations) {
	r, c := a.cfg.Remote, a.cfg.DevicePlugin
	pool, err := remotepool.New(r.Servers, pki.Files{Cert: r.Cert, Key: r.Key, CA: r.CA}, r.Timeout)
	if err != nil {
		a.runDevicePlugin(ctx, nil, fmt.Errorf("remote GPU servers: %w", err))
		return
	}
	rl := a.startRelay(pods, pool.Dialer)
	dp, err := deviceplugin.New(deviceplugin.Config{
		MaxInst: c.MaxInst, KubeletDir: c.KubeletDir, ControlDir: a.cfg.ControlDir,
		InterposerPath: c.InterposerPath, DeviceRoot: c.DeviceRoot, Preload: c.Preload,
		HealthInterval: c.HealthInterval,
		Remote:         &deviceplugin.RemoteConfig{LibDir: r.LibraryDir, Server: pool.Server, Relay: rl.Listen},
	}, pool.Devices, a.log.With("part", "devicePlugin"))
	a.runDevicePlugin(ctx, dp, err)
}

// startRelay serves the sockets of the node's remote allocations (device
// plugin slots and DRA claims alike), dialling their servers with dialer,
// those a previous agent served first.
func (a *Agent) startRelay(pods *podAnnotations, dialer func(server string) (*client.Dialer, bool)) *relay.Relay {
	relayed, _ := session.ParseDataPath(a.cfg.Remote.DataPath) // checked with the configuration
	own := a.cfg.Advertised(nodeName(a.cfg))
	local := func(server string) string { // this node's own sessions skip TLS and the network
		if a.serving && server == own {
			return a.localSocket()
		}
		return ""
	}
	rl := relay.New(relay.Config{ControlDir: a.cfg.ControlDir, ProcRoot: a.cfg.Paths.Proc, Dialer: dialer,
		Identify: a.identifyRemotePod(pods), Relayed: relayed, Local: local, Log: a.log.With("part", "remoteRelay")})
	a.closers = append(a.closers, rl.Close)
	a.relay = rl
	a.checkKernelTLS()
	if err := rl.Restore(); err != nil {
		a.log.Error("remote relay: earlier allocations not served again", "err", err)
	}
	return rl
}

// identifyRemotePod names the container that holds allocation dir, as the
// kubelet's pod-resources says, and requires the connecting process's
// cgroup to be that pod's (its uid, from the API server): a process of
// another pod that reaches the socket is refused. The path is read in the
// host's tree, as the collector reads it: the kubelet's layout, not a
// cgroup a container named, says whose pod it is.
func (a *Agent) identifyRemotePod(pods *podAnnotations) func(context.Context, string, string) (session.Workload, error) {
	return func(ctx context.Context, dir, cgroupPath string) (session.Workload, error) {
		if a.pods == nil {
			return session.Workload{}, errors.New("no kubelet pod-resources API: the allocation's pod is unknown")
		}
		as, err := a.pods.List(ctx, func(r string) bool { return r == allocation.ResourceRemote || r == dra.DriverName })
		if err != nil {
			return session.Workload{}, err
		}
		for _, x := range as {
			if allocation.DirOf(x.DeviceIDs) != dir {
				continue
			}
			uid := pods.uid(ctx, a, x.Namespace, x.Pod)
			if uid == "" {
				return session.Workload{}, fmt.Errorf("pod %s/%s: its uid is unknown (no API server), so its cgroup cannot be checked",
					x.Namespace, x.Pod)
			}
			if got := cgroups.ParsePath(hostcgroup.HostPath(a.nsRoot, cgroupPath)).PodUID; got != uid {
				return session.Workload{}, fmt.Errorf("the process's cgroup %s is not pod %s/%s's (uid %s)", cgroupPath, x.Namespace, x.Pod, uid)
			}
			return session.Workload{Namespace: x.Namespace, Pod: x.Pod, Container: x.Container}, nil
		}
		return session.Workload{}, fmt.Errorf("the kubelet lists no container holding allocation %s", dir)
	}
}
