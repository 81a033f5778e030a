package agent

import (
	"context"
	"errors"
	"fmt"

	"github.com/gpuwarden/gpuwarden/deploy/allocation"
	"github.com/gpuwarden/gpuwarden/deploy/deviceplugin"
)

// startDevicePlugin serves the kubelet's device-plugin API: GPU shares as
// extended resources, and what enforcement needs in each container; with
// remote servers configured, their GPUs' slots instead.
func (a *Agent) startDevicePlugin(ctx context.Context, pods *podAnnotations) {
	if len(a.cfg.Remote.Servers) > 0 {
		a.startRemoteDevicePlugin(ctx, pods)
		return
	}
	if a.nvml == nil {
		err := errors.New("needs NVML for the device list")
		a.parts.set("devicePlugin", true, err)
		a.log.Error("device plugin not started", "err", err)
		return
	}
	c := a.cfg.DevicePlugin
	dp, err := deviceplugin.New(deviceplugin.Config{
		MaxInst: c.MaxInst, KubeletDir: c.KubeletDir, ControlDir: a.cfg.ControlDir,
		InterposerPath: c.InterposerPath, DeviceRoot: c.DeviceRoot, Preload: c.Preload,
		HealthInterval: c.HealthInterval,
	}, a.nvml.Devices, a.log.With("part", "devicePlugin"))
	a.runDevicePlugin(ctx, dp, err)
}

// runDevicePlugin runs a plugin New made (or reports why there is none).
func (a *Agent) runDevicePlugin(ctx context.Context, dp *deviceplugin.Plugin, err error) {
	a.plugin = dp // nil where New failed
	a.runPart(ctx, "devicePlugin", "device plugin", err, func(ctx context.Context) error { return dp.Run(ctx) })
}

// setSlots gives GPU dev n slots in the device plugin, when it runs, so that
// its slots and the scheduler's max_inst stay one number; the plugin refuses
// to take away a slot the kubelet has assigned. n of 0 (not set) leaves them.
// dev is NVML's index (-1: a GPU the node does not have).
func (a *Agent) setSlots(ctx context.Context, dev, n int) error {
	if a.plugin == nil || n == 0 {
		return nil
	}
	if dev < 0 {
		return errors.New("the GPU is not on the node")
	}
	var inUse []string
	if a.pods != nil {
		as, err := a.pods.List(ctx, func(r string) bool { return r == allocation.ResourceGPU })
		if err != nil {
			return fmt.Errorf("the slots the kubelet has assigned are unknown: %w", err)
		}
		for _, x := range as {
			inUse = append(inUse, x.DeviceIDs...)
		}
	}
	return a.plugin.SetMaxInst(dev, n, inUse)
}
