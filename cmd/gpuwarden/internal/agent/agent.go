// Package agent is `gpuwarden agent`, the node daemon: it starts the parts
// the configuration switches on (eBPF observation, NVML, the collector and
// its HTTP server), keeps running the parts that start when others fail, and
// shuts down cleanly, leaving pinned eBPF state and control blocks in place.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpuwarden/gpuwarden/bpf/observe"
	"github.com/gpuwarden/gpuwarden/bpf/probes"
	"github.com/gpuwarden/gpuwarden/cmd/gpuwarden/internal/config"
	"github.com/gpuwarden/gpuwarden/collector"
	"github.com/gpuwarden/gpuwarden/collector/cgroups"
	"github.com/gpuwarden/gpuwarden/collector/kubelet"
	"github.com/gpuwarden/gpuwarden/collector/ledgertrust"
	"github.com/gpuwarden/gpuwarden/deploy/deviceplugin"
	"github.com/gpuwarden/gpuwarden/deploy/dra"
	"github.com/gpuwarden/gpuwarden/enforcer/connlimit"
	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
	"github.com/gpuwarden/gpuwarden/enforcer/hostcgroup"
	"github.com/gpuwarden/gpuwarden/enforcer/membership"
	"github.com/gpuwarden/gpuwarden/enforcer/nvmldev"
	"github.com/gpuwarden/gpuwarden/enforcer/onbreach"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/relay"
	"github.com/gpuwarden/gpuwarden/enforcer/settings"
)

// Agent is one running node agent.
type Agent struct {
	cfg     config.Config
	version string
	log     *slog.Logger

	parts         parts
	nsRoot        string            // host path of the agent's cgroup namespace root
	resolver      *cgroups.Resolver // nil when no cgroup v2 tree was found
	enf           atomic.Pointer[membership.Members]
	breaches      *onbreach.Responder // nil unless enforcing
	settings      *settings.Store     // what ctl changed; nil unless enforcing
	nvml          *nvmldev.Reader
	plugin        *deviceplugin.Plugin  // nil unless the device plugin runs
	driver        *dra.Driver           // nil unless the DRA driver runs
	pods          *kubelet.PodResources // nil off Kubernetes
	relay         *relay.Relay          // nil unless remote GPUs are relayed for pods
	serving       bool                  // remote sessions are served on this node's GPUs
	observer      *observe.Observer
	coll          *collector.Collector
	srv           *http.Server
	lis           net.Listener
	refused       map[string]func() uint64 // each capped listener's refusals, by name
	evicted       map[string]func() uint64 // idle connections each closed to admit new ones
	remoteTraffic *remoteTraffic           // the remote sessions' bytes; nil: sessions are not served
	kernelTLS     sync.Once                // checked once, by the first remote part to start
	closers       []func() error
	wg            sync.WaitGroup

	// ledgers is coll once made, for the probes' scan, which starts first.
	ledgers atomic.Pointer[collector.Collector]
}

// Start starts every enabled part. Only a part the others cannot do without
// (the HTTP listener) fails Start; the rest are logged and reported down on
// /readyz.
func Start(ctx context.Context, cfg config.Config, version string, log *slog.Logger) (*Agent, error) {
	a := &Agent{cfg: cfg, version: version, log: log, refused: map[string]func() uint64{},
		evicted: map[string]func() uint64{}}
	node := nodeName(cfg)
	log.Info("starting gpuwarden agent", "version", version, "node", node)

	resolver, cgroupFS := a.startCgroups()
	a.resolver = resolver
	a.nsRoot = a.cgroupNamespaceRoot(resolver)
	// One verifier of ledgers' claims serves the collector and the enforcer.
	var verifier *ledgertrust.Verifier
	if resolver != nil {
		verifier = ledgertrust.NewVerifier(resolver, cgroupFS, cfg.Paths.Proc)
	}
	src := collector.Sources{ControlDir: cfg.ControlDir, Cgroups: resolver, Claims: verifier, ProcRoot: cfg.Paths.Proc, CgroupNSRoot: a.nsRoot,
		NVMLContextBytes: uint64(cfg.NVML.ContextMemory) << 20,
		Scheduling: func() map[membership.GPUKey]membership.Scheduled {
			if e := a.enf.Load(); e != nil {
				return e.Scheduling()
			}
			return nil
		}}
	if cfg.NVML.Enabled {
		a.startNVML()
		if a.nvml != nil {
			src.NVML = a.nvml.Devices
		}
	}
	if cfg.EBPF.Enabled {
		a.startEBPF()
		if a.observer != nil {
			src.EBPF = a.observer.Snapshot
		}
	}
	pods := a.startAnnotations(node) // nil off Kubernetes
	if labels := a.startKubelet(pods); labels != nil {
		src.Labels = labels
	}
	src.Sessions = a.startRemote(cgroupFS, node)
	a.coll = collector.New(node, version, src, log)
	a.ledgers.Store(a.coll)
	a.startProfiling(node)
	if cfg.DevicePlugin.Enabled || cfg.DRA.Enabled || cfg.Enforcement.Enabled {
		// Before any container directory is adopted or made in it.
		if err := controlblock.PrepareControlDir(cfg.ControlDir); err != nil {
			log.Error("control directory not prepared", "err", err)
		}
	}
	if cfg.DevicePlugin.Enabled {
		a.startDevicePlugin(ctx, pods)
	}
	if cfg.Enforcement.Enabled && resolver != nil {
		a.enf.Store(a.startEnforcement(resolver, verifier, cgroupFS, pods))
	}
	if cfg.DRA.Enabled { // after the enforcer: claims' settings go to its store
		a.startDRA(ctx, pods)
	}
	if (cfg.DevicePlugin.Enabled || cfg.DRA.Enabled || cfg.Enforcement.Enabled) && cfg.ControlDirGrace > 0 {
		a.startSweeping(resolver)
	}

	// HTTP last: once /healthz answers, every part has started (agentapi's
	// readiness).
	if cfg.HTTP.Enabled {
		if err := a.startHTTP(); err != nil {
			a.Close()
			return nil, err
		}
	}
	return a, nil
}

func nodeName(cfg config.Config) string {
	if cfg.NodeName != "" {
		return cfg.NodeName
	}
	if n := os.Getenv("NODE_NAME"); n != "" {
		return n
	}
	h, _ := os.Hostname()
	return h
}

// startCgroups finds the host's cgroup v2 tree: the cgroup2 mount at
// paths.cgroup or below it (a hybrid host has it at .../unified), else the
// agent's own.
func (a *Agent) startCgroups() (*cgroups.Resolver, string) {
	dir := a.cfg.Paths.Cgroup
	if dir == "" {
		dir = "/"
	}
	root, err := hostcgroup.MountUnder(filepath.Join(a.cfg.Paths.Proc, "self", "mountinfo"), dir)
	a.parts.set("cgroups", true, err)
	if err != nil {
		a.log.Error("cgroup v2 not found: containers will not be resolved or enforced", "err", err)
		return nil, ""
	}
	a.log.Info("cgroup v2 tree", "root", root)
	return cgroups.NewResolver(root), root
}

// checkCgroups marks the cgroups part down while its tree places none of
// the processes that NVML reports or eBPF found mapping libcuda: every
// container would go unseen and unenforced.
func (a *Agent) checkCgroups() {
	if a.resolver == nil {
		return // down since start, with its reason
	}
	var pids []int
	if a.nvml != nil {
		if devs, err := a.nvml.Devices(); err == nil {
			for _, d := range devs {
				for _, p := range d.Processes {
					pids = append(pids, int(p.PID))
				}
			}
		}
	}
	if a.observer != nil {
		for _, l := range a.observer.Libraries() {
			if l.PID > 0 {
				pids = append(pids, l.PID)
			}
		}
	}
	a.parts.set("cgroups", true, a.resolver.CheckPlaced(a.cfg.Paths.Proc, a.nsRoot, pids))
}

// cgroupNamespaceRoot: an agent in a pod has a cgroup namespace of its own,
// and reads other processes' cgroup paths relative to it; with the host's
// tree mounted (paths.cgroup) it finds where its namespace's root is there.
func (a *Agent) cgroupNamespaceRoot(r *cgroups.Resolver) string {
	if r == nil || a.cfg.Paths.Cgroup == "" {
		return "/"
	}
	root, err := cgroups.NamespaceRoot(r, "/proc/self/mountinfo")
	if err != nil {
		a.log.Warn("cannot place the agent's cgroup namespace in the host's tree; process cgroup paths are taken as they read", "err", err)
		return "/"
	}
	if root != "/" {
		a.log.Info("agent runs in a cgroup namespace", "root", root)
	}
	return root
}

func (a *Agent) startNVML() {
	r, err := nvmldev.Open(a.cfg.NVML.Library)
	a.parts.set("nvml", true, err)
	if err != nil {
		a.log.Error("NVML unavailable: no device metrics", "err", err)
		return
	}
	a.nvml = r
	a.closers = append(a.closers, r.Close)
}

func (a *Agent) startEBPF() {
	oc := observe.DefaultConfig()
	oc.PinDir = a.cfg.EBPF.PinDir
	oc.Libraries = a.cfg.EBPF.Libraries
	oc.LdconfigSoname = a.cfg.EBPF.LdconfigSoname
	oc.ProcRoot = a.cfg.Paths.Proc
	oc.ScanInterval = a.cfg.EBPF.ScanInterval
	oc.LaunchWindow = a.cfg.EBPF.LaunchWindow
	oc.LaunchPeriod = a.cfg.EBPF.LaunchPeriod
	// A process its container's ledger counts needs no launch probe; the
	// others' launches are counted exactly. Enforcing, the agent reads the
	// ledgers every 4 s anyway; else the question reads them that often.
	oc.Ledgered = func(pid int) bool {
		c := a.ledgers.Load()
		if c == nil {
			return false
		}
		c.Refresh(context.Background(), 5*time.Second)
		return c.InLedger(pid)
	}
	oc.Logger = a.log.With("part", "ebpf")
	o, err := observe.Start(oc)
	if errors.Is(err, probes.ErrNoBPFFS) {
		// Observe without pinning rather than not at all.
		a.log.Warn("no bpffs for the pin directory: eBPF state will not survive a restart", "pinDir", oc.PinDir, "err", err)
		oc.PinDir = ""
		o, err = observe.Start(oc)
	}
	a.parts.set("ebpf", true, err)
	if err != nil {
		a.log.Error("eBPF observation unavailable; the other parts run without it", "err", err)
		return
	}
	a.observer = o
	a.closers = append(a.closers, o.Close)
	a.wg.Add(1)
	go a.logFailedAllocs(o.FailedAllocs())
}

// logFailedAllocs logs each allocation the driver refused, as eBPF saw it.
func (a *Agent) logFailedAllocs(events <-chan observe.FailedAlloc) {
	defer a.wg.Done()
	for e := range events {
		a.log.Info("GPU allocation refused by the driver", "pid", e.PID, "comm", e.Comm, "cgroup", e.Cgroup,
			"device", e.Device, "bytes", e.Bytes, "result", e.Result, "api", e.API)
	}
}

func (a *Agent) startHTTP() error {
	h := a.cfg.HTTP
	lis, err := connlimit.Listen(h.Listen, connlimit.Limits{Total: h.MaxConnections, PerSource: h.MaxConnectionsPerSource},
		a.log.With("listener", "http"))
	if err != nil {
		a.parts.set("http", true, err)
		return fmt.Errorf("listen on %s: %w", h.Listen, err)
	}
	a.parts.set("http", true, nil)
	a.lis = lis
	a.refused["http"], a.evicted["http"] = lis.Refused, lis.Evicted
	a.srv = &http.Server{Handler: a.mux(), ReadHeaderTimeout: readHeaderTimeout, ReadTimeout: readTimeout,
		WriteTimeout: writeTimeout, IdleTimeout: idleTimeout, ConnState: markIdle}
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		if err := a.srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.Error("http server stopped", "err", err)
		}
	}()
	a.log.Info("serving", "address", lis.Addr().String())
	return nil
}

// Addr is the HTTP server's address (useful with a :0 listen address).
func (a *Agent) Addr() string {
	if a.lis == nil {
		return ""
	}
	return a.lis.Addr().String()
}

// Close stops every part: the HTTP server first, then the sources. Pinned
// eBPF maps and control blocks stay for the next agent.
func (a *Agent) Close() error {
	var errs []error
	if a.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		errs = append(errs, a.srv.Shutdown(ctx))
		cancel()
	}
	for i := len(a.closers) - 1; i >= 0; i-- {
		errs = append(errs, a.closers[i]())
	}
	a.wg.Wait()
	a.log.Info("agent stopped")
	return errors.Join(errs...)
}
