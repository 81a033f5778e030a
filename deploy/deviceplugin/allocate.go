package deviceplugin

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuwarden/gpuwarden/deploy/allocation"
	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/session"
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
	if _, err := os.Stat(p.cfg.InterposerPath); err != nil {
		return nil, fmt.Errorf("interposer: %w", err)
	}
	p.dirs.Lock()
	dir, err := p.writeControlBlock(g)
	p.dirs.Unlock()
	if err != nil {
		return nil, err
	}
	ctrDir := filepath.Join(allocation.ContainerControlDir, allocation.ContainerKey)
	resp := &pluginapi.ContainerAllocateResponse{
		Envs: g.Env(p.cfg.Preload == PreloadEnv),
		Mounts: []*pluginapi.Mount{
			{ContainerPath: allocation.ContainerInterposer, HostPath: p.cfg.InterposerPath, ReadOnly: true},
			{ContainerPath: filepath.Join(ctrDir, "limits"), HostPath: filepath.Join(dir, "limits"), ReadOnly: true},
			{ContainerPath: filepath.Join(ctrDir, "usage"), HostPath: filepath.Join(dir, "usage")},
		},
	}
	if p.cfg.Preload == PreloadLdSoPreload {
		resp.Mounts = append(resp.Mounts, &pluginapi.Mount{
			ContainerPath: allocation.LdSoPreload, HostPath: filepath.Join(dir, "ld.so.preload"), ReadOnly: true})
	}
	for _, name := range []string{fmt.Sprintf("nvidia%d", g.GPU.Index), "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"} {
		host := filepath.Join(p.cfg.DeviceRoot, name)
		if _, err := os.Stat(host); err == nil {
			resp.Devices = append(resp.Devices, &pluginapi.DeviceSpec{ContainerPath: "/dev/" + name, HostPath: host, Permissions: "rw"})
		}
	}
	p.log.Info("allocated", "resource", kind.Resource(), "gpu", g.GPU.UUID, "count", g.Count,
		"memoryLimit", g.MemoryLimitBytes, "dir", g.Dir)
	return resp, nil
}

// allocateRemote writes a remote grant in the allocation's control
// directory, has the relay serve its socket there, and mounts the socket's
// directory and the client library into the container.
func (p *Plugin) allocateRemote(g allocation.Grant) (*pluginapi.ContainerAllocateResponse, error) {
	server, ok := p.cfg.Remote.Server(g.GPU.UUID)
	if !ok {
		return nil, fmt.Errorf("GPU %s: no server answers for it", g.GPU.UUID)
	}
	if _, err := os.Stat(filepath.Join(p.cfg.Remote.LibDir, "libcuda.so.1")); err != nil {
		return nil, fmt.Errorf("remote client library: %w", err)
	}
	b, _ := json.Marshal(session.Grant{Server: server, GPU: g.GPU.UUID, MemoryBytes: g.MemoryLimitBytes, Weight: g.Weight})
	dir := filepath.Join(p.cfg.ControlDir, g.Dir)
	p.dirs.Lock()
	err := os.MkdirAll(filepath.Join(dir, session.RelayDir), 0o755)
	if err == nil {
		err = replaceFile(filepath.Join(dir, session.GrantFile), b, 0o644)
	}
	p.dirs.Unlock()
	if err != nil {
		return nil, fmt.Errorf("remote grant: %w", err)
	}
	if err := p.cfg.Remote.Relay(g.Dir); err != nil {
		return nil, fmt.Errorf("relay: %w", err)
	}
	p.log.Info("allocated", "resource", allocation.ResourceRemote, "server", server, "gpu", g.GPU.UUID, "count", g.Count,
		"memoryLimit", g.MemoryLimitBytes, "dir", g.Dir)
	return &pluginapi.ContainerAllocateResponse{
		Envs: allocation.RemoteEnv(),
		Mounts: []*pluginapi.Mount{
			{ContainerPath: allocation.ContainerRemoteDir, HostPath: filepath.Join(dir, session.RelayDir), ReadOnly: true},
			{ContainerPath: allocation.ContainerRemoteLib, HostPath: p.cfg.Remote.LibDir, ReadOnly: true},
		},
	}, nil
}

// writeControlBlock makes <controlDir>/<grant dir>/ with a new limits file
// (the memory limit for ordinal 0, the container's only GPU) and a new,
// empty usage file that the container's first process lays out. Both are
// new inodes (written aside and renamed in), so a container that held the
// same devices before keeps its own mappings untouched. The directory is
// the agent's, mode 0755 (CreateLimits adopts it, whoever made it): only
// `usage` (0666) is the container's to write.
func (p *Plugin) writeControlBlock(g allocation.Grant) (string, error) {
	dir := filepath.Join(p.cfg.ControlDir, g.Dir)
	var cfg controlblock.LimitsConfig
	cfg.MemLimit[0] = g.MemoryLimitBytes
	cfg.NDev = 1
	lf, err := controlblock.CreateLimits(filepath.Join(dir, "limits"), cfg)
	if err != nil {
		return "", fmt.Errorf("control block: %w", err)
	}
	lf.Close()
	if err := replaceFile(filepath.Join(dir, "usage"), nil, 0o666); err != nil {
		return "", fmt.Errorf("control block: %w", err)
	}
	if p.cfg.Preload == PreloadLdSoPreload {
		if err := replaceFile(filepath.Join(dir, "ld.so.preload"), []byte(allocation.ContainerInterposer+"\n"), 0o644); err != nil {
			return "", fmt.Errorf("control block: %w", err)
		}
	}
	return dir, nil
}

// replaceFile writes a new file aside and renames it over path.
func replaceFile(path string, b []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(mode); err != nil { // not the umask's mode: the container's user may not be root
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
