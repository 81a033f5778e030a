package collector

import (
	"context"
	"maps"
	"reflect"
	"slices"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/agentapi"

	"github.com/gpuwarden/gpuwarden/bpf/observe"
	"github.com/gpuwarden/gpuwarden/enforcer/membership"
	"github.com/gpuwarden/gpuwarden/enforcer/nvmldev"
)

// rejoinEvery bounds how long a view is served again for inputs that read
// the same: what no source below shows (a cgroup removed, a process moved,
// a claim's periodic recheck, a pod's uid learnt) is seen within it.
const rejoinEvery = 15 * time.Second

// inputs is what one view is made of, as read from the sources before they
// are joined. At a thousand containers, joining costs as much again as
// reading: a view whose inputs read as the last one's did, while that one
// showed nothing moving, is that view again (Collector.build).
type inputs struct {
	time      time.Time
	devs      []nvmldev.Device
	nvmlErr   error
	labels    LabelFunc
	answer    uint64 // identifies the kubelet's answer labels come from
	labelsErr error
	dirsErr   error
	ledgers   []readLedger // in directory order
	ebpf      observe.Snapshot
	ebpfErr   error
	sched     map[membership.GPUKey]membership.Scheduled
}

// readLedger is one control directory's ledger as read (nil: err says why
// not). Its usage is the reader's snapshot, the same pointer while the
// ledger reads the same (controlblock's snapshot cache).
type readLedger struct {
	dir string
	l   *ledger
	err error
}

// read reads every source once.
func (c *Collector) read(ctx context.Context) *inputs {
	in := &inputs{time: time.Now()}
	if c.src.NVML != nil {
		in.devs, in.nvmlErr = c.src.NVML()
	}
	if c.src.Labels != nil {
		in.labels, in.answer, in.labelsErr = c.src.Labels(ctx)
		if in.labelsErr == nil {
			c.labels.Store(&in.labels)
		}
	}
	c.readLedgers(in)
	if c.src.EBPF != nil {
		in.ebpf, in.ebpfErr = c.src.EBPF()
	}
	if c.src.Scheduling != nil {
		in.sched = c.src.Scheduling()
	}
	return in
}

// readLedgers reads every <controlDir>/<key>/usage (and its limits), and
// closes those of directories gone.
func (c *Collector) readLedgers(in *inputs) {
	if c.src.ControlDir == "" {
		return
	}
	dirs, _, err := c.dirs.Names()
	if in.dirsErr = err; err != nil {
		return
	}
	seen := make(map[string]bool, len(dirs))
	for _, dir := range dirs {
		seen[dir] = true
		l, err := c.ledgers.read(c.src.ControlDir, dir)
		if err != nil {
			c.log.Debug("skipping ledger", "dir", dir, "err", err)
		}
		in.ledgers = append(in.ledgers, readLedger{dir: dir, l: l, err: err})
	}
	c.ledgers.keep(seen)
}

// same says whether in reads as last did: then joining it would make the
// same view, but for what moves with time alone (rates, utilization, the
// judge's clocks), which quiet rules out.
func (in *inputs) same(last *inputs) bool {
	return errText(in.nvmlErr) == errText(last.nvmlErr) && reflect.DeepEqual(in.devs, last.devs) &&
		errText(in.labelsErr) == errText(last.labelsErr) && in.answer == last.answer &&
		errText(in.dirsErr) == errText(last.dirsErr) && slices.EqualFunc(in.ledgers, last.ledgers, sameLedger) &&
		errText(in.ebpfErr) == errText(last.ebpfErr) && sameProbes(in.ebpf, last.ebpf) &&
		maps.Equal(in.sched, last.sched)
}

func sameLedger(a, b readLedger) bool {
	if a.dir != b.dir || errText(a.err) != errText(b.err) || (a.l == nil) != (b.l == nil) {
		return false
	}
	if a.l == nil {
		return true
	}
	x, y := a.l.limits, b.l.limits
	return a.l.usage == b.l.usage && (x == nil) == (y == nil) && (x == nil || *x == *y)
}

// sameProbes compares what the probes counted. Launch estimates are left
// out: they are extrapolated by the time the probes were attached and drift
// with it while nothing launches (quiet wants no launch seen in the last
// window).
func sameProbes(a, b observe.Snapshot) bool {
	return a.Probes == b.Probes && reflect.DeepEqual(a.Libraries, b.Libraries) &&
		slices.EqualFunc(a.Usage, b.Usage, func(x, y observe.Usage) bool {
			x.LaunchesEstimated, y.LaunchesEstimated = 0, 0
			return x == y
		})
}

// quiet says whether nothing in a view moves with time alone: no source
// failed, no GPU time used, no launch seen in the probes' last window, no
// breach reported or being timed, no ledger refused.
func (c *Collector) quietView(in *inputs, v *View) bool {
	if in.nvmlErr != nil || in.labelsErr != nil || in.dirsErr != nil || in.ebpfErr != nil || len(v.BadLedgers) > 0 || c.judge.timing() {
		return false
	}
	for _, d := range in.devs {
		if d.Utilization > 0 || slices.ContainsFunc(d.Processes, func(p nvmldev.Process) bool { return p.Utilization > 0 }) {
			return false
		}
	}
	if slices.ContainsFunc(in.ebpf.Usage, func(u observe.Usage) bool { return u.LaunchRate > 0 }) {
		return false
	}
	return !slices.ContainsFunc(v.Containers, func(e agentapi.ContainerDevice) bool {
		return e.ComputeShare > 0 || e.Unenforced || len(e.Breaches) > 0
	})
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
