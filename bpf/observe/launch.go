package observe

import (
	"sync"
	"time"

	"github.com/gpuwarden/gpuwarden/bpf/probes"
)

// launchState keeps the launch sampling's bookkeeping: how long the launch
// probes have been attached, and the rate each (cgroup, device) launched at
// in the last window.
type launchState struct {
	mu         sync.Mutex
	always     bool // window == period: attached for good
	off        bool // window 0: never attached
	start      time.Time
	observed   time.Duration // total time attached
	windows    uint64
	lastEnd    time.Time
	baseline   map[probes.Key]uint64 // counts when this observer started
	lastCounts map[probes.Key]uint64 // counts at the end of the last window
	rates      map[probes.Key]float64
}

func (l *launchState) init(cfg Config, now time.Time) {
	l.always = cfg.LaunchWindow > 0 && cfg.LaunchWindow >= cfg.LaunchPeriod
	l.off = cfg.LaunchWindow <= 0
	l.start = now
	l.rates = map[probes.Key]float64{}
}

// sampleLaunches attaches the launch probes for LaunchWindow every
// LaunchPeriod (or for good, when the window is the period) and turns the
// launches counted in each window into rates.
func (o *Observer) sampleLaunches() {
	defer o.wg.Done()
	if o.launch.off {
		return
	}
	base, err := o.probes.Launches()
	if err != nil {
		o.log.Warn("read launches", "err", err)
	}
	o.launch.mu.Lock()
	o.launch.baseline = base
	o.launch.mu.Unlock()
	if o.launch.always {
		o.setLaunchProbes(true)
	}
	t := time.NewTicker(o.cfg.LaunchPeriod)
	defer t.Stop()
	for {
		select {
		case <-o.stop:
			return
		case <-t.C:
		}
		before, err := o.probes.Launches()
		if err != nil {
			o.log.Warn("read launches", "err", err)
			continue
		}
		var from, to time.Time
		if o.launch.always {
			from = o.launch.lastEndOr(o.launch.start)
			to = time.Now()
			before = o.launch.previous(before)
		} else {
			// The window runs from the middle of attaching (about a
			// millisecond) to the start of detaching: the kernel takes the
			// breakpoints out first and only then waits for handlers in flight.
			t0 := time.Now()
			o.setLaunchProbes(true)
			t1 := time.Now()
			select {
			case <-o.stop:
				o.setLaunchProbes(false)
				return
			case <-time.After(o.cfg.LaunchWindow):
			}
			from, to = t0.Add(t1.Sub(t0)/2), time.Now()
			o.setLaunchProbes(false)
		}
		after, err := o.probes.Launches()
		if err != nil {
			o.log.Warn("read launches", "err", err)
			continue
		}
		o.launch.record(before, after, from, to)
	}
}

// setLaunchProbes attaches or detaches the launch probes on every library,
// all at once.
func (o *Observer) setLaunchProbes(on bool) {
	o.mu.Lock()
	libs := make([]*attached, 0, len(o.libs))
	for _, a := range o.libs {
		libs = append(libs, a)
	}
	o.mu.Unlock()
	var wg sync.WaitGroup
	for _, a := range libs {
		wg.Go(func() {
			if !on {
				a.lib.DetachLaunch()
				return
			}
			if err := o.probes.AttachLaunch(a.lib); err != nil {
				o.log.Warn("attach launch probes", "path", a.info.Path, "err", err)
			}
		})
	}
	wg.Wait()
}

// lastEndOr is the end of the last window, or def before the first.
func (l *launchState) lastEndOr(def time.Time) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lastEnd.IsZero() {
		return def
	}
	return l.lastEnd
}

// previous returns the counts at the end of the last window (always-attached
// mode: windows follow each other), or the baseline before the first.
func (l *launchState) previous(now map[probes.Key]uint64) map[probes.Key]uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lastCounts != nil {
		return l.lastCounts
	}
	if l.baseline != nil {
		return l.baseline
	}
	return now
}

// record turns a window's counts into rates.
func (l *launchState) record(before, after map[probes.Key]uint64, from, to time.Time) {
	d := to.Sub(from)
	if d <= 0 {
		return
	}
	rates := make(map[probes.Key]float64, len(after))
	for k, n := range after {
		if delta := n - before[k]; delta > 0 && n >= before[k] {
			rates[k] = float64(delta) / d.Seconds()
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.rates = rates
	l.observed += d
	l.windows++
	l.lastEnd = to
	l.lastCounts = after
}
