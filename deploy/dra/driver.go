// Package dra is gpuwarden's Dynamic Resource Allocation driver,
// gpu.gpuwarden.io, run inside the node agent. Each GPU is one shareable
// device of the node's ResourceSlice with two consumable capacities,
// memory (bytes) and compute (percent), so the cluster's scheduler packs
// claims onto GPUs; a claim's ShareConfig carries its weight, priority
// and compute cap. Preparing a claim writes what the device plugin gives a
// container (allocation.Node.Local) and hands it to the runtime as a CDI
// device; a claim of another node's GPU in the node's remote pool is
// prepared as a remote session (remote.go). The driver speaks the kubelet's
// plugin registration and DRA gRPC services itself (kubelet.go) and the API
// server's JSON through collector/kubeapi (api.go): Kubernetes'
// kubeletplugin helper would bring client-go into every agent, about 36 MiB
// of resident memory.
package dra

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gpuwarden/gpuwarden/collector/kubeapi"
	"github.com/gpuwarden/gpuwarden/deploy/allocation"
	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
	"github.com/gpuwarden/gpuwarden/enforcer/nvmldev"
	"github.com/gpuwarden/gpuwarden/enforcer/scheduler"
	"github.com/gpuwarden/gpuwarden/enforcer/vocab"
)

// DriverName is the driver's name in ResourceSlices, DeviceClasses and
// claims' allocations.
const DriverName = "gpu.gpuwarden.io"

// Config is the driver's part of the agent's configuration.
type Config struct {
	NodeName string
	Node     allocation.Node // control directory, interposer, device nodes, preload
	MaxInst  int             // slots per GPU: a claim that asks for nothing gets one
	// MaxInstOf is a GPU's own max_inst, where `gpuwarden ctl gpu N
	// --max-inst` set one (0: MaxInst); nil: none set.
	MaxInstOf      func(uuid string) int
	CDIDir         string        // where the runtime reads CDI specs
	RegistrarDir   string        // the kubelet's plugins_registry directory
	PluginDir      string        // this driver's directory under the kubelet's plugins directory
	HealthInterval time.Duration // how often the GPUs are read again
	// SetCompute saves a claim's compute settings for its control
	// directory as `gpuwarden ctl` would (nil: remove them), so the
	// enforcer holds the container to them whatever its environment says.
	SetCompute func(dir string, st *scheduler.Settings) error
	// Remote, when set, makes the node one of a remote pool's.
	Remote *Remote
	// Ready reports the driver's state: nil once the API server holds the
	// node's slice as published, else why not (a cluster without consumable
	// capacity names the gate).
	Ready func(err error)
}

// Driver is the DRA driver of one node.
type Driver struct {
	cfg     Config
	devices func() ([]nvmldev.Device, error)
	log     *slog.Logger

	api  *kubeapi.Client
	mu   sync.Mutex     // guards gpus
	gpus map[string]GPU // healthy GPUs by device name
	dirs sync.Mutex     // held while claims are prepared and unprepared (DirLock)
}

// New makes a driver that reads the node's GPUs with devices.
func New(cfg Config, devices func() ([]nvmldev.Device, error), log *slog.Logger) (*Driver, error) {
	var errs []error
	if cfg.NodeName == "" {
		errs = append(errs, errors.New("the node's name is unknown (nodeName or $NODE_NAME)"))
	}
	if err := vocab.CheckMaxInst(cfg.MaxInst); err != nil {
		errs = append(errs, err)
	}
	for _, p := range []struct{ key, v string }{{"dra.cdiDir", cfg.CDIDir}, {"dra.registrarDir", cfg.RegistrarDir},
		{"dra.pluginDir", cfg.PluginDir}, {"controlDir", cfg.Node.ControlDir}} {
		if !filepath.IsAbs(p.v) {
			errs = append(errs, fmt.Errorf("%s %q: want an absolute path", p.key, p.v))
		}
	}
	if cfg.HealthInterval <= 0 {
		errs = append(errs, fmt.Errorf("health interval %v: want a positive duration", cfg.HealthInterval))
	}
	if r := cfg.Remote; r != nil {
		if err := CheckPoolName(r.Pool); err != nil {
			errs = append(errs, err)
		}
		if r.Relay != nil && !filepath.IsAbs(r.LibDir) {
			errs = append(errs, fmt.Errorf("remote.libraryDir %q: want an absolute path", r.LibDir))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("DRA driver: %w", err)
	}
	if log == nil {
		log = slog.Default()
	}
	if cfg.Ready == nil {
		cfg.Ready = func(error) {}
	}
	return &Driver{cfg: cfg, devices: devices, log: log.With("component", "dra"), gpus: map[string]GPU{}}, nil
}

// DirLock is held while a claim's control directory is written: a Sweeper
// holds it too.
func (d *Driver) DirLock() sync.Locker { return &d.dirs }

// Prepared returns the control directories of the claims prepared now
// (a Sweeper's Prepared): those the CDI specs on disk name.
func (d *Driver) Prepared() (map[string]bool, error) { return preparedDirs(d.cfg.CDIDir) }

// Run registers the driver with the kubelet, publishes the node's GPUs
// and follows them until ctx ends. api reaches the API server.
func (d *Driver) Run(ctx context.Context, api *kubeapi.Client) error {
	d.api = api
	d.cfg.Ready(errors.New("starting"))
	k, err := startKubeletPlugin(d)
	if err != nil {
		d.cfg.Ready(err)
		return fmt.Errorf("DRA driver: %w", err)
	}
	defer k.stop()
	pub := &publisher{api: api, node: d.cfg.NodeName, offer: d.offer()}
	health := time.NewTicker(d.cfg.HealthInterval)
	defer health.Stop()
	retry := time.NewTicker(retryInterval)
	defer retry.Stop()
	var published []GPU
	var lastErr string
	done, soon := false, false
	for {
		if err := k.check(); err != nil {
			d.log.Warn("kubelet plugin sockets", "err", err)
		}
		if gpus := d.refresh(); !done || !slices.Equal(gpus, published) {
			s, err := pub.publish(ctx, gpus)
			soon = err != nil // the API server did not answer as it should: again soon
			if err == nil {
				err = shared(s, len(gpus)) // it answered, without a feature: again at the next read of the GPUs
			}
			d.cfg.Ready(err)
			switch done = err == nil; {
			case done:
				published, lastErr = gpus, ""
				d.log.Info("ResourceSlice published", "gpus", len(gpus), "generation", s.Spec.Pool.Generation)
			case err.Error() != lastErr:
				lastErr = err.Error()
				d.log.Error("ResourceSlice not published", "err", err)
			}
		}
		var again <-chan time.Time
		if soon {
			again = retry.C
		}
		select {
		case <-ctx.Done():
			return nil
		case <-health.C:
		case <-again:
		}
	}
}

// retryInterval is how soon a slice that could not be published is tried
// again.
const retryInterval = time.Second

// refresh reads the GPUs; those NVML no longer lists (or all, when it
// fails) leave the slice and cannot be prepared.
func (d *Driver) refresh() []GPU {
	devs, err := d.devices()
	if err != nil {
		d.log.Warn("read GPUs; none offered", "err", err)
	}
	out := make([]GPU, 0, len(devs))
	gpus := make(map[string]GPU, len(devs))
	for _, dev := range devs {
		g := GPU{GPU: allocation.GPU{UUID: dev.UUID, Index: dev.Index, MemoryBytes: dev.MemoryTotalBytes, MaxInst: d.cfg.MaxInst}, Model: dev.Name}
		if d.cfg.MaxInstOf != nil {
			if n := d.cfg.MaxInstOf(dev.UUID); vocab.CheckMaxInst(n) == nil {
				g.MaxInst = n
			}
		}
		out = append(out, g)
		gpus[deviceName(g.Index)] = g
	}
	slices.SortFunc(out, func(a, b GPU) int { return a.Index - b.Index })
	d.mu.Lock()
	d.gpus = gpus
	d.mu.Unlock()
	return out
}

func (d *Driver) gpu(device string) (GPU, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	g, ok := d.gpus[device]
	return g, ok
}

// claimGrant is one device of a claim, decided.
type claimGrant struct {
	result   Result
	grant    allocation.Grant
	settings scheduler.Settings
	server   string // where a remote device's sessions are served; "": a local GPU
}

// Prepared is one device of a prepared claim, as the kubelet is told of it.
type Prepared struct {
	Request, Pool, Device string
	CDIDevice             string // "<kind>=<name>", the name the runtime looks up in the claim's spec
	ShareID               *string
}

// Prepare prepares one claim: its control directory, its saved settings
// and its CDI spec. A claim that cannot be prepared fails with a reason
// the kubelet shows in the pod's events, and nothing of it is written.
func (d *Driver) Prepare(ctx context.Context, c *ResourceClaim) ([]Prepared, error) {
	grants, err := d.decide(ctx, c)
	if err != nil {
		return nil, err
	}
	d.dirs.Lock()
	defer d.dirs.Unlock()
	var specs []cdiDevice
	var out []Prepared
	for _, g := range grants {
		name := g.grant.Dir
		var e allocation.Edits
		if g.server != "" {
			if e, err = d.prepareRemote(g); err != nil {
				return nil, err
			}
		} else if _, err := os.Stat(filepath.Join(d.cfg.Node.ControlDir, name, "limits")); err == nil {
			// Prepared before (the kubelet asks again after its restart):
			// the running container keeps the files it maps, and the
			// settings `gpuwarden ctl` may have changed since stay.
			e = d.cfg.Node.Edits(g.grant)
		} else {
			if d.cfg.SetCompute != nil {
				if err := d.cfg.SetCompute(name, &g.settings); err != nil {
					return nil, fmt.Errorf("compute settings: %w", err)
				}
			}
			if e, err = d.cfg.Node.Local(g.grant); err != nil {
				return nil, err
			}
		}
		specs = append(specs, cdiDevice{Name: name, Edits: cdiEditsOf(e)})
		out = append(out, Prepared{Request: g.result.Request, Pool: g.result.Pool, Device: g.result.Device,
			CDIDevice: cdiKind + "=" + name, ShareID: g.result.ShareID})
		d.log.Info("claim prepared", "claim", c.Metadata.Namespace+"/"+c.Metadata.Name, "uid", c.Metadata.UID,
			"gpu", g.grant.GPU.UUID, "server", g.server, "memoryLimit", g.grant.MemoryLimitBytes, "weight", g.settings.Weight,
			"computeLimit", g.settings.CapPercent, "high", g.settings.High, "dir", name)
	}
	if err := writeSpec(d.cfg.CDIDir, c.Metadata.UID, specs); err != nil {
		return nil, fmt.Errorf("CDI spec: %w", err)
	}
	return out, nil
}

// decide turns a claim's allocation into grants, writing nothing.
func (d *Driver) decide(ctx context.Context, c *ResourceClaim) ([]claimGrant, error) {
	if err := validUID(c.Metadata.UID); err != nil {
		return nil, err
	}
	if c.Status.Allocation == nil {
		return nil, errors.New("not allocated")
	}
	alloc := c.Status.Allocation.Devices
	var out []claimGrant
	for _, r := range alloc.Results {
		if r.Driver != DriverName {
			continue
		}
		if len(out) > 0 {
			return nil, errors.New("more than one GPU in one claim: a container is held to one GPU's quota; ask for one device per claim")
		}
		if r.AdminAccess != nil && *r.AdminAccess {
			return nil, fmt.Errorf("request %s: admin access is not offered (it would bypass the device's capacity)", r.Request)
		}
		g, server, err := d.device(ctx, r)
		if err != nil {
			return nil, err
		}
		mem, okMem := r.ConsumedCapacity[CapacityMemory]
		comp, okComp := r.ConsumedCapacity[CapacityCompute]
		if !okMem || !okComp {
			return nil, fmt.Errorf("device %s: the allocation names no consumed memory and compute: "+
				"the cluster's DRAConsumableCapacity feature gate must be on", r.Device)
		}
		memBytes, compPct := int64(mem), int64(comp)
		if memBytes <= 0 || uint64(memBytes) > g.MemoryBytes || compPct < 1 || compPct > fullCompute {
			return nil, fmt.Errorf("device %s: consumed memory %s and compute %d: want 1 byte to the GPU's %s and 1-100",
				r.Device, vocab.FormatSize(uint64(max(memBytes, 0))), compPct, vocab.FormatSize(g.MemoryBytes))
		}
		cfg, err := shareConfigFor(alloc.Config, r.Request)
		if err != nil {
			return nil, err
		}
		st := scheduler.Settings{Weight: computeWeight(compPct, g.MaxInst)}
		if cfg.Weight != nil {
			st.Weight = *cfg.Weight
		}
		if cfg.ComputeLimit != nil {
			if server != "" {
				return nil, fmt.Errorf("device %s/%s: computeLimit is not offered on a remote GPU (its server holds a session to its weight and memory)", r.Pool, r.Device)
			}
			st.CapPercent = *cfg.ComputeLimit
		}
		if cfg.Priority != nil {
			st.High, _ = vocab.ParsePriority(*cfg.Priority)
		}
		out = append(out, claimGrant{result: r, settings: st, server: server, grant: allocation.Grant{GPU: g.GPU, Kind: allocation.Slot, Count: 1,
			MemoryLimitBytes: uint64(memBytes), Weight: uint32(st.Weight), CapPercent: uint32(st.CapPercent),
			HighPriority: st.High, Dir: allocation.ClaimDirName(c.Metadata.UID, r.Device)}})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no device of %s allocated", DriverName)
	}
	return out, nil
}

// device is the GPU a result names: one of the node's, or another node's
// offered to the node's remote pool (with the server that holds it).
func (d *Driver) device(ctx context.Context, r Result) (GPU, string, error) {
	if r.Pool != d.cfg.NodeName {
		return d.remoteGPU(ctx, r.Pool, r.Device)
	}
	g, ok := d.gpu(r.Device)
	if !ok {
		return GPU{}, "", fmt.Errorf("device %s: no such GPU on this node now", r.Device)
	}
	return g, "", nil
}

// computeWeight is the weight a claim's compute capacity gives when its
// ShareConfig sets none: its slots' worth (one slot, 100/maxInst percent,
// is weight 1, as a gpuwarden.io/gpu slot is), at least 1.
func computeWeight(pct int64, maxInst int) int {
	w := int(math.Round(float64(pct) * float64(maxInst) / fullCompute))
	return min(max(w, 1), vocab.MaxWeight)
}

// shareConfigFor merges the ShareConfigs that apply to request, in the
// allocation's order (a class's before the claim's): later fields win.
func shareConfigFor(configs []AllocConfig, request string) (ShareConfig, error) {
	parent, _, _ := strings.Cut(request, "/") // a subrequest's configs are its request's too
	var out ShareConfig
	for _, c := range configs {
		if c.Opaque == nil || c.Opaque.Driver != DriverName {
			continue
		}
		if len(c.Requests) > 0 && !slices.Contains(c.Requests, request) && !slices.Contains(c.Requests, parent) {
			continue
		}
		sc, err := DecodeShareConfig(c.Opaque.Parameters)
		if err != nil {
			return ShareConfig{}, fmt.Errorf("%s config: %w", c.Source, err)
		}
		out = sc.merge(out)
	}
	return out, nil
}

// Unprepare removes what Prepare wrote for a claim: its CDI spec, its
// control directories and their saved settings. A claim that was never
// prepared here has nothing to remove.
func (d *Driver) Unprepare(uid string) error {
	d.dirs.Lock()
	defer d.dirs.Unlock()
	return d.unprepare(uid)
}

func (d *Driver) unprepare(uid string) error {
	if err := validUID(uid); err != nil {
		return err
	}
	entries, err := os.ReadDir(d.cfg.Node.ControlDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	prefix := allocation.ClaimDirName(uid, "")
	var errs []error
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), prefix) || !allocation.IsClaimDirName(e.Name()) {
			continue
		}
		errs = append(errs, d.releaseRemote(e.Name()))
		if d.cfg.SetCompute != nil {
			errs = append(errs, d.cfg.SetCompute(e.Name(), nil))
		}
		errs = append(errs, controlblock.RemoveDir(d.cfg.Node.ControlDir, e.Name(), allocation.ControlFiles...))
	}
	errs = append(errs, removeSpec(d.cfg.CDIDir, uid))
	return errors.Join(errs...)
}
