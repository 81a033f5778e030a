package gpucheck

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gpuwarden/gpuwarden/bpf/probes"
)

// launchRounds alternate the launching processes' loops, so drift of the
// machine (clocks, other load) falls on all alike.
const (
	launchRounds = 7
	launchMs     = 300
)

// checkOverhead is part 5: the interposer's cost on cuLaunchKernel of an
// empty kernel, beside three bare wrappers that tell what costs, and
// training throughput with and without the interposer and the agent's
// probes, with what each eBPF program ran meanwhile.
func checkOverhead(ctx context.Context, e *env, r *Result) {
	e.launchOverhead(ctx, r)
	e.trainingOverhead(ctx, r)
}

// launcher is one way of running cuda-alloc's launch loop.
type launcher struct {
	name string // in the BENCH names
	what string // in the report
	env  []string
	p    *steered
	ns   []float64
}

// launchOverhead times cuda-alloc's launches of an empty kernel plain,
// under the interposer and under the three launch shims (lib/launch-shim-*:
// cuLaunchKernel wrapped as the interposer wraps it, then nothing, a plain
// add or a locked add after the driver returns), in alternating rounds,
// every process pinned to the same core: into a capturing stream (the
// launch call's own cost, which the budget is about) and for real with a
// sync every 100 (what a launch-bound program sees).
func (e *env) launchOverhead(ctx context.Context, r *Result) {
	shim := func(kind string) []string {
		return append(e.baseEnv(), "LD_PRELOAD="+e.bundlePath("lib", "launch-shim-"+kind+".so"))
	}
	ls := []*launcher{
		{name: "without_interposer", what: "plain", env: e.baseEnv()},
		{name: "with_interposer", what: "interposer", env: e.preloaded(e.newDir("overhead"))},
		{name: "shim_tail", what: "shim: tail call", env: shim("tail")},
		{name: "shim_add", what: "shim: plain add", env: shim("add")},
		{name: "shim_lock", what: "shim: locked add", env: shim("lock")},
	}
	core, why := e.launchCore()
	for _, l := range ls {
		p, err := e.startSteered(ctx, l.env, nil)
		if err != nil {
			r.Fail("launch cost", "%s: %v", l.what, err)
			return
		}
		defer p.quit()
		l.p = p
		pid := p.p.cmd.Process.Pid
		// A preload the loader could not use is only a warning on stderr.
		if err := mapsPreload(pid, l.env); err != nil {
			r.Fail("launch cost", "%s: %v", l.what, err)
			return
		}
		// Pinned before the context is made and again after, for the
		// driver's threads made meanwhile; later ones inherit the mask.
		err = pinProcess(pid, core)
		if got := p.do("ctx 0"); got != "ok" {
			r.Fail("launch cost", "%s: ctx 0: %s", l.what, got)
			return
		}
		if err == nil {
			err = pinProcess(pid, core)
		}
		if err != nil {
			r.Fail("launch cost", "%s: pin to core %d: %v", l.what, core, err)
			return
		}
		p.do("launchfor 100") // warm
	}
	r.Pass("launching core", "core %d (%s): every launching process and its threads pinned there (sched_setaffinity)", core, why)
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
		for _, l := range ls {
			l.ns = nil
		}
		for i := 0; i < launchRounds && ctx.Err() == nil; i++ {
			// Each round starts with the next process, so none always runs first.
			for j := range ls {
				l := ls[(i+j)%len(ls)]
				got := l.p.do(m.cmd)
				v, ok := perLaunch(m.cmd, got)
				if !ok {
					r.Fail("launch cost "+m.what, "%s: %s: %s", l.what, m.cmd, got)
					return
				}
				l.ns = append(l.ns, v)
			}
		}
		if len(ls[0].ns) < launchRounds {
			r.Fail("launch cost "+m.what, "%d of %d rounds in the part's time", len(ls[0].ns), launchRounds)
			return
		}
		var rows []string
		for _, l := range ls {
			r.Bench(m.name+"_"+l.name, median(l.ns), "ns")
			r.Bench(m.name+"_"+l.name+"_spread", spread(l.ns), "ns")
			rows = append(rows, fmt.Sprintf("%s %.0f ns (spread %.0f)", l.what, median(l.ns), spread(l.ns)))
		}
		plain, with := median(ls[0].ns), median(ls[1].ns)
		tail, add, lock := median(ls[2].ns), median(ls[3].ns), median(ls[4].ns)
		r.Bench(m.name+"_overhead", with-plain, "ns")
		r.Bench(m.name+"_shim_tail_overhead", tail-plain, "ns")
		r.Bench(m.name+"_shim_add_overhead", add-plain, "ns")
		r.Bench(m.name+"_shim_lock_overhead", lock-plain, "ns")
		r.Bench(m.name+"_locked_add_cost", lock-add, "ns")
		r.Pass("launch cost "+m.what, "%+.0f ns per launch under the interposer (%.0f plain, %.0f with); shims %+.0f tail call, %+.0f plain add, %+.0f locked add: a locked add after the launch costs %+.0f ns. Median of %d alternating rounds: %s",
			with-plain, plain, with, tail-plain, add-plain, lock-plain, lock-add, len(ls[0].ns), strings.Join(rows, "; "))
	}
	r.Note("The budget is 50 ns added per launch (the goal 10): the capturing-stream figure measures it. " +
		"The shims wrap cuLaunchKernel as the interposer does and differ only in what follows the driver's return; " +
		"locked_add_cost (locked add minus plain add) is what a lock-prefixed instruction after the launch costs on this driver. " +
		"Spread is the largest round less the smallest.")
}

// trainingRounds alternate the three set-ups (plain, probes, interposer),
// so drift falls on all alike; the ratios are means over the rounds.
const trainingRounds = 3

// trainingOverhead trains alone: plain, under the interposer, and under the
// interposer with the agent's probes attached (default settings), in turns:
// a container the agent serves has the interposer, and its ledger spares it
// the launch probes. While the probes are attached the kernel counts each
// eBPF program's runs and run time, read from the agent's own programs.
func (e *env) trainingOverhead(ctx context.Context, r *Result) {
	secs := 4.0 // nine runs, each with PyTorch's start and warm-up, in about 2 minutes
	if e.o.Simulate {
		secs = 3
	}
	setups := []struct {
		name  string
		env   []string
		agent bool
	}{
		{"plain", e.baseEnv(), false},
		{"interposer", e.preloaded(e.newDir("overhead")), false},
		{"probes", nil, true}, // the interposer's environment, with the agent's control directory
	}
	rates := map[string][]float64{}
	var progs progStats
	var wall []string
	failed := false
rounds:
	for i := 0; i < trainingRounds; i++ {
		for _, s := range setups {
			start := time.Now()
			var v float64
			var err error
			if ctx.Err() != nil {
				err = fmt.Errorf("the part's time ran out")
			} else if s.agent {
				v, err = e.probedRun(ctx, secs, &progs)
			} else {
				v, err = e.trainRun(ctx, s.env, secs, nil)
			}
			if err != nil {
				r.Fail("training throughput", "round %d, %s: %v; each run before took %s s of wall time", i+1, s.name, err, orNone(wall))
				failed = true
				break rounds
			}
			rates[s.name] = append(rates[s.name], v)
			r.Bench(fmt.Sprintf("training_round%d_images_per_sec_%s", i+1, s.name), v, "images/s")
			wall = append(wall, fmt.Sprintf("%.0f", time.Since(start).Seconds()))
		}
	}
	n := wholeRounds(rates, setups[len(setups)-1].name)
	if n == 0 {
		return
	}
	plain, with, probed := mean(rates["plain"]), mean(rates["interposer"]), mean(rates["probes"])
	r.Bench("training_images_per_sec_plain", plain, "images/s")
	r.Bench("training_images_per_sec_interposer", with, "images/s")
	r.Bench("training_images_per_sec_probes", probed, "images/s")
	r.Bench("training_interposer_ratio", with/plain, "ratio")
	r.Bench("training_probes_ratio", probed/with, "ratio") // the probes' cost alone: both under the interposer
	r.Bench("training_probes_ratio_min", minRatio(rates["probes"], rates["interposer"]), "ratio")
	r.Bench("training_probes_ratio_max", maxRatio(rates["probes"], rates["interposer"]), "ratio")
	r.Bench("training_rounds", float64(n), "rounds")
	what := "ResNet-50, batch 64"
	if e.o.Simulate {
		what = "simgpu's workload, 20 µs kernels"
	}
	detail := fmt.Sprintf("%s, alone, %.0f s timed a run, mean of %d alternating rounds: %.1f images/s plain, %.1f under the interposer (%.4f of plain), %.1f with the agent's probes too (%.4f of the interposer's); each round (plain/interposer/probes): %s; each run's wall time: %s s",
		what, secs, n, plain, with, with/plain, probed, probed/with, roundsText(rates, n), strings.Join(wall, ", "))
	if failed || n < trainingRounds {
		r.Fail("training ratios", "%d of %d rounds: %s", n, trainingRounds, detail)
	} else {
		r.Pass("training throughput", "%s", detail)
	}
	progs.report(r)
}

// wholeRounds cuts rates to the rounds every setup ran, so every mean is
// over the same rounds (a round is whole once its last setup ran), and
// returns how many there are.
func wholeRounds(rates map[string][]float64, last string) int {
	n := len(rates[last])
	for k := range rates {
		rates[k] = rates[k][:min(n, len(rates[k]))]
	}
	return n
}

// trainRun trains once with env and returns the rate it printed; ready,
// if set, runs when the warm-up is over and the timed run starts.
func (e *env) trainRun(ctx context.Context, env []string, secs float64, ready func()) (float64, error) {
	t, err := e.startTrainer(ctx, env, nil, "", 64, 20000, secs)
	if err != nil {
		return 0, err
	}
	if ready != nil {
		if err := t.waitReady(ctx, 3*time.Minute); err != nil {
			t.p.stop()
			return 0, err
		}
		ready()
	}
	rate, err := t.finalRate(time.Duration(secs)*time.Second + 2*time.Minute)
	if ctx.Err() != nil {
		err = fmt.Errorf("stopped: the part's time ran out")
	}
	return rate, err
}

// probedRun trains once with the agent's probes attached and eBPF run-time
// statistics on (BPF_ENABLE_STATS, what kernel.bpf_stats_enabled=1 turns on;
// off again when closed, even if the check dies), and adds what the
// agent's programs ran over the timed run to progs. Statistics that cannot
// be had are noted in progs; the run's rate still counts.
func (e *env) probedRun(ctx context.Context, secs float64, progs *progStats) (float64, error) {
	stats, err := probes.EnableStats()
	if err != nil {
		progs.err = err
	} else {
		defer stats.Close()
	}
	controlDir := e.newDir("control")
	a, err := e.startAgent(ctx, controlDir, "GPUWARDEN_ENFORCEMENT_ENABLED=false")
	if err != nil {
		return 0, fmt.Errorf("agent: %w", err)
	}
	defer a.stop()
	pid := a.p.cmd.Process.Pid
	// Read when the timed run starts and when it should end, so neither
	// the warm-up nor the teardown (contexts and memory given back) counts.
	type reading struct {
		stats map[string]probes.ProgramStat
		at    time.Time
		err   error
	}
	read := func() reading {
		s, err := probes.ProcessProgramStats(pid)
		return reading{s, time.Now(), err}
	}
	var before reading
	end := make(chan reading, 1)
	rate, err := e.trainRun(ctx, e.preloaded(controlDir), secs, func() {
		before = read()
		go func() {
			time.Sleep(time.Duration(secs * float64(time.Second)))
			end <- read()
		}()
	})
	if err != nil {
		return 0, err
	}
	after := <-end
	if err := a.exited(); err != nil {
		return 0, err
	}
	if progs.err == nil {
		if progs.err = errors.Join(before.err, after.err); progs.err == nil {
			progs.add(before.stats, after.stats, after.at.Sub(before.at))
		}
	}
	return rate, nil
}

// progStats sums each eBPF program's runs and run time over the probed runs.
type progStats struct {
	runs    map[string]uint64
	runtime map[string]time.Duration
	over    time.Duration
	err     error // why there are none
}

func (s *progStats) add(before, after map[string]probes.ProgramStat, over time.Duration) {
	if s.runs == nil {
		s.runs, s.runtime = map[string]uint64{}, map[string]time.Duration{}
	}
	for name, a := range after {
		s.runs[name] += a.RunCount - before[name].RunCount
		s.runtime[name] += a.Runtime - before[name].Runtime
	}
	s.over += over
}

// report puts a row per program that ran into the report, and BENCH lines
// for every program.
func (s *progStats) report(r *Result) {
	if s.err != nil {
		r.Fail("eBPF programs", "no run-time statistics of the agent's programs: %v", s.err)
		return
	}
	if s.over <= 0 {
		return
	}
	names := make([]string, 0, len(s.runs))
	for n := range s.runs {
		names = append(names, n)
	}
	sort.Strings(names)
	secs := s.over.Seconds()
	var rows, idle []string
	var cpu float64
	for _, n := range names {
		hits := float64(s.runs[n]) / secs
		var per float64
		if s.runs[n] > 0 {
			per = float64(s.runtime[n].Nanoseconds()) / float64(s.runs[n])
		}
		r.Bench("training_probes_prog_"+n+"_hits_per_sec", hits, "hits/s")
		r.Bench("training_probes_prog_"+n+"_ns_per_hit", per, "ns")
		if s.runs[n] == 0 {
			idle = append(idle, n)
			continue
		}
		share := float64(s.runtime[n].Nanoseconds()) / float64(s.over.Nanoseconds()) * 100
		cpu += share
		rows = append(rows, fmt.Sprintf("| %s | %.1f | %.0f | %.4f |", n, hits, per, share))
	}
	r.Bench("training_probes_bpf_cpu_percent", cpu, "%")
	r.Note("eBPF programs of the agent over the probed runs' timed %.1f s (run-time statistics on; counts are the whole node's, as an agent's are):\n\n"+
		"| program | hits/s | ns per hit | %% of a core |\n| --- | --- | --- | --- |\n%s\n\nNo hits: %s. "+
		"A uprobe hit also costs the traced thread its trap, which run_time_ns does not count; "+
		"the statistics add two clock reads to each hit, in the probed runs only.",
		secs, strings.Join(rows, "\n"), orNone(idle))
}

func orNone(v []string) string {
	if len(v) == 0 {
		return "none"
	}
	return strings.Join(v, ", ")
}

func roundsText(rates map[string][]float64, n int) string {
	var out []string
	for i := 0; i < n; i++ {
		out = append(out, fmt.Sprintf("%.1f/%.1f/%.1f", rates["plain"][i], rates["interposer"][i], rates["probes"][i]))
	}
	return strings.Join(out, ", ")
}

// minRatio and maxRatio are the extremes of a[i]/b[i] over the rounds.
func minRatio(a, b []float64) float64 {
	m := math.Inf(1)
	for i := range a {
		m = math.Min(m, a[i]/b[i])
	}
	return m
}

func maxRatio(a, b []float64) float64 {
	m := math.Inf(-1)
	for i := range a {
		m = math.Max(m, a[i]/b[i])
	}
	return m
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

// spread is the largest value less the smallest.
func spread(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	lo, hi := v[0], v[0]
	for _, x := range v {
		lo, hi = math.Min(lo, x), math.Max(hi, x)
	}
	return hi - lo
}
