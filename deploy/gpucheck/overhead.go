package gpucheck

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
)

// launchRounds alternate the two processes' launch loops, so drift of the
// machine (clocks, other load) falls on both alike.
const (
	launchRounds = 7
	launchMs     = 300
)

// checkOverhead is part 5: the interposer's cost on cuLaunchKernel of an
// empty kernel, and training throughput with and without the interposer
// and the agent's probes.
func checkOverhead(ctx context.Context, e *env, r *Result) {
	e.launchOverhead(ctx, r)
	e.trainingOverhead(ctx, r)
}

// launchOverhead times cuda-alloc's launches of an empty kernel without
// and with the interposer, alternating: into a capturing stream (the
// launch call's own cost, which the budget is about) and for real with a
// sync every 100 (what a launch-bound program sees).
func (e *env) launchOverhead(ctx context.Context, r *Result) {
	base, err := e.startSteered(ctx, e.baseEnv(), nil)
	if err != nil {
		r.Fail("launch cost", "%v", err)
		return
	}
	defer base.quit()
	with, err := e.startSteered(ctx, e.preloaded(e.newDir("overhead")), nil)
	if err != nil {
		r.Fail("launch cost", "%v", err)
		return
	}
	defer with.quit()
	for _, p := range []*steered{base, with} {
		if got := p.do("ctx 0"); got != "ok" {
			r.Fail("launch cost", "ctx 0: %s", got)
			return
		}
		p.do("launchfor 100") // warm
	}
	// ns per launch from an answer: launchcapture prints it, launchfor the count in launchMs.
	perLaunch := func(cmd, got string) (float64, bool) {
		v, err := strconv.ParseFloat(strings.TrimPrefix(got, "ok "), 64)
		if err != nil || v <= 0 || !strings.HasPrefix(got, "ok ") {
			return 0, false
		}
		if strings.HasPrefix(cmd, "launchfor") {
			return launchMs * 1e6 / v, true
		}
		return v, true
	}
	for _, m := range []struct{ name, cmd, what string }{
		{"launch_capture_ns", "launchcapture 100000", "into a capturing stream (the call's own cost)"},
		{"launch_sync_ns", fmt.Sprintf("launchfor %d", launchMs), "executed, a sync every 100"},
	} {
		var ns [2][]float64
		for i := 0; i < launchRounds && ctx.Err() == nil; i++ {
			for j, p := range []*steered{base, with} {
				got := p.do(m.cmd)
				v, ok := perLaunch(m.cmd, got)
				if !ok {
					r.Fail("launch cost "+m.what, "%s: %s", m.cmd, got)
					return
				}
				ns[j] = append(ns[j], v)
			}
		}
		b, w := median(ns[0]), median(ns[1])
		r.Bench(m.name+"_without_interposer", b, "ns")
		r.Bench(m.name+"_with_interposer", w, "ns")
		r.Bench(m.name+"_overhead", w-b, "ns")
		r.Pass("launch cost "+m.what, "%.0f ns per launch without the interposer, %.0f with: %+.0f ns (median of %d alternating rounds)",
			b, w, w-b, len(ns[0]))
	}
	r.Note("The budget is 50 ns added per launch: the capturing-stream figure measures it.")
}

// trainingRounds alternate the three set-ups, so drift falls on all alike.
const trainingRounds = 2

// trainingOverhead trains alone: plain, under the interposer, and plain
// with the agent's probes attached (default settings), in turns.
func (e *env) trainingOverhead(ctx context.Context, r *Result) {
	secs := 10.0
	if e.o.Simulate {
		secs = 4
	}
	run := func(env []string) (float64, error) {
		t, err := e.startTrainer(ctx, env, nil, 64, 20000, secs)
		if err != nil {
			return 0, err
		}
		rate, err := t.finalRate(time.Duration(secs)*time.Second + 2*time.Minute)
		if ctx.Err() != nil {
			err = fmt.Errorf("stopped: the part's time ran out")
		}
		return rate, err
	}
	setups := []struct {
		name  string
		env   []string
		agent bool
	}{
		{"plain", e.baseEnv(), false},
		{"interposer", e.preloaded(e.newDir("overhead")), false},
		{"probes", e.baseEnv(), true},
	}
	rates := map[string][]float64{}
	for i := 0; i < trainingRounds && ctx.Err() == nil; i++ {
		for _, s := range setups {
			var a *agent
			if s.agent {
				var err error
				if a, err = e.startAgent(ctx, e.newDir("control"), "GPUWARDEN_ENFORCEMENT_ENABLED=false"); err != nil {
					r.Fail("training throughput", "agent: %v", err)
					return
				}
			}
			v, err := run(s.env)
			if a != nil {
				a.stop()
			}
			if err != nil {
				r.Fail("training throughput", "%s: %v", s.name, err)
				return
			}
			rates[s.name] = append(rates[s.name], v)
		}
	}
	plain, with, probed := mean(rates["plain"]), mean(rates["interposer"]), mean(rates["probes"])
	r.Bench("training_images_per_sec_plain", plain, "images/s")
	r.Bench("training_images_per_sec_interposer", with, "images/s")
	r.Bench("training_images_per_sec_probes", probed, "images/s")
	r.Bench("training_interposer_ratio", with/plain, "ratio")
	r.Bench("training_probes_ratio", probed/plain, "ratio")
	what := "ResNet-50, batch 64"
	if e.o.Simulate {
		what = "simgpu's workload, 20 µs kernels"
	}
	r.Pass("training throughput", "%s, alone, %.0f s a run, mean of %d alternating rounds: %.1f images/s plain, %.1f under the interposer (%.3f), %.1f with the probes (%.3f); each run: %v",
		what, secs, len(rates["plain"]), plain, with, with/plain, probed, probed/plain, rates)
}

func mean(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := 0.0
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}
