package agent

import (
	"context"
	"errors"
	"fmt"
	"os"

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
// consumable capacity names the feature gate).
func (a *Agent) startDRA(ctx context.Context) {
	d, api, err := a.newDRA()
	a.parts.set("dra", true, err)
	if err != nil {
		a.log.Error("DRA driver not started", "err", err)
		return
	}
	a.driver = d
	ctx, cancel := context.WithCancel(ctx)
	a.closers = append(a.closers, func() error { cancel(); return nil })
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		if err := d.Run(ctx, api); err != nil {
			a.parts.set("dra", true, err)
			a.log.Error("DRA driver stopped", "err", err)
		}
	}()
}

func (a *Agent) newDRA() (*dra.Driver, *kubeapi.Client, error) {
	if a.nvml == nil {
		return nil, nil, errors.New("needs NVML for the device list")
	}
	api, err := a.kubeClient()
	if err != nil {
		return nil, nil, err
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
	return d, api, err
}

// kubeClient is a client of the API server the agent reads annotations
// from (kubernetes.* keys).
func (a *Agent) kubeClient() (*kubeapi.Client, error) {
	k := a.cfg.Kubernetes
	server := k.APIServer
	if server == "" {
		server = kubeapi.InClusterServer()
	}
	if server == "" {
		return nil, errors.New("no API server: set kubernetes.apiServer, or run in a pod")
	}
	if _, err := os.Stat(k.TokenFile); err != nil {
		return nil, fmt.Errorf("kubernetes.tokenFile: %w", err)
	}
	return kubeapi.New(server, k.TokenFile, k.CAFile)
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
