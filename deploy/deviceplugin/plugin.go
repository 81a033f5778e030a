// Package deviceplugin is gpuwarden's kubelet device plugin (API v1beta1,
// gRPC over unix sockets): it advertises shares of each GPU as two extended
// resources, gpuwarden.io/gpu (slots) and gpuwarden.io/gpu-memory (GiB),
// and answers Allocate with what enforcement needs: the interposer, the
// environment, the GPU's device nodes and the container's own control
// block. Decisions (ids, placement, limits, names) are deploy/allocation's.
package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/gpuwarden/gpuwarden/deploy/allocation"
	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
	"github.com/gpuwarden/gpuwarden/enforcer/nvmldev"
	"github.com/gpuwarden/gpuwarden/enforcer/vocab"
)

// Preload modes: how the interposer gets into a container's processes.
const (
	PreloadEnv         = "env"           // LD_PRELOAD in the container's environment
	PreloadLdSoPreload = "ld.so.preload" // a file mounted over /etc/ld.so.preload
)

// Config is the device plugin's part of the agent's configuration
// (devicePlugin.* keys).
type Config struct {
	MaxInst        int           // slots per GPU (its max_inst) unless SetMaxInst sets a GPU's
	KubeletDir     string        // the kubelet's device-plugins directory (kubelet.sock is in it)
	ControlDir     string        // the control directory, a host path (the agent mounts it at the same path)
	InterposerPath string        // libgpuwarden.so on the host
	DeviceRoot     string        // where the GPU device nodes are: /dev
	Preload        string        // PreloadEnv or PreloadLdSoPreload
	HealthInterval time.Duration // how often the device list is read again
	WatchInterval  time.Duration // how often the sockets are checked; 0: 1s
	// Remote, when set, makes the plugin serve gpuwarden.io/remote-gpu
	// alone, on a node without GPUs: devices reads the remote servers'
	// GPUs (remotepool.Pool.Devices), each with MaxInst slots.
	Remote *RemoteConfig
}

// RemoteConfig is what a remote allocation needs besides the grant.
type RemoteConfig struct {
	LibDir string // the remote client library's directory on the host (bin/remote)
	// Server names the server that holds a GPU (by UUID).
	Server func(uuid string) (string, bool)
	// Relay serves an allocation's relay socket (in its control directory,
	// session.RelayDir) before its container starts.
	Relay func(dir string) error
}

// Validate checks a config; it changes nothing.
func (c Config) Validate() error {
	var errs []error
	var bad *vocab.Error
	if err := vocab.CheckMaxInst(c.MaxInst); errors.As(err, &bad) {
		errs = append(errs, fmt.Errorf("devicePlugin.maxInst %d: want %s", c.MaxInst, bad.Want))
	}
	for _, p := range []struct{ key, v string }{{"devicePlugin.kubeletDir", c.KubeletDir}, {"controlDir", c.ControlDir},
		{"devicePlugin.interposerPath", c.InterposerPath}, {"devicePlugin.deviceRoot", c.DeviceRoot}} {
		if !filepath.IsAbs(p.v) {
			errs = append(errs, fmt.Errorf("%s %q: want an absolute path", p.key, p.v))
		}
	}
	if c.Preload != PreloadEnv && c.Preload != PreloadLdSoPreload {
		errs = append(errs, fmt.Errorf("devicePlugin.preload %q: want env or ld.so.preload", c.Preload))
	}
	if c.Remote != nil && (!filepath.IsAbs(c.Remote.LibDir) || c.Remote.Server == nil || c.Remote.Relay == nil) {
		errs = append(errs, fmt.Errorf("remote library directory %q: want an absolute path, with a server lookup and a relay", c.Remote.LibDir))
	}
	if c.HealthInterval <= 0 {
		errs = append(errs, fmt.Errorf("devicePlugin.healthInterval %v: want a positive duration", c.HealthInterval))
	}
	return errors.Join(errs...)
}

// gpuState is one GPU the plugin has seen.
type gpuState struct {
	allocation.GPU
	healthy bool
}

// Plugin serves both resources.
type Plugin struct {
	cfg     Config
	devices func() ([]nvmldev.Device, error)
	log     *slog.Logger

	mu      sync.Mutex
	gpus    map[string]*gpuState // by UUID; a GPU once seen stays, unhealthy when gone
	maxInst map[int]int          // slots by GPU index, where SetMaxInst set them
	changed chan struct{}        // closed and replaced when the device list changes

	dirs sync.Mutex // held while a control directory is written (DirLock)
}

// DirLock is held while Allocate writes a control directory: a Sweeper
// holds it too, so it never removes a directory an allocation is filling.
func (p *Plugin) DirLock() sync.Locker { return &p.dirs }

// New makes a plugin that reads the node's GPUs with devices (NVML's view:
// nvmldev.Reader.Devices).
func New(cfg Config, devices func() ([]nvmldev.Device, error), log *slog.Logger) (*Plugin, error) {
	if cfg.WatchInterval <= 0 {
		cfg.WatchInterval = time.Second
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("device plugin: %w", err)
	}
	if log == nil {
		log = slog.Default()
	}
	return &Plugin{cfg: cfg, devices: devices, log: log.With("component", "deviceplugin"),
		gpus: map[string]*gpuState{}, maxInst: map[int]int{}, changed: make(chan struct{})}, nil
}

// Run serves both resources until ctx ends: it registers them with the
// kubelet, registers again when the kubelet restarts (its socket is made
// anew, or ours is removed), and follows the GPUs' health.
func (p *Plugin) Run(ctx context.Context) error {
	p.refresh()
	servers := []*server{newServer(p, allocation.Slot), newServer(p, allocation.Memory)}
	if p.cfg.Remote != nil {
		servers = []*server{newServer(p, allocation.Remote)}
	}
	defer func() {
		for _, s := range servers {
			s.stop()
		}
	}()
	kubelet := filepath.Join(p.cfg.KubeletDir, kubeletSocket)
	var kubeletID controlblock.FileID
	register := func(s *server) {
		if err := s.register(ctx, kubelet); err != nil {
			p.log.Warn("register with the kubelet", "resource", s.kind.Resource(), "err", err)
			s.registered = false
			return
		}
		s.registered = true
		p.log.Info("registered with the kubelet", "resource", s.kind.Resource(), "endpoint", s.endpoint)
	}
	check := func() {
		id, kubeletUp := controlblock.StatFile(kubelet)
		restarted := kubeletUp && id != kubeletID
		kubeletID = id
		for _, s := range servers {
			if !s.alive() {
				if err := s.start(); err != nil {
					p.log.Error("serve device plugin", "resource", s.kind.Resource(), "err", err)
					continue
				}
				s.registered = false
			}
			if kubeletUp && (restarted || !s.registered) {
				register(s)
			}
		}
	}
	check()
	watch := time.NewTicker(p.cfg.WatchInterval)
	defer watch.Stop()
	health := time.NewTicker(p.cfg.HealthInterval)
	defer health.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-watch.C:
			check()
		case <-health.C:
			p.refresh()
		}
	}
}

// refresh reads the devices and marks GPUs that are gone (or all, when NVML
// fails) unhealthy; listeners hear of any change.
func (p *Plugin) refresh() {
	devs, err := p.devices()
	if err != nil {
		p.log.Warn("read GPUs; all marked unhealthy", "err", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	seen := map[string]bool{}
	change := false
	for _, d := range devs {
		seen[d.UUID] = true
		g, ok := p.gpus[d.UUID]
		if !ok {
			g = &gpuState{GPU: allocation.GPU{UUID: d.UUID, Index: d.Index, MemoryBytes: d.MemoryTotalBytes}}
			p.gpus[d.UUID] = g
			change = true
			p.log.Info("GPU found", "uuid", d.UUID, "index", d.Index, "memory", d.MemoryTotalBytes)
		}
		if !g.healthy || g.Index != d.Index {
			g.healthy, g.Index, change = true, d.Index, true
		}
	}
	for uuid, g := range p.gpus {
		if g.healthy && !seen[uuid] {
			g.healthy, change = false, true
			p.log.Warn("GPU gone: unhealthy", "uuid", uuid)
		}
	}
	if change {
		p.changedLocked()
	}
}

// changedLocked tells the listeners that the device list changed.
func (p *Plugin) changedLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// slotsLocked is a GPU's max_inst: set by SetMaxInst, else the configured one.
func (p *Plugin) slotsLocked(index int) int {
	if n, ok := p.maxInst[index]; ok {
		return n
	}
	return p.cfg.MaxInst
}

// SetMaxInst changes GPU index's slots (its max_inst), refusing to take away
// a slot the kubelet has assigned (inUse: the slot ids assigned now); the
// kubelet hears of the new device list at once.
func (p *Plugin) SetMaxInst(index, n int, inUse []string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	g := allocation.GPU{Index: index, MaxInst: p.slotsLocked(index)}
	for _, s := range p.gpus {
		if s.Index == index {
			g.UUID = s.UUID
		}
	}
	if err := allocation.Resize(g, n, inUse); err != nil {
		return err
	}
	if n != g.MaxInst {
		p.maxInst[index] = n
		p.changedLocked()
	}
	return nil
}

// snapshot returns the GPUs ordered by index and a channel closed at the
// next change.
func (p *Plugin) snapshot() ([]gpuState, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]gpuState, 0, len(p.gpus))
	for _, g := range p.gpus {
		s := *g
		s.MaxInst = p.slotsLocked(g.Index)
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].Index < out[j].Index || out[i].Index == out[j].Index && out[i].UUID < out[j].UUID
	})
	return out, p.changed
}

// healthyGPU looks a GPU up for allocation: only a healthy one.
func (p *Plugin) healthyGPU(uuid string) (allocation.GPU, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	g, ok := p.gpus[uuid]
	if !ok || !g.healthy {
		return allocation.GPU{}, false
	}
	out := g.GPU
	out.MaxInst = p.slotsLocked(g.Index)
	return out, true
}
