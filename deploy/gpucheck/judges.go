package gpucheck

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/agentapi"
)

// judged checks that the agent holds none of a row's containers in breach:
// both train honestly under the interposer, so a breach is the judge wrong
// about what the driver shows (a context larger than nvml.contextMemory
// read as memory beyond the ledger, say), which onBreach would act on.
func judged(a *agent, name string, cgs []*cgroup, r *Result) {
	cs, errs, _, err := a.containers(cgs)
	if err != nil {
		r.Fail(name+" judged", "%v", err)
		return
	}
	var seen []string
	for i, c := range cs {
		if errs[i] != nil {
			seen = append(seen, fmt.Sprintf("container %c: %v", 'a'+i, errs[i]))
		} else if len(c.Breaches) > 0 {
			seen = append(seen, fmt.Sprintf("container %c in breach: %+v", 'a'+i, c.Breaches))
		}
	}
	if len(seen) > 0 {
		r.Fail(name+" judged", "%s", strings.Join(seen, "; "))
		return
	}
	r.Pass(name+" judged", "the agent holds neither container in breach")
}

// clockReading is the agent's scheduler at one instant: the device time its
// clock charged each of a row's containers, ever, and the GPU's slice
// hand-overs.
type clockReading struct {
	at                           time.Time // of the agent's view
	charged, launches, throttled [2]float64
	slices                       agentapi.SliceCounts
}

func readClock(a *agent, cgs []*cgroup) (clockReading, error) {
	var x clockReading
	cs, errs, at, err := a.containers(cgs)
	x.at = at
	if err = errors.Join(append(errs, err)...); err != nil {
		return x, err
	}
	for i, c := range cs {
		x.charged[i], x.launches[i], x.throttled[i] = c.ScheduledSeconds, c.Launches, c.ThrottledSeconds
	}
	var gpu agentapi.GPUInfo
	err = a.get("/api/v1/gpus/0", &gpu)
	x.slices = gpu.Slices
	return x, err
}

// nvmlSample is what NVML said at one of the agent's views: each of a
// row's containers' share of the GPU (a sample stream on NVIDIA's driver:
// each sample credits a whole period to one process) and the GPU's
// utilization.
type nvmlSample struct {
	at    time.Time
	share [2]float64
	util  float64
}

// nvmlSampler reads the agent's NVML figures every view (1 s), an
// independent judge of the device time each container took, coarse as
// NVML's samples are.
type nvmlSampler struct {
	mu      sync.Mutex
	samples []nvmlSample
	stop    func()
}

func sampleNVML(a *agent, cgs []*cgroup) *nvmlSampler {
	s := &nvmlSampler{}
	done, finished := make(chan struct{}), make(chan struct{})
	s.stop = sync.OnceFunc(func() { close(done); <-finished })
	go func() {
		defer close(finished)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			cs, errs, at, err := a.containers(cgs)
			var dr agentapi.DevicesResponse
			if err != nil || a.get("/api/v1/devices", &dr) != nil || len(dr.Devices) == 0 {
				continue
			}
			x := nvmlSample{at: at, util: dr.Devices[0].Utilization}
			for i, c := range cs {
				if errs[i] == nil { // a is gone while b runs alone
					x.share[i] = c.ComputeShare
				}
			}
			s.mu.Lock()
			if n := len(s.samples); n == 0 || s.samples[n-1].at.Before(at) { // one per view
				s.samples = append(s.samples, x)
			}
			s.mu.Unlock()
		}
	}()
	return s
}

// over is the mean of the views after from up to to.
func (s *nvmlSampler) over(from, to time.Time) (nvmlSample, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var m nvmlSample
	n := 0.0
	for _, x := range s.samples {
		if x.at.After(from) && !x.at.After(to) {
			m.share[0], m.share[1], m.util, n = m.share[0]+x.share[0], m.share[1]+x.share[1], m.util+x.util, n+1
		}
	}
	if n == 0 {
		return m, false
	}
	m.share[0], m.share[1], m.util = m.share[0]/n, m.share[1]/n, m.util/n
	return m, true
}

// clockWindow is what the agent's scheduler did over a window: b's charge
// over a's, the share of wall time it charged to either, and per hand-over
// how long the previous owner's work drained and the device then waited.
type clockWindow struct {
	ratio, charged, handoversPerSec, drainMs, gapMs float64
	capped                                          uint64
	// per container: launches per second of its charged time (its host's
	// pace in its slices), and the share of wall time its launches waited
	launchPace, throttled [2]float64
}

func clockField(cs []clockWindow, f func(clockWindow) float64) []float64 {
	out := make([]float64, len(cs))
	for i, c := range cs {
		out[i] = f(c)
	}
	return out
}

func cappedIn(cs []clockWindow) uint64 {
	var n uint64
	for _, c := range cs {
		n += c.capped
	}
	return n
}

func clockOver(x0, x1 clockReading) clockWindow {
	secs := math.Max(x1.at.Sub(x0.at).Seconds(), 1e-3)
	da, db := x1.charged[0]-x0.charged[0], x1.charged[1]-x0.charged[1]
	n := x1.slices.Handovers - x0.slices.Handovers
	per := func(s float64) float64 { return 1000 * s / math.Max(float64(n), 1) }
	w := clockWindow{ratio: db / math.Max(da, 1e-9), charged: (da + db) / secs, handoversPerSec: float64(n) / secs,
		drainMs: per(x1.slices.DrainSeconds - x0.slices.DrainSeconds), gapMs: per(x1.slices.GapSeconds - x0.slices.GapSeconds),
		capped: x1.slices.DrainsCapped - x0.slices.DrainsCapped}
	for i, d := range []float64{da, db} {
		w.launchPace[i] = (x1.launches[i] - x0.launches[i]) / math.Max(d, 1e-9)
		w.throttled[i] = (x1.throttled[i] - x0.throttled[i]) / secs
	}
	return w
}
