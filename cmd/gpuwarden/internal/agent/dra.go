package agent

import (
	"context"
	"errors"

	"github.com/gpuwarden/gpuwarden/collector/kubeapi"
	"github.com/gpuwarden/gpuwarden/deploy/allocation"
	"github.com/gpuwarden/gpuwarden/deploy/deviceplugin"
	"github.com/gpuwarden/gpuwarden/deploy/dra"
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
	if a.nvml == nil {
		return nil, nil, errors.New("needs NVML for the device list")
	}
	if pods == nil {
		return nil, nil, errors.New("no API server client: set kubernetes.apiServer, or run in a pod (the kubernetes part says why, if it failed)")
	}
	c, dp := a.cfg.DRA, a.cfg.DevicePlugin
	d, err := dra.New(dra.Config{
		NodeName: nodeName(a.cfg),
		Node: allocation.Node{ControlDir: a.cfg.ControlDir, InterposerPath: dp.InterposerPath, DeviceRoot: dp.DeviceRoot,
			LdSoPreload: dp.Preload == deviceplugin.PreloadLdSoPreload},
		MaxInst: dp.MaxInst, CDIDir: c.CDIDir, RegistrarDir: c.RegistrarDir, PluginDir: c.PluginDir,
		HealthInterval: dp.HealthInterval, SetCompute: a.setClaimCompute, MaxInstOf: a.savedMaxInst,
		Ready: func(err error) { a.parts.set("dra", true, err) },
	}, a.nvml.Devices, a.log.With("part", "dra"))
	return d, pods.client, err
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
