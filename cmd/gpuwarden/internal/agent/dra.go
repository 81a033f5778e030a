package agent

import (
	"context"
	"errors"

	"github.com/gpuwarden/gpuwarden/collector/kubeapi"
	"github.com/gpuwarden/gpuwarden/deploy/allocation"
	"github.com/gpuwarden/gpuwarden/deploy/deviceplugin"
	"github.com/gpuwarden/gpuwarden/deploy/dra"
	"github.com/gpuwarden/gpuwarden/deploy/remotepool"
	"github.com/gpuwarden/gpuwarden/enforcer/nvmldev"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/pki"
	"github.com/gpuwarden/gpuwarden/enforcer/scheduler"
	"github.com/gpuwarden/gpuwarden/enforcer/settings"
)

// startDRA serves the DRA driver gpu.gpuwarden.io: the node's GPUs in a
// ResourceSlice, claims prepared as CDI devices. Its readiness part "dra"
// is up once the slice is published, and says why not (a cluster without
// consumable capacity names the feature gate). It reaches the API server
// with the client that reads pods' annotations (nil: none).
func (a *Agent) startDRA(ctx context.Context, pods *podAnnotations) {
	d, api, err := a.newDRA(pods)
	a.driver = d // nil where it did not start
	a.runPart(ctx, "dra", "DRA driver", err, func(ctx context.Context) error { return d.Run(ctx, api) })
}

func (a *Agent) newDRA(pods *podAnnotations) (*dra.Driver, *kubeapi.Client, error) {
	if pods == nil {
		return nil, nil, errors.New("no API server client: set kubernetes.apiServer, or run in a pod (the kubernetes part says why, if it failed)")
	}
	var devices func() ([]nvmldev.Device, error)
	switch {
	case a.nvml != nil:
		devices = a.nvml.Devices
	case a.cfg.DRA.RemotePool != "":
		devices = func() ([]nvmldev.Device, error) { return nil, nil } // a node without GPUs: its pool's are remote
	default:
		return nil, nil, errors.New("needs NVML for the device list (a node without GPUs takes remote ones with dra.remotePool)")
	}
	c, dp := a.cfg.DRA, a.cfg.DevicePlugin
	d, err := dra.New(dra.Config{
		NodeName: nodeName(a.cfg),
		Node: allocation.Node{ControlDir: a.cfg.ControlDir, InterposerPath: dp.InterposerPath, DeviceRoot: dp.DeviceRoot,
			LdSoPreload: dp.Preload == deviceplugin.PreloadLdSoPreload},
		MaxInst: dp.MaxInst, CDIDir: c.CDIDir, RegistrarDir: c.RegistrarDir, PluginDir: c.PluginDir,
		HealthInterval: dp.HealthInterval, SetCompute: a.setClaimCompute, MaxInstOf: a.savedMaxInst,
		Remote: a.draRemote(pods),
		Ready:  func(err error) { a.parts.set("dra", true, err) },
	}, devices, a.log.With("part", "dra"))
	return d, pods.client, err
}

// draRemote is the DRA driver's part in the node's remote pool (nil:
// none): a relay for claims of other nodes' GPUs, dialling the servers
// their slices name with the node's certificate, and, where the node
// serves sessions (remote.enabled, and its server started), the address
// its GPUs are offered at.
func (a *Agent) draRemote(pods *podAnnotations) *dra.Remote {
	pool := a.cfg.DRA.RemotePool
	if pool == "" {
		return nil
	}
	r := a.cfg.Remote
	dialers := remotepool.NewDialers(pki.Files{Cert: r.Cert, Key: r.Key, CA: r.CA}, r.Timeout, a.log.With("part", "remoteRelay"))
	rl := a.startRelay(pods, dialers.Dialer)
	out := &dra.Remote{Pool: pool, LibDir: r.LibraryDir, Relay: rl.Listen, Release: rl.Release}
	if a.serving { // not where the server failed to start: its sessions would all fail
		out.Server = a.cfg.Advertised(nodeName(a.cfg))
	}
	return out
}

// savedMaxInst is a GPU's max_inst as `gpuwarden ctl gpu N --max-inst`
// saved it (0: none).
func (a *Agent) savedMaxInst(uuid string) int {
	if a.settings == nil {
		return 0
	}
	return a.settings.GPU(uuid).MaxInst
}

// setClaimCompute saves a claim's compute settings as ctl's for its control
// directory (nil removes them), so the enforcer holds its container to them
// whatever the container's environment claims.
func (a *Agent) setClaimCompute(dir string, st *scheduler.Settings) error {
	if a.settings == nil {
		return nil // enforcement off: nothing holds containers to settings
	}
	return a.settings.Update(func(s *settings.Store) {
		c := s.Containers[dir]
		c.Compute = st
		if c.Compute == nil && c.Memory == nil {
			delete(s.Containers, dir)
		} else {
			s.Containers[dir] = c
		}
	})
}
