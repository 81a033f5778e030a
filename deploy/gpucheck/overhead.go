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

// launchOverhead times cuda-alloc's launch loop (launches of an empty
// kernel, a sync every 100) without and with the interposer, alternating.
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
	var ns [2][]float64
	for i := 0; i < launchRounds && ctx.Err() == nil; i++ {
		for j, p := range []*steered{base, with} {
			got := p.do(fmt.Sprintf("launchfor %d", launchMs))
			n, err := strconv.ParseFloat(strings.TrimPrefix(got, "ok "), 64)
			if err != nil || n == 0 {
				r.Fail("launch cost", "launchfor: %s", got)
				return
			}
			ns[j] = append(ns[j], launchMs*1e6/n)
		}
	}
	b, w := median(ns[0]), median(ns[1])
	r.Bench("launch_ns_without_interposer", b, "ns")
	r.Bench("launch_ns_with_interposer", w, "ns")
	r.Bench("launch_overhead_ns", w-b, "ns")
	r.Pass("launch cost", "%.0f ns per launch without the interposer, %.0f with: %+.0f ns (median of %d alternating rounds; budget 50 ns)",
		b, w, w-b, len(ns[0]))
}

// trainingOverhead trains alone three times: plain, under the interposer,
// and plain with the agent's probes attached (default settings).
func (e *env) trainingOverhead(ctx context.Context, r *Result) {
	secs := 12.0
	if e.o.Simulate {
		secs = 4
	}
	run := func(env []string) (float64, error) {
		t, err := e.startTrainer(ctx, env, nil, 64, 20000, secs)
		if err != nil {
			return 0, err
		}
		return t.finalRate(time.Duration(secs)*time.Second + 2*time.Minute)
	}
	plain, err := run(e.baseEnv())
	if err != nil {
		r.Fail("training throughput", "plain: %v", err)
		return
	}
	with, err := run(e.preloaded(e.newDir("overhead")))
	if err != nil {
		r.Fail("training throughput", "under the interposer: %v", err)
		return
	}
	a, err := e.startAgent(ctx, e.newDir("control"), "GPUWARDEN_ENFORCEMENT_ENABLED=false")
	if err != nil {
		r.Fail("training throughput", "agent: %v", err)
		return
	}
	probed, err := run(e.baseEnv())
	a.stop()
	if err != nil {
		r.Fail("training throughput", "with the agent's probes: %v", err)
		return
	}
	r.Bench("training_images_per_sec_plain", plain, "images/s")
	r.Bench("training_images_per_sec_interposer", with, "images/s")
	r.Bench("training_images_per_sec_probes", probed, "images/s")
	r.Bench("training_interposer_ratio", with/plain, "ratio")
	r.Bench("training_probes_ratio", probed/plain, "ratio")
	what := "ResNet-50, batch 64"
	if e.o.Simulate {
		what = "simgpu's workload, 20 µs kernels"
	}
	r.Pass("training throughput", "%s, alone, %.0f s each: %.1f images/s plain, %.1f under the interposer (%.3f), %.1f with the probes (%.3f)",
		what, secs, plain, with, with/plain, probed, probed/plain)
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}
