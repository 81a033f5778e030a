package gpucheck

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/agentapi"
	"github.com/gpuwarden/gpuwarden/enforcer/scheduler"
)

// trainer is one training process: PyTorch's ResNet-50 on NVIDIA's driver,
// simgpu's workload in simulation mode. It counts images as it goes.
type trainer struct {
	e         *env
	p         *proc
	cg        *cgroup
	readyOnce func()

	mu       sync.Mutex
	at       time.Time // of the latest progress line
	images   float64
	deviceMs float64 // the GPU time it held: by CUPTI, or its steps' spans by CUDA events
	busyMs   float64 // the time its kernels ran (CUPTI only)
	judge    string  // what deviceMs is: "cupti", or "events" and why
	dropped  string  // kernel records CUPTI lost, if any
	final    float64 // images/s the program printed at its end
	stderr   strings.Builder
	ready    chan struct{}
}

// Simulated training: 8 kernels of 2 ms a step, 32 images a step (the
// workload's --progress prints its lines as train.py does).
const (
	simKernels = 8
	simBatch   = 32
)

// startTrainer runs a training process for secs seconds with env, in cg if
// not nil, on cpus if not empty (taskset's list), at batch size batch
// (PyTorch) or simgpu's step of kernelNs kernels.
func (e *env) startTrainer(ctx context.Context, env []string, cg *cgroup, cpus string, batch int, kernelNs int, secs float64) (*trainer, error) {
	t := &trainer{e: e, cg: cg, ready: make(chan struct{})}
	t.readyOnce = sync.OnceFunc(func() { close(t.ready) })
	s := strconv.FormatFloat(secs, 'f', 1, 64)
	var argv []string
	if e.o.Simulate {
		argv = []string{e.bundlePath("simgpu", "workload"), "--seconds", s, "--kernels", strconv.Itoa(simKernels),
			"--kernel-ns", strconv.Itoa(kernelNs), "--batch", strconv.Itoa(simBatch), "--label", "train", "--progress"}
	} else {
		argv = []string{e.python(), e.bundlePath("src", "train.py"), "--batch", strconv.Itoa(batch), "--seconds", s}
	}
	if cpus != "" {
		argv = append([]string{"taskset", "-c", cpus}, argv...)
	}
	cmd := e.command(ctx, env, argv[0], argv[1:]...)
	cmd.Stderr = &lockedBuilder{mu: &t.mu, b: &t.stderr}
	var err error
	if t.p, err = e.start(cmd, cg, t.line); err != nil {
		return nil, err
	}
	return t, nil
}

type lockedBuilder struct {
	mu *sync.Mutex
	b  *strings.Builder
}

func (l *lockedBuilder) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.Len() < 64<<10 {
		l.b.Write(p)
	}
	return len(p), nil
}

// line follows the program's output: ready, progress and its final rate.
func (t *trainer) line(l string) {
	f := strings.Fields(l)
	switch {
	case len(f) > 0 && f[0] == "ready":
		t.readyOnce()
	case len(f) >= 2 && f[0] == "devtime": // train.py
		t.mu.Lock()
		t.judge = strings.Join(f[1:], " ")
		t.mu.Unlock()
	case len(f) == 2 && f[0] == "devtime_dropped":
		t.mu.Lock()
		t.dropped = f[1]
		t.mu.Unlock()
	case len(f) >= 3 && len(f) <= 5 && f[0] == "progress":
		var v [4]float64 // time, images, device ms, busy ms
		for i := range f[1:] {
			v[i], _ = strconv.ParseFloat(f[1+i], 64)
		}
		t.mu.Lock()
		t.at, t.images, t.deviceMs, t.busyMs = time.Unix(0, int64(v[0]*1e9)), v[1], v[2], v[3]
		t.mu.Unlock()
	case len(f) == 2 && f[0] == "images_per_sec": // train.py
		t.setFinal(f[1])
	case len(f) == 4 && f[0] == "BENCH" && f[1] == "train_images_per_sec": // simgpu's workload
		t.setFinal(f[2])
	}
}

func (t *trainer) setFinal(v string) {
	rate, _ := strconv.ParseFloat(v, 64)
	t.mu.Lock()
	t.final = rate
	t.mu.Unlock()
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func tailText(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		s = "..." + s[len(s)-n:]
	}
	return s
}

// waitReady waits for the program's warm-up to end.
func (t *trainer) waitReady(ctx context.Context, timeout time.Duration) error {
	select {
	case <-t.ready:
		return nil
	case <-t.p.done:
		t.mu.Lock()
		defer t.mu.Unlock()
		return fmt.Errorf("exited: %v: %s", t.p.cmd.ProcessState, tailText(t.stderr.String(), 800))
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(timeout):
		return fmt.Errorf("not ready after %s", timeout)
	}
}

// progress is how many images the program has trained, its device and
// busy ms, and when, from its latest progress line.
func (t *trainer) progress() (time.Time, float64, float64, float64, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.at.IsZero() {
		return t.at, 0, 0, 0, fmt.Errorf("no progress yet")
	}
	return t.at, t.images, t.deviceMs, t.busyMs, nil
}

// deviceJudge is the judge of a row's device time: CUPTI's where both
// trainers have it, else CUDA events.
type deviceJudge struct {
	cupti bool
	name  string // and why not CUPTI, and any records CUPTI lost
}

func judgeOf(ts []*trainer) deviceJudge {
	j := deviceJudge{cupti: true, name: "CUPTI's stretches"}
	var why, lost []string
	for i, t := range ts {
		t.mu.Lock()
		if t.judge != "cupti" {
			j.cupti = false
			if t.judge != "" {
				why = append(why, fmt.Sprintf("container %c: %s", 'a'+i, t.judge))
			}
		}
		if t.dropped != "" {
			lost = append(lost, fmt.Sprintf("container %c: CUPTI dropped %s records", 'a'+i, t.dropped))
		}
		t.mu.Unlock()
	}
	if !j.cupti {
		j.name = strings.Join(append([]string{"CUDA events"}, why...), "; ")
	}
	if len(lost) > 0 {
		j.name += "; " + strings.Join(lost, "; ")
	}
	return j
}

// finalRate waits for the program to end and returns the rate it printed.
func (t *trainer) finalRate(timeout time.Duration) (float64, error) {
	if !t.p.wait(timeout) {
		t.p.stop()
		return 0, fmt.Errorf("still running after %s", timeout)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.final == 0 {
		return 0, fmt.Errorf("printed no rate: %s", tailText(t.stderr.String(), 800))
	}
	return t.final, nil
}

// shareRow is one experiment: two containers side by side on GPU 0.
type shareRow struct {
	name     string
	batch    int    // PyTorch's batch size
	kernelNs int    // simgpu's kernel length
	policy   string // set with `gpuwarden ctl gpu 0` first; "" leaves the GPU as it is
	wa, wb   int    // weights
	target   float64
	solo     bool // measure b alone after the pair (rows of the same settings share it)
}

// trainerCPUs is the CPUs the pair's container i (0 or 1) is pinned to, as
// a node's CPU manager gives pods cores of their own: each takes half of
// the CPUs after the first (the agent and the check keep the first and
// any odd one), so that neither's host pace depends on where the other's
// threads run. None on a machine of fewer than 8 CPUs or without taskset.
func trainerCPUs(i int) string {
	n := runtime.NumCPU()
	if _, err := exec.LookPath("taskset"); n < 8 || err != nil {
		return ""
	}
	half := (n - 1) / 2
	lo := 1 + i*half
	return fmt.Sprintf("%d-%d", lo, lo+half-1)
}

// soloRates are one container's rates alone at a row's settings, under its
// gate and with launches not gated.
type soloRates struct{ gated, ungated float64 }

// soloKey names a row's training settings, whose solo rate rows share.
func (row shareRow) soloKey() string { return fmt.Sprintf("%d/%d", row.batch, row.kernelNs) }

// timing says how long each phase of a row takes: the pair is measured
// in runs windows, the weights swapped between one and the next, each after
// a settle, then one container alone for solo, under its gate and then not
// gated.
type timing struct {
	ready, settle, window, solo time.Duration
	runs                        int
}

func (e *env) shareTiming() timing {
	if e.o.Simulate {
		return timing{ready: 30 * time.Second, settle: 1500 * time.Millisecond, window: 3 * time.Second, solo: 3 * time.Second, runs: 4}
	}
	// Five rows in about 5 and a half minutes: each is one start of both trainers
	// (PyTorch's start and warm-up, about 15 s), 8 windows and two solos.
	// A swap of weights settles within a few of the scheduler's rounds
	// (about 150 ms each at 1:2). Many short windows rather than a few
	// long ones: on an H200's host a window's images/s ratio swung by 8%
	// (sd) with the trainers' paces in 6 s and 8 s windows alike, a drift
	// slower than a window that swapping often cancels.
	return timing{ready: 120 * time.Second, settle: time.Second, window: 3 * time.Second, solo: 6 * time.Second, runs: 8}
}

// rowAsked says whether --rows asks for the row name: none asks for all,
// else a row whose name contains one of the words.
func rowAsked(words []string, name string) bool {
	return len(words) == 0 || slices.ContainsFunc(words, func(w string) bool { return strings.Contains(name, w) })
}

// rowTime is how long a row runs once both trainers are ready.
func (tm timing) rowTime() time.Duration {
	return time.Duration(2+tm.runs)*tm.settle + time.Duration(tm.runs)*tm.window + 2*tm.solo
}

// checkShares is part 4: two containers at weights 1:2 under the agent, per
// batch size as cGPU's table; then fixed 30/70. Each row's ratio is
// measured in 8 windows, the weights swapped between one and the next, by
// images/s and by the device time CUPTI's kernel records give each
// container, beside one container's rate alone at the same settings.
func checkShares(ctx context.Context, e *env, r *Result) {
	if os.Geteuid() != 0 {
		r.Fail("root", "cgroups need root")
		return
	}
	rows := []shareRow{{name: "weighted_1to2_k2ms", kernelNs: 2000000, policy: "weighted", wa: 1, wb: 2, target: 2, solo: true},
		{name: "fixed_30_70_k2ms", kernelNs: 2000000, policy: "fixed", wa: 3, wb: 7, target: 7.0 / 3}}
	tolerance := 0.35 // simgpu on a loaded CI machine: the precise figures are make bench's
	if !e.o.Simulate {
		rows = nil
		for _, b := range []int{16, 32, 64, 128} {
			rows = append(rows, shareRow{name: fmt.Sprintf("weighted_1to2_batch%d", b), batch: b, policy: "weighted", wa: 1, wb: 2, target: 2, solo: true})
		}
		rows = append(rows, shareRow{name: "fixed_30_70_batch64", batch: 64, policy: "fixed", wa: 3, wb: 7, target: 7.0 / 3})
		tolerance = 0.10
	}
	controlDir := e.newDir("control")
	a, err := e.startAgent(ctx, controlDir)
	if err != nil {
		r.Fail("agent", "%v", err)
		return
	}
	defer a.keepLog(filepath.Join(e.o.Out, "shares-agent.log"))
	defer a.stopFor(r)
	var devtime []string // the trainers' environment for the CUPTI judge
	if !e.o.Simulate {
		lib, err := e.devtimeLib(ctx)
		if err != nil {
			r.Note("CUPTI's judge could not be built, so device time is judged by CUDA events: %v", err)
		} else {
			devtime = []string{"GPU_CHECK_DEVTIME_LIB=" + lib}
		}
	}
	slice := scheduler.DefaultSlice
	if e.o.TimeSlice > 0 {
		slice = e.o.TimeSlice
		r.Note("The agent ran with enforcement.timeSlice %s (--time-slice).", e.o.TimeSlice)
	}
	if rowAsked(e.o.Rows, "host_pace") {
		e.checkHostPace(ctx, r, slice)
	} else {
		r.Skip("host_pace", "not asked for (--rows)")
	}
	tm := e.shareTiming()
	solo := map[string]soloRates{}
	for _, row := range rows {
		if !rowAsked(e.o.Rows, row.name) {
			r.Skip(row.name, "not asked for (--rows)")
			continue
		}
		if a.exited() != nil { // stopFor says why
			r.Skip(row.name, "the agent has exited")
			continue
		}
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < tm.rowTime()+20*time.Second {
			r.Skip(row.name, "out of the part's time")
			continue
		}
		e.shareRow(ctx, a, controlDir, devtime, row, tm, tolerance, solo, r)
	}
	r.Note("Each row: both containers warm up; their ratio, the larger share's images/s over the smaller's, is measured in %d windows of %s (mean and spread below), "+
		"the weights swapped between one window and the next (`gpuwarden ctl set`), so that a training whose host runs faster than the other's in its slices "+
		"favours each share in turn and the mean judges the scheduler rather than the two processes' paces (the BENCH lines give the windows at the weights as set and swapped apart); "+
		"then one container alone for %[3]s under its gate (its solo rate; the fixed row uses the weighted row's at the same batch) and %[3]s with its launches not gated (policy native). "+
		"The ratio is judged twice: by images/s, and by the device time each container held: from CUPTI's kernel records, the span of each of its "+
		"stretches of kernels on the GPU (kernels less than 5 ms apart; the other container's slice parts them), or where CUPTI is not to be had, "+
		"each step's span between CUDA events recorded before and after it (the row says which; CUPTI also gives the time its kernels ran, the busy ratio, "+
		"which follows each training's host pace as images/s do). "+
		"beside them, the agent's own: the device time its scheduler's clock charged each container over the window, with the share of wall time it charged, "+
		"its hand-overs a second, and per hand-over how long the previous owner's work drained after its gate closed and how long the device then waited for the next gate. "+
		"Where the machine has 8 CPUs or more, each container is pinned to half of them (taskset), as a node's CPU manager gives pods cores of their own; "+
		"the BENCH lines add each container's launches per second of its charged time (its host's pace in its slices), the share of wall time its launches waited at its gate, "+
		"and NVML's view (its ratio of the two containers' shares, a sample stream, and the GPU's utilization). "+
		"A row passes when its mean images/s ratio is within %.0f%% of its target here; the budget (5%%, goal 2%%) is the `_within_budget` figures.",
		tm.runs, tm.window, tm.solo, tolerance*100)
	r.Note("The first row, host_pace, uses no GPU: two Python processes, pinned as the trainers are, do interpreter-bound work in the phases " +
		"weights 1:2 give two containers at the agent's slice (the smaller share one slice in three, the larger two) and sleep between them, " +
		"as a container's launches wait at its gate; each takes both roles in turn, swapped every interval, and every other two intervals " +
		"they spin through the last 2 ms before their phases instead of sleeping. Its ratio is what the host alone makes of the larger share's " +
		"pace per second of its slices over the smaller's; each row's `_pace_ratio` (launches per second of charged time, the larger share's " +
		"over the smaller's) compares with it: where they agree, images/s exceed the device time's ratio by the host's doing, not the scheduler's.")
	r.Note("CUDA events judge only steps that fit inside a slice: a step's span between its events includes any time the GPU gave the other container " +
		"inside the step, so where steps outlast the other's slice the events' ratio reads about 1 whatever the shares. CUPTI's records cost each " +
		"training some of its host pace (ResNet-50 at batch 32 alone, 2026-12-04: 37 steps/s with them, 44 without), both containers alike.")
}

func (e *env) shareRow(ctx context.Context, a *agent, controlDir string, devtime []string, row shareRow, tm timing, tolerance float64, solo map[string]soloRates, r *Result) {
	if row.policy != "" {
		if out, err := e.ctl(a, "gpu", "0", "--policy", row.policy, "--max-inst", "10"); err != nil {
			r.Fail(row.name, "gpuwarden ctl gpu 0 --policy %s: %v: %s", row.policy, err, out)
			return
		}
	}
	secs := (tm.ready + tm.rowTime() + 10*time.Second).Seconds()
	var ts [2]*trainer
	var cgs [2]*cgroup
	for i, w := range []int{row.wa, row.wb} {
		cg, err := e.cgroup(fmt.Sprintf("%s-%c", row.name, 'a'+i))
		if err != nil {
			r.Fail(row.name, "%v", err)
			return
		}
		defer cg.remove()
		cgs[i] = cg
		env := e.preloaded(controlDir, append([]string{fmt.Sprintf("GPUWARDEN_COMPUTE_WEIGHT=%d", w)}, devtime...)...)
		if ts[i], err = e.startTrainer(ctx, env, cg, trainerCPUs(i), row.batch, row.kernelNs, secs); err != nil {
			r.Fail(row.name, "%v", err)
			return
		}
		defer ts[i].p.stop()
	}
	for i, t := range ts {
		if err := t.waitReady(ctx, tm.ready); err != nil {
			r.Fail(row.name, "container %c: %v", 'a'+i, err)
			return
		}
	}
	time.Sleep(tm.settle)
	judge := judgeOf(ts[:])
	p := "shares_" + row.name
	var byOrder [2][]float64 // the ratios of windows at the row's weights, and swapped
	var ratios, devRatios, busyRatios, agentRatios, paceRatios, sumSmall, sumLarge []float64
	var clocks []clockWindow
	nvml := sampleNVML(a, cgs[:])
	defer nvml.stop()
	weights := [2]int{row.wa, row.wb}
	for run := 1; run <= tm.runs; run++ {
		// Every other window swaps the weights: a host that trains faster
		// than the other in its slices then favours each share in turn, and
		// the mean judges the scheduler, not the two processes' paces.
		swapped := run%2 == 0
		small, large, want := 0, 1, [2]int{row.wa, row.wb}
		if swapped {
			small, large, want = 1, 0, [2]int{row.wb, row.wa}
		}
		if want != weights {
			if err := e.setWeights(a, cgs, weights, want); err != nil {
				r.Fail(row.name, "run %d: %v", run, err)
				return
			}
			weights = want
			time.Sleep(tm.settle)
		}
		x0, err := readClock(a, cgs[:])
		if err != nil {
			r.Fail(row.name, "run %d: the agent's scheduler: %v", run, err)
			return
		}
		m, err := measure(ctx, ts[:], tm.window)
		if err != nil {
			r.Fail(row.name, "run %d: %v", run, err)
			return
		}
		x1, err := readClock(a, cgs[:])
		if err != nil {
			r.Fail(row.name, "run %d: the agent's scheduler: %v", run, err)
			return
		}
		cw := clockOver(x0, x1)
		if swapped {
			cw.ratio = 1 / math.Max(cw.ratio, 1e-9)
		}
		clocks, agentRatios = append(clocks, cw), append(agentRatios, cw.ratio)
		paceRatios = append(paceRatios, cw.launchPace[large]/math.Max(cw.launchPace[small], 1e-9))
		// each ratio is the larger share's over the smaller's
		ratio := m[large].images / math.Max(m[small].images, 1e-9)
		dev := m[large].device / math.Max(m[small].device, 1e-9)
		busy := m[large].busy / math.Max(m[small].busy, 1e-9)
		byOrder[btoi(swapped)] = append(byOrder[btoi(swapped)], ratio)
		ratios, devRatios, busyRatios = append(ratios, ratio), append(devRatios, dev), append(busyRatios, busy)
		sumSmall, sumLarge = append(sumSmall, m[small].images), append(sumLarge, m[large].images)
		q := fmt.Sprintf("%s_run%d_", p, run)
		r.Bench(q+"swapped", float64(btoi(swapped)), "bool")
		r.Bench(q+"a_images_per_sec", m[0].images, "images/s")
		r.Bench(q+"b_images_per_sec", m[1].images, "images/s")
		r.Bench(q+"ratio", ratio, "ratio")
		r.Bench(q+"device_ratio", dev, "ratio")
		r.Bench(q+"a_device_held_fraction", m[0].device/1000, "ratio")
		r.Bench(q+"b_device_held_fraction", m[1].device/1000, "ratio")
		if judge.cupti {
			r.Bench(q+"busy_ratio", busy, "ratio")
		}
		r.Bench(q+"agent_ratio", cw.ratio, "ratio")
		r.Bench(q+"agent_charged_fraction", cw.charged, "ratio")
		r.Bench(q+"handovers_per_sec", cw.handoversPerSec, "1/s")
		r.Bench(q+"drain_ms_per_handover", cw.drainMs, "ms")
		r.Bench(q+"gap_ms_per_handover", cw.gapMs, "ms")
		r.Bench(q+"drains_capped", float64(cw.capped), "count")
		for i, c := range "ab" {
			r.Bench(fmt.Sprintf("%s%c_launches_per_charged_sec", q, c), cw.launchPace[i], "1/s")
			r.Bench(fmt.Sprintf("%s%c_throttled_fraction", q, c), cw.throttled[i], "ratio")
		}
		if nv, ok := nvml.over(x0.at, x1.at); ok {
			r.Bench(q+"nvml_ratio", nv.share[large]/math.Max(nv.share[small], 1e-9), "ratio")
			r.Bench(q+"nvml_device_utilization", nv.util, "ratio")
		}
	}
	rSmall, rLarge := meanOf(sumSmall), meanOf(sumLarge)
	mean, sd := meanOf(ratios), sdOf(ratios)
	devMean, devSD := meanOf(devRatios), sdOf(devRatios)
	judge = judgeOf(ts[:]) // with any records CUPTI lost in the windows
	r.Bench(p+"_small_share_images_per_sec", rSmall, "images/s")
	r.Bench(p+"_large_share_images_per_sec", rLarge, "images/s")
	r.Bench(p+"_ratio", mean, "ratio")
	for i, order := range []string{"as_set", "swapped"} {
		if len(byOrder[i]) > 0 {
			r.Bench(p+"_ratio_"+order, meanOf(byOrder[i]), "ratio")
		}
	}
	r.Bench(p+"_ratio_sd", sd, "ratio")
	r.Bench(p+"_ratio_se", seOf(ratios), "ratio")
	r.Bench(p+"_ratio_min", slices.Min(ratios), "ratio")
	r.Bench(p+"_ratio_max", slices.Max(ratios), "ratio")
	r.Bench(p+"_device_ratio", devMean, "ratio")
	r.Bench(p+"_device_ratio_sd", devSD, "ratio")
	r.Bench(p+"_device_judge_cupti", float64(btoi(judge.cupti)), "bool")
	busyNote := ""
	if judge.cupti {
		r.Bench(p+"_busy_ratio", meanOf(busyRatios), "ratio")
		busyNote = fmt.Sprintf("; its kernels ran %s as long", joinFloats(busyRatios))
	}
	r.Bench(p+"_agent_ratio", meanOf(agentRatios), "ratio")
	r.Bench(p+"_pace_ratio", meanOf(paceRatios), "ratio")
	r.Bench(p+"_agent_ratio_sd", sdOf(agentRatios), "ratio")
	r.Bench(p+"_target_ratio", row.target, "ratio")
	r.Bench(p+"_within_budget", float64(btoi(math.Abs(mean/row.target-1) <= 0.05)), "bool")
	r.Bench(p+"_within_goal", float64(btoi(math.Abs(mean/row.target-1) <= 0.02)), "bool")
	r.Bench(p+"_device_within_budget", float64(btoi(math.Abs(devMean/row.target-1) <= 0.05)), "bool")
	r.Bench(p+"_device_within_goal", float64(btoi(math.Abs(devMean/row.target-1) <= 0.02)), "bool")
	judged(a, row.name, cgs[:], r)
	r.Expect(math.Abs(mean/row.target-1) <= tolerance, row.name,
		"weights %d:%d, swapped every other window: %.1f and %.1f images/s, the larger share's over the smaller's %.3f mean of %s (sd %.3f; target %.3f; %.3f at the weights as set, %.3f swapped); "+
			"by device time held (%s) %.3f mean of %s (sd %.3f)%s; by the agent's clock %s, "+
			"which charged %s of wall time, with %s hand-overs/s, each drained %s ms and waited %s ms (%d drains capped); "+
			"the larger share's launches per second of its charged time over the smaller's %s",
		row.wa, row.wb, rSmall, rLarge, mean, joinFloats(ratios), sd, row.target, meanOf(byOrder[0]), meanOf(byOrder[1]), judge.name, devMean, joinFloats(devRatios), devSD, busyNote, joinFloats(agentRatios),
		joinFloats(clockField(clocks, func(c clockWindow) float64 { return c.charged })),
		joinFloats(clockField(clocks, func(c clockWindow) float64 { return c.handoversPerSec })),
		joinFloats(clockField(clocks, func(c clockWindow) float64 { return c.drainMs })),
		joinFloats(clockField(clocks, func(c clockWindow) float64 { return c.gapMs })), cappedIn(clocks), joinFloats(paceRatios))

	if row.solo {
		// b alone from here, once the agent no longer holds a's container
		// (under the weighted policy a container keeps its share while it
		// exists, whether its process runs or not).
		ts[0].p.stop()
		cgs[0].remove()
		if err := waitFor(ctx, 10*time.Second, func() error {
			var gpu agentapi.GPUInfo
			err := a.get("/api/v1/gpus/0", &gpu)
			if err == nil && gpu.Containers != 1 {
				err = fmt.Errorf("the agent holds %d containers on GPU 0, want b alone", gpu.Containers)
			}
			return err
		}); err != nil {
			r.Fail(row.name+" alone", "%v", err)
			return
		}
		time.Sleep(tm.settle)
		m, err := measure(ctx, ts[1:], tm.solo)
		if err != nil {
			r.Fail(row.name+" alone", "%v", err)
			return
		}
		// and alone with its launches not gated (the next row sets its
		// policy again): what the gate costs a container it need not hold
		rates := soloRates{gated: m[0].images}
		if out, err := e.ctl(a, "gpu", "0", "--policy", "native"); err != nil {
			r.Fail(row.name+" alone", "gpuwarden ctl gpu 0 --policy native: %v: %s", err, out)
			return
		}
		time.Sleep(tm.settle)
		from := time.Now()
		if m, err = measure(ctx, ts[1:], tm.solo); err != nil {
			r.Fail(row.name+" alone", "%v", err)
			return
		}
		rates.ungated = m[0].images
		if nv, ok := nvml.over(from, time.Now()); ok { // how much of the GPU one container keeps busy
			r.Bench(p+"_solo_ungated_nvml_device_utilization", nv.util, "ratio")
		}
		solo[row.soloKey()] = rates
	}
	rates, ok := solo[row.soloKey()]
	s := rates.gated
	if !ok || s <= 0 || rates.ungated <= 0 {
		r.Skip(row.name+" alone", "no solo rate at these settings")
		return
	}
	// Alone, each would take more than its share of what the pair gets:
	// the row tests the scheduler, not a container's own limit.
	total := rSmall + rLarge
	shareA, shareB := float64(row.wa)/float64(row.wa+row.wb), float64(row.wb)/float64(row.wa+row.wb)
	overA, overB := s/(shareA*total), s/(shareB*total)
	r.Bench(p+"_solo_images_per_sec", s, "images/s")
	r.Bench(p+"_sum_over_solo", total/s, "ratio")
	r.Bench(p+"_a_solo_over_share", overA, "ratio")
	r.Bench(p+"_b_solo_over_share", overB, "ratio")
	r.Bench(p+"_solo_ungated_images_per_sec", rates.ungated, "images/s")
	r.Bench(p+"_solo_gated_over_ungated", s/rates.ungated, "ratio")
	r.Bench(p+"_sum_over_ungated_solo", total/rates.ungated, "ratio")
	r.Expect(overA > 1 && overB > 1, row.name+" alone", "one container alone: %.1f images/s, %.2fx the smaller share "+
		"of the pair's %.1f and %.2fx the larger; the pair's sum is %.3f of solo. Alone and not gated (policy native): %.1f images/s, "+
		"of which the gate kept %.3f alone and the pair's sum is %.3f",
		s, overA, total, overB, total/s, rates.ungated, s/rates.ungated, total/rates.ungated)
}

// rate is one trainer's images/s, and device and busy ms per s, over a window.
type rate struct{ images, device, busy float64 }

// measure is each trainer's rates over the same window.
func measure(ctx context.Context, ts []*trainer, window time.Duration) ([]rate, error) {
	type mark struct {
		at                time.Time
		images, dev, busy float64
	}
	snap := func() ([]mark, error) {
		var out []mark
		for i, t := range ts {
			at, n, dev, busy, err := t.progress()
			if err != nil {
				return nil, fmt.Errorf("container %c: %w", 'a'+i, err)
			}
			out = append(out, mark{at, n, dev, busy})
		}
		return out, nil
	}
	m0, err := snap()
	if err != nil {
		return nil, err
	}
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(window):
	}
	m1, err := snap()
	if err != nil {
		return nil, err
	}
	rates := make([]rate, len(ts))
	for i := range ts {
		if dt := m1[i].at.Sub(m0[i].at).Seconds(); dt > 0 {
			rates[i] = rate{(m1[i].images - m0[i].images) / dt, (m1[i].dev - m0[i].dev) / dt, (m1[i].busy - m0[i].busy) / dt}
		}
	}
	return rates, nil
}

func meanOf(v []float64) float64 {
	sum := 0.0
	for _, x := range v {
		sum += x
	}
	return sum / math.Max(float64(len(v)), 1)
}

// sdOf is the sample standard deviation.
func sdOf(v []float64) float64 {
	if len(v) < 2 {
		return 0
	}
	m, ss := meanOf(v), 0.0
	for _, x := range v {
		ss += (x - m) * (x - m)
	}
	return math.Sqrt(ss / float64(len(v)-1))
}

// seOf is the standard error of the mean.
func seOf(v []float64) float64 {
	return sdOf(v) / math.Sqrt(math.Max(float64(len(v)), 1))
}

func joinFloats(v []float64) string {
	var s []string
	for _, x := range v {
		s = append(s, strconv.FormatFloat(x, 'f', 3, 64))
	}
	return strings.Join(s, ", ")
}

// setWeights moves a row's two containers from weights from to to, the
// one that lowers first: under the fixed policy the weights are shares of
// the GPU's instances, and raising first would ask for more than there is.
func (e *env) setWeights(a *agent, cgs [2]*cgroup, from, to [2]int) error {
	order := []int{0, 1}
	if to[0] > from[0] {
		order = []int{1, 0}
	}
	for _, i := range order {
		if out, err := e.ctl(a, "set", cgs[i].rel, "--weight", strconv.Itoa(to[i])); err != nil {
			return fmt.Errorf("gpuwarden ctl set %s --weight %d: %v: %s", cgs[i].rel, to[i], err, out)
		}
	}
	return nil
}
