package agent

import (
	"context"
	"errors"

	"github.com/gpuwarden/gpuwarden/deploy/deviceplugin"
)

// startDevicePlugin serves the kubelet's device-plugin API: GPU shares as
// extended resources, and what enforcement needs in each container.
func (a *Agent) startDevicePlugin(ctx context.Context) {
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
	a.parts.set("devicePlugin", true, err)
	if err != nil {
		a.log.Error("device plugin not started", "err", err)
		return
	}
	ctx, cancel := context.WithCancel(ctx)
	a.closers = append(a.closers, func() error { cancel(); return nil })
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		if err := dp.Run(ctx); err != nil {
			a.parts.set("devicePlugin", true, err)
			a.log.Error("device plugin stopped", "err", err)
		}
	}()
}
