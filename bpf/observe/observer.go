// Package observe is the eBPF view the collector reads: it loads the probes,
// keeps them attached to every libcuda the node's processes use, counts the
// kernel launches of processes no ledger counts and samples the others' in
// short windows, clears the state of processes that are gone, and answers
// Snapshot.
package observe

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpuwarden/gpuwarden/bpf/libcuda"
	"github.com/gpuwarden/gpuwarden/bpf/probes"
)

// FailedAlloc is an allocation the driver refused.
type FailedAlloc = probes.FailedAlloc

// Observer runs the eBPF view. Its methods are safe for concurrent use.
type Observer struct {
	cfg    Config
	log    *slog.Logger
	probes *probes.Probes
	events *probes.Events
	failed chan FailedAlloc
	drops  atomic.Uint64 // failed-allocation events the reader did not take in time

	configured []string // configured library paths, with ldconfig's at start
	scanner    *libcuda.Scanner

	mu   sync.Mutex
	libs map[libcuda.FileID]*attached

	launch launchState
	// exact: the processes that map libcuda, by pid, and the exact launch
	// probes on those that keep no ledger (the scan's goroutine only);
	// exactOn: launches are counted so (the kernel can, pids are the
	// host's, and the sampling probes are not attached for good).
	exact      map[int]*exactProc
	exactOn    bool
	exactProcs atomic.Int64 // processes counted exactly now
	closing    sync.WaitGroup

	stop      chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup
}

// attached is a library file with probes on it.
type attached struct {
	lib      *probes.Library
	info     Library
	unmapped int // consecutive scans that found no process mapping it
}

// Library describes an attached libcuda file.
type Library struct {
	Path       string         // the path it was found by (configured, or as a process maps it)
	OpenPath   string         // the path the agent opened
	File       libcuda.FileID // device and inode
	Configured bool           // from the configuration or ldconfig: kept attached
	PID        int            // for a scanned file: the process it was found in
	Missing    []string       // entry points the file does not export
	Since      time.Time
}

// Start loads and attaches the probes and starts the background loops. Its
// errors wrap probes.ErrPermission, ErrNoBPFFS, ErrNoUprobes or ErrKernel
// when eBPF is refused; the agent can run its other parts without it.
func Start(cfg Config) (*Observer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// Load the programs and maps, reusing pinned state.
	p, err := probes.Open(cfg.PinDir, log)
	if err != nil {
		return nil, fmt.Errorf("start eBPF observation: %w", err)
	}
	o := &Observer{
		cfg: cfg, log: log, probes: p,
		failed:  make(chan FailedAlloc, cfg.FailedAllocBuffer),
		libs:    map[libcuda.FileID]*attached{},
		scanner: libcuda.NewScanner(cfg.ProcRoot),
		stop:    make(chan struct{}),
	}
	// The probes name processes by host pid: where ProcRoot numbers them
	// so, a scan reads only the processes they name, and new ones, and the
	// launches of processes no ledger counts can be counted exactly.
	if hostPIDs(cfg.ProcRoot) {
		o.scanner.SetChanges(p.Changed)
		o.exactOn = p.ExactLaunches() && cfg.LaunchWindow > 0 && cfg.LaunchWindow < cfg.LaunchPeriod
		o.exact = map[int]*exactProc{}
	}
	// Processes that died while no agent watched leave the view now.
	o.reapDead()
	// Read failed-allocation events.
	if o.events, err = p.Events(); err != nil {
		p.Close()
		return nil, fmt.Errorf("start eBPF observation: %w", err)
	}
	o.wg.Add(1)
	go o.readEvents()
	// Attach to the configured libraries and to what processes map now.
	o.launch.init(cfg, time.Now())
	o.configured = configuredPaths(cfg, log)
	o.attachConfigured()
	o.scan()
	// Then keep looking, sampling launches and collecting garbage.
	o.loop(cfg.ScanInterval, o.scan)
	o.loop(cfg.GCInterval, o.collect)
	o.wg.Add(1)
	go o.sampleLaunches()
	return o, nil
}

// Close detaches every probe and stops the loops. Pinned maps stay, so a
// new Observer on the same PinDir goes on from where this one stopped.
func (o *Observer) Close() error {
	var err error
	o.closeOnce.Do(func() {
		close(o.stop)
		o.events.Close()
		o.wg.Wait()
		close(o.failed)
		o.closeExact()
		// Libraries side by side, as each library's links are: every
		// detach waits for handlers in flight, and a node (or a test
		// machine) can map many copies of libcuda.
		o.mu.Lock()
		var wg sync.WaitGroup
		for id, a := range o.libs {
			wg.Go(a.lib.Detach)
			delete(o.libs, id)
		}
		wg.Wait()
		o.mu.Unlock()
		err = o.probes.Close()
	})
	return err
}

// FailedAllocs delivers allocations the driver refused; it is closed by
// Close. Events that wait longer than the buffer holds are dropped and
// counted in Snapshot().Probes.LostEvents.
func (o *Observer) FailedAllocs() <-chan FailedAlloc { return o.failed }

// Libraries lists the attached libcuda files.
func (o *Observer) Libraries() []Library {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make([]Library, 0, len(o.libs))
	for _, a := range o.libs {
		out = append(out, a.info)
	}
	return out
}

// Probes gives the loaded probes, for tests and benchmarks.
func (o *Observer) Probes() *probes.Probes { return o.probes }

func (o *Observer) loop(every time.Duration, f func()) {
	if every <= 0 {
		return
	}
	o.wg.Add(1)
	go func() {
		defer o.wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-o.stop:
				return
			case <-t.C:
				f()
			}
		}
	}()
}

func (o *Observer) readEvents() {
	defer o.wg.Done()
	for {
		ev, err := o.events.Read()
		if errors.Is(err, probes.ErrClosed) {
			return
		}
		if err != nil {
			o.log.Warn("read failed-allocation event", "err", err)
			continue
		}
		select {
		case o.failed <- ev:
		default:
			o.drops.Add(1)
		}
	}
}

// configuredPaths are the configured libraries and where ldconfig finds the soname.
func configuredPaths(cfg Config, log *slog.Logger) []string {
	paths := append([]string(nil), cfg.Libraries...)
	if cfg.LdconfigSoname != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		found, err := libcuda.FromLdconfig(ctx, cfg.LdconfigSoname)
		cancel()
		if err != nil {
			log.Warn("find libcuda with ldconfig", "err", err)
		}
		paths = append(paths, found...)
	}
	return paths
}

// attachConfigured attaches the configured libraries that are not attached
// yet; a file replaced on disk (a driver upgrade) is a new file and gets
// attached too.
func (o *Observer) attachConfigured() {
	for _, path := range o.configured {
		id, err := libcuda.Identify(path)
		if err != nil {
			continue // not installed (yet): scanning finds what processes load
		}
		o.attach(id, Library{Path: path, OpenPath: path, File: id, Configured: true})
	}
}

// attach attaches to a file unless it already is. Attaching takes
// milliseconds: it is done outside the lock, so the launch sampling is never
// held up by it.
func (o *Observer) attach(id libcuda.FileID, info Library) {
	o.mu.Lock()
	if a, ok := o.libs[id]; ok {
		a.unmapped = 0
		a.info.Configured = a.info.Configured || info.Configured
		o.mu.Unlock()
		return
	}
	o.mu.Unlock()
	lib, err := o.probes.Attach(info.OpenPath)
	if err != nil {
		o.log.Warn("attach to libcuda", "path", info.Path, "err", err)
		return
	}
	info.Missing = lib.Missing
	info.Since = time.Now()
	o.mu.Lock()
	if _, ok := o.libs[id]; ok { // attached meanwhile
		o.mu.Unlock()
		lib.Detach()
		return
	}
	o.libs[id] = &attached{lib: lib, info: info}
	o.mu.Unlock()
	if o.launch.always {
		if err := o.probes.AttachLaunch(lib); err != nil {
			o.log.Warn("attach launch probes", "path", info.Path, "err", err)
		}
	}
	o.log.Info("attached to libcuda", "path", info.Path, "file", id, "missing", len(lib.Missing))
}

// scan finds libcuda files mapped by processes, attaches to new ones, and
// detaches from scanned ones no process has mapped for two scans.
func (o *Observer) scan() {
	o.attachConfigured()
	found, err := o.scanner.Scan()
	if err != nil {
		o.log.Warn("scan processes for libcuda", "err", err)
		return
	}
	for id, m := range found {
		o.attach(id, Library{Path: m.Path, OpenPath: m.OpenPath, File: id, PID: m.PID})
	}
	var gone []*attached
	o.mu.Lock()
	for id, a := range o.libs {
		if _, ok := found[id]; ok || a.info.Configured {
			continue
		}
		if a.unmapped++; a.unmapped >= 2 {
			gone = append(gone, a)
			delete(o.libs, id)
		}
	}
	o.mu.Unlock()
	for _, a := range gone {
		a.lib.Detach()
		o.log.Info("detached from libcuda no process maps", "path", a.info.Path, "file", a.info.File)
	}
	if o.exactOn {
		o.countExactly(o.scanner.Users())
	}
}

// collect reaps processes that died unseen and clears dead processes' entries.
func (o *Observer) collect() {
	o.reapDead()
	if _, err := o.probes.CollectGarbage(); err != nil {
		o.log.Warn("collect eBPF garbage", "err", err)
	}
}

// reapDead gives back what processes held that are gone without their exit
// having been seen (they died while the agent was down).
func (o *Observer) reapDead() {
	tgids, err := o.probes.Processes()
	if err != nil {
		o.log.Warn("list observed processes", "err", err)
		return
	}
	for _, tgid := range tgids {
		if _, err := os.Stat(filepath.Join(o.cfg.ProcRoot, strconv.FormatUint(uint64(tgid), 10))); !errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err := o.probes.Reap(tgid); err != nil {
			o.log.Warn("reap dead process", "pid", tgid, "err", err)
		}
	}
}

// initPIDNamespace is the inode of the host's (initial) pid namespace.
const initPIDNamespace = "pid:[4026531836]"

// hostPIDs says whether procRoot numbers processes as the host does: its
// "self" is a process of the initial pid namespace.
func hostPIDs(procRoot string) bool {
	ns, err := os.Readlink(filepath.Join(procRoot, "self", "ns", "pid"))
	return err == nil && ns == initPIDNamespace
}
