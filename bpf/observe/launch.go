package observe

import (
	"math/rand/v2"
	"sync"
	"time"

	"github.com/gpuwarden/gpuwarden/bpf/probes"
)

// launchState keeps the launch counting's bookkeeping: how long the sampling
// probes have been attached, the rate each (cgroup, device) launched at in
// the last window, and the exact counts of the processes no ledger counts.
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

	exactBase  map[probes.Key]uint64 // exact counts when this observer started
	exactLast  map[probes.Key]uint64 // exact counts at the end of the last period
	exactAt    time.Time             // the end of the last period
	exactRates map[probes.Key]float64
}

func (l *launchState) init(cfg Config, now time.Time) {
	l.always = cfg.LaunchWindow > 0 && cfg.LaunchWindow >= cfg.LaunchPeriod
	l.off = cfg.LaunchWindow <= 0
	l.start = now
	l.exactAt = now
	l.rates = map[probes.Key]float64{}
	l.exactRates = map[probes.Key]float64{}
}

// sampleLaunches attaches the sampling launch probes for LaunchWindow at a
// random moment of every LaunchPeriod (or for good, when the window is the
// period) and turns the launches counted in each window into rates; at the
// end of each period it turns the exact counts into rates over the period.
func (o *Observer) sampleLaunches() {
	defer o.wg.Done()
	if o.launch.off {
		return
	}
	base, err := o.probes.Launches()
	if err != nil {
		o.log.Warn("read launches", "err", err)
	}
	exact, err := o.probes.ExactLaunchCounts()
	if err != nil {
		o.log.Warn("read exact launches", "err", err)
	}
	o.launch.mu.Lock()
	o.launch.baseline = base
	o.launch.exactBase, o.launch.exactLast = exact, exact
	o.launch.mu.Unlock()
	if o.launch.always {
		o.setLaunchProbes(true)
	}
	period, window := o.cfg.LaunchPeriod, o.cfg.LaunchWindow
	for {
		cycle := time.Now()
		if !o.launch.always {
			// A window at a random moment of the period, so a process
			// cannot time its launches around it.
			if !o.sleepUntil(cycle.Add(rand.N(period - window + 1))) {
				return
			}
			if !o.window(window) {
				return
			}
		}
		if !o.sleepUntil(cycle.Add(period)) {
			return
		}
		if o.launch.always {
			o.recordAlways()
		}
		o.recordExact()
	}
}

// sleepUntil waits for t; false when the observer stops first.
func (o *Observer) sleepUntil(t time.Time) bool {
	select {
	case <-o.stop:
		return false
	case <-time.After(time.Until(t)):
		return true
	}
}

// window attaches the sampling probes for d and records what they
// counted; false when the observer stops meanwhile.
func (o *Observer) window(d time.Duration) bool {
	before, err := o.probes.Launches()
	if err != nil {
		o.log.Warn("read launches", "err", err)
		return true
	}
	// The window runs from the middle of attaching (about a millisecond)
	// to the start of detaching: the kernel takes the breakpoints out
	// first and only then waits for handlers in flight.
	t0 := time.Now()
	o.setLaunchProbes(true)
	t1 := time.Now()
	stopped := !o.sleepUntil(t1.Add(d))
	from, to := t0.Add(t1.Sub(t0)/2), time.Now()
	o.setLaunchProbes(false)
	if stopped {
		return false
	}
	after, err := o.probes.Launches()
	if err != nil {
		o.log.Warn("read launches", "err", err)
		return true
	}
	o.launch.record(before, after, from, to)
	return true
}

// recordAlways records the period just ended, the probes attached for good.
func (o *Observer) recordAlways() {
	now, err := o.probes.Launches()
	if err != nil {
		o.log.Warn("read launches", "err", err)
		return
	}
	from := o.launch.lastEndOr(o.launch.start)
	o.launch.record(o.launch.previous(now), now, from, time.Now())
}

// recordExact turns the exact counts of the period just ended into rates.
func (o *Observer) recordExact() {
	now, err := o.probes.ExactLaunchCounts()
	if err != nil {
		o.log.Warn("read exact launches", "err", err)
		return
	}
	t := time.Now()
	l := &o.launch
	l.mu.Lock()
	defer l.mu.Unlock()
	l.exactRates = rates(l.exactLast, now, t.Sub(l.exactAt))
	l.exactLast, l.exactAt = now, t
}

// setLaunchProbes attaches or detaches the sampling launch probes on every
// library, all at once.
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
	r := rates(before, after, d)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.rates = r
	l.observed += d
	l.windows++
	l.lastEnd = to
	l.lastCounts = after
}

// rates is each key's launches from before to after, per second over d.
func rates(before, after map[probes.Key]uint64, d time.Duration) map[probes.Key]float64 {
	out := make(map[probes.Key]float64, len(after))
	if d <= 0 {
		return out
	}
	for k, n := range after {
		if delta := n - before[k]; delta > 0 && n >= before[k] {
			out[k] = float64(delta) / d.Seconds()
		}
	}
	return out
}
