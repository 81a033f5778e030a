// Package simrun runs containers of simgpu workloads under the enforcer's
// scheduler, as the agent would: each container has its own control
// directory with a limits file the scheduler drives, its processes preload
// the interposer, and busy time comes from simgpu's NVML through
// enforcer/nvmldev. The enforcer's tests and `gpuwarden bench --only
// enforcer` use it.
package simrun

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
	"github.com/gpuwarden/gpuwarden/enforcer/hostcgroup"
	"github.com/gpuwarden/gpuwarden/enforcer/nvmldev"
	"github.com/gpuwarden/gpuwarden/enforcer/scheduler"
)

// Machine is a simulated machine: bin/ (with simgpu/ and libgpuwarden.so in
// it) and a directory for its state and control blocks. simgpu's NVML binds
// to one state file per process, so every Run of a process must use the same
// Machine.
type Machine struct {
	Bin, Dir string
	Devices  int
	Memory   string
	// Model is SIMGPU_MODEL for every process of a Run, this one's NVML
	// included ("" exact, "h200"). Runs of one process may differ in it:
	// NVML reads it at each Start.
	Model string
	// SampleMs is SIMGPU_NVML_SAMPLE_MS, the h200 model's NVML sample
	// period (0: the model's own).
	SampleMs int
}

func (m Machine) env() []string {
	sampleMs := "" // the model's own
	if m.SampleMs > 0 {
		sampleMs = strconv.Itoa(m.SampleMs)
	}
	var out []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "GPUWARDEN_") || strings.HasPrefix(kv, "ALIYUN_COM_GPU_") ||
			strings.HasPrefix(kv, "LD_PRELOAD=") || strings.HasPrefix(kv, "SIMGPU_") {
			continue
		}
		out = append(out, kv)
	}
	return append(out, "SIMGPU_STATE="+filepath.Join(m.Dir, "simgpu.state"),
		fmt.Sprintf("SIMGPU_DEVICES=%d", max(m.Devices, 1)), "SIMGPU_MEMORY="+m.Memory, "SIMGPU_MODEL="+m.Model,
		"SIMGPU_NVML_SAMPLE_MS="+sampleMs)
}

// Container is one container running bin/simgpu/workload with Args.
type Container struct {
	Name     string
	Args     []string // workload arguments (--seconds, --kernel-ns, ...)
	Env      []string // GPUWARDEN_* variables for its processes
	Settings scheduler.Settings
	Ungated  bool // not put under the scheduler (no limits file)
}

// Run is a set of containers under one scheduler.
type Run struct {
	M      Machine
	Sched  *scheduler.Scheduler
	Source *scheduler.NVMLSource
	reader *nvmldev.Reader
	gpu0   scheduler.Device // the machine's GPU 0, ordinal 0 in every container
	key    string
	root   string // this run's control directories

	mu      sync.Mutex
	procs   map[string]*proc
	pending []Container
	idle    []io.Closer // AddIdle's files
}

type proc struct {
	cmd    *exec.Cmd
	out    bytes.Buffer
	errb   bytes.Buffer
	limits *controlblock.LimitsFile
	usage  *controlblock.UsageFile
	done   chan struct{}
	err    error
	// progress is what the workload's --progress lines said, read by Wait:
	// images done by each line's time.
	progress []progressPoint
}

type progressPoint struct {
	at     time.Time
	images float64
}

// Start makes the scheduler (cfg.Source is filled in) and sets GPU 0.
func Start(m Machine, cfg scheduler.Config, gs scheduler.GPUSettings) (*Run, error) {
	if err := os.MkdirAll(m.Dir, 0o755); err != nil {
		return nil, err
	}
	// NVML must see the machine: load simgpu's library with its environment.
	for _, kv := range m.env() {
		if k, v, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, "SIMGPU_") {
			os.Setenv(k, v)
		}
	}
	r, err := nvmldev.Open(filepath.Join(m.Bin, "simgpu", "libnvidia-ml.so.1"))
	if err != nil {
		return nil, err
	}
	cg, err := hostcgroup.Of("/proc", os.Getpid())
	if err != nil {
		return nil, err
	}
	root, err := os.MkdirTemp(m.Dir, "run-")
	if err != nil {
		return nil, err
	}
	uuids, err := r.UUIDs()
	if err != nil {
		return nil, err
	}
	if len(uuids) == 0 {
		return nil, errors.New("no GPU")
	}
	run := &Run{M: m, reader: r, gpu0: scheduler.Device{Ordinal: 0, UUID: uuids[0]}, key: controlblock.ContainerKey(cg),
		root: root, procs: map[string]*proc{}}
	run.Sched = withSource(cfg, run)
	if err := run.Sched.SetGPU(run.gpu0.UUID, gs); err != nil {
		return nil, err
	}
	run.Sched.Start()
	return run, nil
}

// withSource builds the scheduler whose source maps pids through the
// scheduler's own ledgers.
func withSource(cfg scheduler.Config, run *Run) *scheduler.Scheduler {
	var s *scheduler.Scheduler
	mapper := func(pid uint32) (string, bool) { return s.PidMapper()(pid) }
	run.Source = scheduler.NewNVMLSource(run.reader, mapper)
	cfg.Source = run.Source
	s = scheduler.New(cfg)
	return s
}

func (r *Run) ctl(name string) string { return filepath.Join(r.root, name) }

// UsagePath is a container's ledger.
func (r *Run) UsagePath(name string) string { return controlblock.UsagePath(r.ctl(name), r.key) }

// closedGate is a new container's limits: its launches wait until the
// scheduler grants them, and a stalled test does not let them through.
func (r *Run) closedGate() controlblock.LimitsConfig {
	return controlblock.LimitsConfig{GateMask: 1, GraceNs: uint64(60 * time.Second), NDev: uint32(max(r.M.Devices, 1))}
}

// Limits returns a container's limits file (nil for an ungated one).
func (r *Run) Limits(name string) *controlblock.LimitsFile {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p := r.procs[name]; p != nil {
		return p.limits
	}
	return nil
}

// Key is the container key every container of a Run has (each has its own
// control directory).
func (r *Run) Key() string { return r.key }

// Add starts a container and puts it under the scheduler.
func (r *Run) Add(c Container) error {
	if err := r.Spawn(c); err != nil {
		return err
	}
	return r.Admit()
}

// Admit puts every container started with Spawn under the scheduler at once.
func (r *Run) Admit() error {
	r.mu.Lock()
	pending := r.pending
	r.pending = nil
	r.mu.Unlock()
	for _, c := range pending {
		p := r.procs[c.Name]
		if err := r.Sched.AddContainer(c.Name, p.limits, p.usage, []scheduler.Device{r.gpu0}, c.Settings); err != nil {
			return err
		}
	}
	return nil
}

// Spawn starts a container whose launches wait (its gate is closed) until Admit.
func (r *Run) Spawn(c Container) error {
	ctl := r.ctl(c.Name)
	p := &proc{done: make(chan struct{})}
	if !c.Ungated {
		// Gate closed from the first launch: nothing runs before the scheduler has it.
		l, err := controlblock.CreateLimits(controlblock.LimitsPath(ctl, r.key), r.closedGate())
		if err != nil {
			return err
		}
		p.limits = l
	}
	p.cmd = exec.Command(filepath.Join(r.M.Bin, "simgpu", "workload"), append([]string{"--label", c.Name}, c.Args...)...)
	p.cmd.Env = append(r.M.env(), "LD_PRELOAD="+filepath.Join(r.M.Bin, "libgpuwarden.so"), "GPUWARDEN_CONTROL_DIR="+ctl)
	p.cmd.Env = append(p.cmd.Env, c.Env...)
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.errb
	if err := p.cmd.Start(); err != nil {
		return err
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	r.mu.Lock()
	r.procs[c.Name] = p
	r.mu.Unlock()
	if c.Ungated {
		return nil
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		u, err := controlblock.OpenUsage(controlblock.UsagePath(ctl, r.key))
		if err == nil {
			if _, err = u.Snapshot(); err == nil {
				p.usage = u
				break
			}
			u.Close()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: no ledger: %v: %s", c.Name, err, p.errb.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	r.mu.Lock()
	r.pending = append(r.pending, c)
	r.mu.Unlock()
	return nil
}

// AddIdle puts n more containers on device 0 that never launch: copies of
// the ledger of container from (made with Spawn), each with its own control
// directory. Many idle containers cost the scheduler what many real ones
// would, without a process each.
func (r *Run) AddIdle(from string, n int) error {
	b, err := os.ReadFile(controlblock.UsagePath(r.ctl(from), r.key))
	if err != nil {
		return err
	}
	// No processes: the source must not take the original's for a copy's.
	clear(b[unsafe.Offsetof(controlblock.Usage{}.Slots):])
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("%s-idle-%d", from, i)
		ctl := r.ctl(name)
		if err := os.MkdirAll(filepath.Join(ctl, r.key), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(controlblock.UsagePath(ctl, r.key), b, 0o644); err != nil {
			return err
		}
		l, err := controlblock.CreateLimits(controlblock.LimitsPath(ctl, r.key), r.closedGate())
		if err != nil {
			return err
		}
		u, err := controlblock.OpenUsage(controlblock.UsagePath(ctl, r.key))
		if err != nil {
			l.Close()
			return err
		}
		r.mu.Lock()
		r.idle = append(r.idle, l, u)
		r.mu.Unlock()
		if err := r.Sched.AddContainer(name, l, u, []scheduler.Device{r.gpu0}, scheduler.Settings{Weight: 1}); err != nil {
			return err
		}
	}
	return nil
}

// Wait waits for a container's workload and returns its BENCH figures by
// name suffix ("images_per_sec", ...).
func (r *Run) Wait(name string, timeout time.Duration) (map[string]float64, error) {
	r.mu.Lock()
	p := r.procs[name]
	r.mu.Unlock()
	select {
	case <-p.done:
		if p.err != nil {
			return nil, fmt.Errorf("%s: %w: %s", name, p.err, p.errb.String())
		}
	case <-time.After(timeout):
		p.cmd.Process.Kill()
		return nil, fmt.Errorf("%s: still running after %v", name, timeout)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(&p.out)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 4 && f[0] == "BENCH" {
			v, _ := strconv.ParseFloat(f[2], 64)
			out[strings.TrimPrefix(f[1], name+"_")] = v
		}
		if len(f) == 4 && f[0] == "progress" {
			sec, err1 := strconv.ParseFloat(f[1], 64)
			images, err2 := strconv.ParseFloat(f[2], 64)
			if err1 == nil && err2 == nil {
				p.progress = append(p.progress, progressPoint{time.Unix(0, int64(sec*1e9)), images})
			}
		}
	}
	return out, nil
}

// Rate returns a container's images per second between t0 and t1: the
// least-squares slope of its workload's progress lines (run it with
// --progress; about four a second) in that window. Call it after Wait.
// Under a scheduler a container's images come in bursts, its slices, so a
// difference of two readings moves by up to a slice's images with where
// the window's ends fall; a slope over every reading moves far less.
// Unlike Launches it counts only work that ran.
func (r *Run) Rate(name string, t0, t1 time.Time) (float64, error) {
	r.mu.Lock()
	p := r.procs[name]
	r.mu.Unlock()
	var n, st, si, stt, sti float64
	for _, pt := range p.progress {
		if pt.at.Before(t0) || pt.at.After(t1) {
			continue
		}
		x := pt.at.Sub(t0).Seconds()
		n, st, si, stt, sti = n+1, st+x, si+pt.images, stt+x*x, sti+x*pt.images
	}
	if d := n*stt - st*st; n >= 3 && d > 0 {
		return (n*sti - st*si) / d, nil
	}
	return 0, fmt.Errorf("%s: %v progress lines between %s and %s (run the workload with --progress)", name, n, t0.Format(time.StampMilli), t1.Format(time.StampMilli))
}

// Busy returns each container's cumulative busy ns on device 0 (NVML).
func (r *Run) Busy() map[string]uint64 {
	b, err := r.Source.Busy()
	if err != nil {
		return nil
	}
	return b[r.gpu0.UUID]
}

// GPU0 is the UUID of the machine's GPU 0, which every container uses.
func (r *Run) GPU0() string { return r.gpu0.UUID }

// Launches returns the gate tickets a container has taken on device 0:
// one per launch, and the few a thread's batch holds at a gate's close,
// which lapse unused. So the ratio of two containers' launches over a
// window is about the ratio of their rates, a little high for the one
// whose batches are larger (2% at 2 ms kernels, weights 1:2); Rate
// counts only what ran.
func (r *Run) Launches(name string) uint64 {
	u, err := controlblock.OpenUsage(controlblock.UsagePath(r.ctl(name), r.key))
	if err != nil {
		return 0
	}
	defer u.Close()
	return u.Issued(0)
}

// Close stops the scheduler, kills what still runs and closes the files.
func (r *Run) Close() {
	r.Sched.Stop()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.procs {
		p.cmd.Process.Kill()
		<-p.done
		if p.usage != nil {
			p.usage.Close()
		}
		if p.limits != nil {
			p.limits.Close()
		}
	}
	for _, f := range r.idle {
		f.Close()
	}
	r.reader.Close()
	os.RemoveAll(r.root)
}
