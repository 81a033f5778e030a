package deviceplugin

import (
	"fmt"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuwarden/gpuwarden/deploy/allocation"
)

// allocate decides one container's grant, writes its control block and
// says what the container gets.
func (p *Plugin) allocate(kind allocation.Kind, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	g, err := allocation.Decide(ids, p.healthyGPU)
	if err != nil {
		return nil, err
	}
	if g.Kind != kind {
		return nil, fmt.Errorf("devices of %s asked of %s", g.Kind.Resource(), kind.Resource())
	}
	if kind == allocation.Remote {
		return p.allocateRemote(g)
	}
	p.dirs.Lock()
	e, err := p.node().Local(g)
	p.dirs.Unlock()
	if err != nil {
		return nil, err
	}
	p.log.Info("allocated", "resource", kind.Resource(), "gpu", g.GPU.UUID, "count", g.Count,
		"memoryLimit", g.MemoryLimitBytes, "dir", g.Dir)
	return containerResponse(e), nil
}

// containerResponse is Edits as the kubelet's Allocate answer has them.
func containerResponse(e allocation.Edits) *pluginapi.ContainerAllocateResponse {
	resp := &pluginapi.ContainerAllocateResponse{Envs: e.Env}
	for _, m := range e.Mounts {
		resp.Mounts = append(resp.Mounts, &pluginapi.Mount{ContainerPath: m.ContainerPath, HostPath: m.HostPath, ReadOnly: m.ReadOnly})
	}
	for _, d := range e.Devices {
		resp.Devices = append(resp.Devices, &pluginapi.DeviceSpec{ContainerPath: d.ContainerPath, HostPath: d.HostPath, Permissions: "rw"})
	}
	return resp
}

// allocateRemote writes a remote grant in the allocation's control
// directory, has the relay serve its socket there, and mounts the socket's
// directory and the client library into the container.
func (p *Plugin) allocateRemote(g allocation.Grant) (*pluginapi.ContainerAllocateResponse, error) {
	server, ok := p.cfg.Remote.Server(g.GPU.UUID)
	if !ok {
		return nil, fmt.Errorf("GPU %s: no server answers for it", g.GPU.UUID)
	}
	p.dirs.Lock()
	e, err := p.node().Remote(g, server, p.cfg.Remote.LibDir)
	p.dirs.Unlock()
	if err != nil {
		return nil, err
	}
	if err := p.cfg.Remote.Relay(g.Dir); err != nil {
		return nil, fmt.Errorf("relay: %w", err)
	}
	p.log.Info("allocated", "resource", allocation.ResourceRemote, "server", server, "gpu", g.GPU.UUID, "count", g.Count,
		"memoryLimit", g.MemoryLimitBytes, "dir", g.Dir)
	return containerResponse(e), nil
}

// node is where this node keeps what a local grant needs.
func (p *Plugin) node() allocation.Node {
	return allocation.Node{ControlDir: p.cfg.ControlDir, InterposerPath: p.cfg.InterposerPath,
		DeviceRoot: p.cfg.DeviceRoot, LdSoPreload: p.cfg.Preload == PreloadLdSoPreload}
}
