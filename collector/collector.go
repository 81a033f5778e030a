package collector

import (
	"context"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/agentapi"

	"github.com/gpuwarden/gpuwarden/bpf/observe"
	"github.com/gpuwarden/gpuwarden/collector/cgroups"
	"github.com/gpuwarden/gpuwarden/collector/ledgertrust"
	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
	"github.com/gpuwarden/gpuwarden/enforcer/membership"
	"github.com/gpuwarden/gpuwarden/enforcer/nvmldev"
)

// Sources are what the collector joins. A nil source is switched off.
type Sources struct {
	EBPF       func() (observe.Snapshot, error)
	NVML       func() ([]nvmldev.Device, error)
	ControlDir string // interposer ledgers: <ControlDir>/<container key>/{usage,limits}
	// Labels names a container from its ledger directory and cgroup path
	// (Kubernetes: the kubelet's pod-resources answer), and identifies the
	// answer it names them from (equal answers, equal numbers); nil or
	// false: the labels come from the cgroup path.
	Labels  func(ctx context.Context) (LabelFunc, uint64, error)
	Cgroups *cgroups.Resolver
	// Sessions names the client of a remote GPU session from its worker's
	// cgroup path (its certificate's identity); nil: no remote sessions.
	Sessions func(cgroupPath string) (namespace, pod, container string, ok bool)
	// Claims checks each ledger's cgroup claim; nil: no ledger is believed.
	Claims   *ledgertrust.Verifier
	ProcRoot string
	// CgroupNSRoot is the host path of the agent's cgroup namespace root,
	// which processes' cgroup paths are relative to ("" or "/": none).
	CgroupNSRoot string
	// Scheduling gives what the enforcer holds each container to, per
	// cgroup and GPU; nil: no enforcer.
	Scheduling func() map[membership.GPUKey]membership.Scheduled
	// NVMLContextBytes is what NVML may show per process beyond what the
	// ledger and the probes count (a context's own memory).
	NVMLContextBytes uint64
}

// LabelFunc names the container of a ledger directory or cgroup path.
type LabelFunc func(ledgerDir, cgroupPath string) (namespace, pod, container string, ok bool)

// Key identifies one container's use of one device: GPU is NVML's index
// (NoGPU: a device gpuwarden cannot name).
type Key struct {
	Cgroup uint64
	GPU    int
}

// NoGPU is the index of a container's use of GPUs whose identity is not
// known: its ledger records no UUID for them (an old interposer) on a node
// of more than one GPU.
const NoGPU = -1

// Collector builds views and serves them as metrics.
type Collector struct {
	node    string
	src     Sources
	version string
	log     *slog.Logger
	maxAge  time.Duration // a view younger than this is served again

	mu   sync.Mutex
	last *View
	// from is what last was joined from, at joined; quiet: nothing in last
	// moves with time alone, so the same inputs make it again.
	from   *inputs
	joined time.Time
	quiet  bool
	joins  uint64 // views joined, for View.gen

	exposed exposition                       // the last view joined, encoded for scrapes
	totals  map[Key]*controlblock.ProcTotals // per cgroup and GPU: launches and throttled time
	// unmapped holds the ledger directories already logged for GPUs of
	// unknown UUID.
	unmapped map[string]bool
	ledgers  ledgerFiles
	dirs     *controlblock.Dirs // the container directories under src.ControlDir
	judge    judge
	refused  refusedLedgers
	procIDs  map[int]gpuProc             // GPU processes identified, by host pid
	labels   atomic.Pointer[LabelFunc]   // the last view's, for Assigned
	slots    atomic.Pointer[ledgerSlots] // the last view's, for InLedger
}

// New makes a collector for a node.
func New(node, version string, src Sources, log *slog.Logger) *Collector {
	if src.ProcRoot == "" {
		src.ProcRoot = "/proc"
	}
	return &Collector{node: node, src: src, version: version, log: log, maxAge: time.Second,
		totals: map[Key]*controlblock.ProcTotals{}, unmapped: map[string]bool{}, judge: newJudge(),
		dirs: controlblock.NewDirs(src.ControlDir)}
}

// View returns the current view, reading the sources at most once per
// second: NVML's utilization is a window since the previous read, so the
// metrics and the API must not steal samples from each other.
func (c *Collector) View(ctx context.Context) *View {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last != nil && time.Since(c.last.Time) < c.maxAge {
		return c.last
	}
	c.last = c.build(ctx)
	return c.last
}

// Deciding says whether the last view left evidence that a later view
// turns into a breach or drops (a bypass awaiting its second sight, a
// comparison its sustain): whoever acts on breaches looks again a second
// later rather than at its own pace. A breach already decided is not.
func (c *Collector) Deciding() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.judge.deciding()
}

// build reads the sources and joins them into a view, unless they read as
// they did for the last view, which showed nothing moving, joined less than
// rejoinEvery ago: then it is that view again, as of now.
func (c *Collector) build(ctx context.Context) *View {
	in := c.read(ctx)
	if c.last != nil && c.quiet && in.time.Sub(c.joined) < rejoinEvery && in.same(c.from) {
		v := *c.last
		v.Time = in.time
		return &v
	}
	v := c.join(in)
	c.joins++
	v.gen = c.joins
	v.BadLedgers = c.ledgers.badList()
	c.logBadLedgers(v.BadLedgers)
	c.from, c.joined, c.quiet = in, in.time, c.quietView(in, v)
	return v
}

// logBadLedgers logs each refused ledger once, when it goes bad or its
// fault changes, not on every view.
func (c *Collector) logBadLedgers(bad []agentapi.BadLedger) {
	before := map[agentapi.BadLedger]bool{}
	if c.last != nil {
		for _, b := range c.last.BadLedgers {
			before[b] = true
		}
	}
	for _, b := range bad {
		if !before[b] {
			c.log.Warn("ledger refused: the container's control block is broken", "dir", b.Dir, "err", b.Error)
		}
	}
}

// Assigned is the kubelet's assignment of control directories as of the
// last view, for ledgertrust.Verify; nil off Kubernetes.
func (c *Collector) Assigned() ledgertrust.Assigned {
	l := c.labels.Load()
	if l == nil || *l == nil {
		return nil
	}
	return assignedBy(*l)
}

func goVersion() string { return runtime.Version() }
