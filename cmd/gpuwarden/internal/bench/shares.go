package bench

import (
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/gpuwarden/gpuwarden/cmd/gpuwarden/internal/simmachine"
	"github.com/gpuwarden/gpuwarden/enforcer/policy"
	"github.com/gpuwarden/gpuwarden/enforcer/scheduler"
	"github.com/gpuwarden/gpuwarden/enforcer/scheduler/simrun"
)

func init() { suites["shares"] = suite{order: 35, run: benchShares} }

// sharesShape is one workload both containers run: its arguments past
// --seconds, and how many times longer than the others it runs.
type sharesShape struct {
	name   string
	args   []string
	longer float64
}

// sharesPolicy is how the two containers are held: settings from their
// environment, and the ratio of b's rate to a's they are held to.
type sharesPolicy struct {
	name       string
	gpu        scheduler.GPUSettings
	aEnv, bEnv []string
	target     float64
}

// benchShares holds two containers to weights 1:2 and to fixed 30%/70% on
// simgpu's H200 model (NVML per-process utilization as NVIDIA's sample
// stream, 1/6 s and 1 s periods; the engine time-sliced between contexts),
// for every workload shape: kernels of 20 us to 20 ms, training steps at
// batch 16-128, a CUDA graph, a sync after every launch. Each row runs
// three times (GPUWARDEN_BENCH_RUNS); the budget is a mean within 2% of
// target, every run within 5%, and the pair's rate at least 0.95 of the same
// pair ungated. Beside each shape, one container alone, ungated, against the
// pair: the most slices can reach.
func benchShares(o options, stdout io.Writer) error {
	bin, err := simmachine.BinDir()
	if err != nil {
		return err
	}
	secs := max(o.seconds, 10)
	runs := 3
	if v := os.Getenv("GPUWARDEN_BENCH_RUNS"); v != "" {
		if runs, err = strconv.Atoi(v); err != nil || runs < 1 {
			return fmt.Errorf("GPUWARDEN_BENCH_RUNS=%s: want a count", v)
		}
	}
	k := func(ns int, more ...string) []string { return stepArgs(8, ns, more...) }
	// A training step: 64 kernels of uneven lengths (mean 6.25 us an image,
	// so a step grows with its batch), 20 us of host work before each
	// launch, one sync a step.
	train := func(batch int) sharesShape {
		return sharesShape{name: "train_b" + strconv.Itoa(batch), args: []string{"--kernels", "64", "--uneven", "--host-ns", "20000",
			"--kernel-ns", strconv.Itoa(batch * 6250), "--batch", strconv.Itoa(batch)}}
	}
	shapes := []sharesShape{
		{name: "k20us", args: k(20000)}, {name: "k200us", args: k(200000)}, {name: "k2ms", args: k(2000000)},
		{name: "k20ms", args: stepArgs(1, 20000000), longer: 2},
		train(16), train(32), train(64), train(128),
		{name: "graph_k200us", args: k(200000, "--graph")}, {name: "sync_k200us", args: k(200000, "--sync-every-launch")},
	}
	if f := os.Getenv("GPUWARDEN_BENCH_ROWS"); f != "" { // a subset of shapes, for development
		var keep []sharesShape
		for _, s := range shapes {
			if containsWord(f, s.name) {
				keep = append(keep, s)
			}
		}
		shapes = keep
	}
	policies := []sharesPolicy{
		{name: "weighted_1to2", aEnv: []string{"GPUWARDEN_COMPUTE_WEIGHT=1"}, bEnv: []string{"GPUWARDEN_COMPUTE_WEIGHT=2"}, target: 2},
		{name: "fixed_30_70", gpu: scheduler.GPUSettings{Policy: policy.Fixed, PolicySet: true, MaxInst: 10},
			aEnv: []string{"GPUWARDEN_COMPUTE_WEIGHT=3"}, bEnv: []string{"GPUWARDEN_COMPUTE_WEIGHT=7"}, target: 7.0 / 3},
	}
	dir, err := os.MkdirTemp("", "gpuwarden-shares-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	rows, within := 0, 0
	for _, sh := range shapes {
		m := simrun.Machine{Bin: bin, Dir: dir, Devices: 1, Memory: "16Gi", Model: "h200"}
		s := secs * max(sh.longer, 1)
		free, err := pairRun(m, scheduler.GPUSettings{}, sh, nil, nil, true, s)
		if err != nil {
			return fmt.Errorf("%s ungated: %w", sh.name, err)
		}
		// One container alone, ungated: slices give the device to one
		// container at a time, so the device idles in its host time
		// (between a sync's return and its next launch) as it does alone,
		// where two ungated containers fill each other's. This is the most
		// the pair's throughput can reach under slices.
		alone, err := pairRun(m, scheduler.GPUSettings{}, sh, nil, nil, true, s, "a")
		if err != nil {
			return fmt.Errorf("%s alone: %w", sh.name, err)
		}
		fmt.Fprintf(stdout, "BENCH shares_h200_%s_alone_vs_ungated_pair %.3f ratio\n", sh.name, alone.rate/free.rate)
		var handed scheduler.SliceCounts // the shape's gated runs, summed
		for _, sampleMs := range []int{167, 1000} {
			m.SampleMs = sampleMs
			for _, p := range policies {
				name := fmt.Sprintf("shares_h200_sample%dms_%s_%s", sampleMs, p.name, sh.name)
				var ratios, rates []float64
				for i := 0; i < runs; i++ {
					r, err := pairRun(m, p.gpu, sh, p.aEnv, p.bEnv, false, s)
					if err != nil {
						return fmt.Errorf("%s: %w", name, err)
					}
					ratios, rates = append(ratios, r.ratio), append(rates, r.rate)
					handed.Handovers += r.slices.Handovers
					handed.GapSeconds += r.slices.GapSeconds
					handed.DrainSeconds += r.slices.DrainSeconds
				}
				mean, lo, hi := stats(ratios)
				rate, _, _ := stats(rates)
				runsWithin := 0
				for _, x := range ratios {
					runsWithin += b2i(math.Abs(x/p.target-1) <= 0.05)
				}
				ok := math.Abs(mean/p.target-1) <= 0.02 && runsWithin == runs && rate >= 0.95*free.rate
				rows++
				within += b2i(ok)
				fmt.Fprintf(stdout, "BENCH %s_ratio_mean %.3f ratio\nBENCH %s_ratio_min %.3f ratio\nBENCH %s_ratio_max %.3f ratio\n",
					name, mean, name, lo, name, hi)
				fmt.Fprintf(stdout, "BENCH %s_target_ratio %.3f ratio\nBENCH %s_throughput_vs_ungated %.3f ratio\nBENCH %s_within_budget %d bool\n",
					name, p.target, name, rate/free.rate, name, b2i(ok))
			}
		}
		// What a hand-over costs: the previous owner's drain, then the
		// device's wait for the next owner's gate to open (nobody's time).
		if handed.Handovers > 0 {
			n := float64(handed.Handovers)
			fmt.Fprintf(stdout, "BENCH shares_h200_%s_drain_per_handover_us %.0f us\nBENCH shares_h200_%s_gap_per_handover_us %.0f us\n",
				sh.name, handed.DrainSeconds/n*1e6, sh.name, handed.GapSeconds/n*1e6)
		}
	}
	fmt.Fprintf(stdout, "BENCH shares_rows %d rows\nBENCH shares_rows_within_budget %d rows\n", rows, within)
	return nil
}

// pairResult is one run of two containers (of a alone where pairRun's only
// says so), over the middle 60% of the run (from the workloads' progress
// lines): b's images/s over a's (gated pairs only), and both together's
// images/s. The window leaves out the start,
// where a new container's grants grow from a few launches a slice until its
// cost per launch is measured, which a run of seconds would otherwise weigh
// as much as hours of training do not.
type pairResult struct {
	ratio, rate float64
	slices      scheduler.SliceCounts // the GPU's hand-overs over the whole run
}

func pairRun(m simrun.Machine, gs scheduler.GPUSettings, sh sharesShape, aEnv, bEnv []string, ungated bool, secs float64, only ...string) (pairResult, error) {
	run, err := simrun.Start(m, scheduler.Config{}, gs)
	if err != nil {
		return pairResult{}, err
	}
	defer run.Close()
	args := append([]string{"--seconds", strconv.FormatFloat(secs, 'f', -1, 64), "--progress"}, sh.args...)
	claims := scheduler.Settings{FromClaims: true}
	names := []string{"a", "b"}
	if len(only) > 0 {
		names = only
	}
	for _, c := range []simrun.Container{{Name: "a", Args: args, Env: aEnv, Settings: claims, Ungated: ungated},
		{Name: "b", Args: args, Env: bEnv, Settings: claims, Ungated: ungated}} {
		if !slices.Contains(names, c.Name) {
			continue
		}
		if err := run.Spawn(c); err != nil {
			return pairResult{}, err
		}
	}
	if err := run.Admit(); err != nil {
		return pairResult{}, err
	}
	time.Sleep(time.Duration(secs * 0.2 * float64(time.Second)))
	t0 := time.Now()
	time.Sleep(time.Duration(secs * 0.6 * float64(time.Second)))
	t1 := time.Now()
	var res pairResult
	rates := map[string]float64{}
	for _, n := range names {
		if _, err := run.Wait(n, time.Duration(secs+30)*time.Second); err != nil {
			return pairResult{}, err
		}
		r, err := run.Rate(n, t0, t1)
		if err != nil {
			return pairResult{}, err
		}
		rates[n] = r
		res.rate += r
	}
	if !ungated {
		res.ratio = rates["b"] / rates["a"]
	}
	res.slices = run.Sched.GPU(run.GPU0()).Slices
	return res, nil
}

// stats returns the mean, least and greatest of xs.
func stats(xs []float64) (mean, lo, hi float64) {
	lo, hi = math.Inf(1), math.Inf(-1)
	for _, x := range xs {
		mean += x / float64(len(xs))
		lo, hi = min(lo, x), max(hi, x)
	}
	return mean, lo, hi
}
