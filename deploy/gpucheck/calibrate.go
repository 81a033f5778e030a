package gpucheck

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The h200 model's built-in values (simgpu/models/h200.profile): in
// simulation mode the calibration must measure them back.
const (
	simNVMLPeriodUs = 200248
	simTimeSliceNs  = 2091008
)

// profileKey is one line the calibration writes. simgpu reads the keys it
// models; the others are written as comments until it models them, since
// it refuses a key it does not know.
type profileKey struct {
	key     string
	value   float64
	how     string
	modeled bool
	lo, hi  float64 // simgpu's bounds, for the modeled keys
}

// checkCalibration is part 6: what simgpu's h200 model needs, measured on
// the GPU (on simgpu under SIMGPU_MODEL=h200 in simulation mode, where the
// figures must come out as the model's): NVML's per-process sample period
// and whom its samples name, the hardware time slice and the cost of a
// switch between contexts, and the host cost of the event calls the
// interposer makes. It writes simgpu.profile beside the report.
func checkCalibration(ctx context.Context, e *env, r *Result) {
	env := e.baseEnv()
	if e.o.Simulate {
		env = append(env, "SIMGPU_MODEL=h200", "SIMGPU_STATE="+filepath.Join(e.work, "calibrate.state"))
	}
	var keys []profileKey

	out, err := e.calibrate(ctx, env, "costs")
	if err != nil {
		r.Fail("event costs", "%v", err)
	} else {
		var parts []string
		const inARow = "calibrate costs: host clock over 100000 calls in a row, one process alone"
		for _, k := range []profileKey{
			{key: "event_record_ns", how: inARow},
			{key: "event_query_ns", how: inARow},
			{key: "stream_is_capturing_ns", how: inARow},
			{key: "launch_capture_ns", how: "calibrate costs: host clock over 20000 empty-kernel launches into a capturing stream",
				modeled: true, hi: 1000000},
			{key: "launch_exec_ns", how: "calibrate costs: host clock over 20000 empty-kernel launches, a sync every 100 included",
				modeled: true, hi: 1000000},
		} {
			v, ok := field(out, k.key)
			if !ok {
				r.Fail("event costs", "calibrate costs printed no %s: %s", k.key, tailText(out, 400))
				break
			}
			r.Bench("calibrate_"+k.key, v, "ns")
			k.value = v
			keys = append(keys, k)
			parts = append(parts, fmt.Sprintf("%s %.0f ns", strings.TrimSuffix(k.key, "_ns"), v))
		}
		if len(parts) == 5 {
			r.Pass("event costs", "per call: %s", strings.Join(parts, ", "))
		}
	}

	if k, ok := e.calibrateNVML(ctx, r, env); ok {
		keys = append(keys, k)
	}
	keys = append(keys, e.calibrateSlices(ctx, r, env)...)

	path := filepath.Join(e.o.Out, "simgpu.profile")
	if err := writeProfile(path, e, keys); err != nil {
		r.Fail("profile", "%v", err)
		return
	}
	// simgpu must take the file as it is: the bundle's simgpu loads it.
	simEnv := append(e.simgpuEnv(), "SIMGPU_MODEL=h200", "SIMGPU_PROFILE="+path)
	cmd := e.command(ctx, simEnv, e.bundlePath("simgpu", "workload"), "--steps", "1", "--kernels", "1", "--kernel-ns", "1000")
	if b, err := cmd.CombinedOutput(); err != nil {
		r.Fail("profile", "simgpu refused %s: %v: %s", path, err, tailText(string(b), 400))
	} else {
		r.Pass("profile", "simgpu.profile beside this report (SIMGPU_PROFILE=simgpu.profile with SIMGPU_MODEL=h200); simgpu loads it")
	}
	r.Note("Each figure's method is in the profile's comment beside it. Keys simgpu does not model yet are written as comments.")
}

// simgpuEnv is a process's environment on the bundle's simgpu, on a state
// file of its own, whatever the mode.
func (e *env) simgpuEnv() []string {
	var out []string
	for _, kv := range e.baseEnv() {
		if !strings.HasPrefix(kv, "LD_LIBRARY_PATH=") && !strings.HasPrefix(kv, "SIMGPU_") {
			out = append(out, kv)
		}
	}
	return append(out, "LD_LIBRARY_PATH="+e.bundlePath("simgpu"), "SIMGPU_STATE="+filepath.Join(e.work, "profile-check.state"),
		"SIMGPU_DEVICES=1", "SIMGPU_MEMORY=1Gi")
}

// calibrate runs the bundle's calibrate to its end and returns its output.
func (e *env) calibrate(ctx context.Context, env []string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	cmd := e.command(ctx, env, e.bundlePath("tools", "calibrate"), args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	if err != nil {
		return string(b), fmt.Errorf("calibrate %s: %v: %s", strings.Join(args, " "), err, tailText(stderr.String(), 600))
	}
	return string(b), nil
}

// calibrateProc is a calibrate run in the background.
type calibrateProc struct {
	p     *proc
	pid   int
	lines []string
	ready chan struct{}
}

func (e *env) startCalibrate(ctx context.Context, env []string, args ...string) (*calibrateProc, error) {
	c := &calibrateProc{ready: make(chan struct{})}
	cmd := e.command(ctx, env, e.bundlePath("tools", "calibrate"), args...)
	stderr := &lockedBuilder{mu: new(sync.Mutex), b: new(strings.Builder)}
	cmd.Stderr = stderr
	var err error
	c.p, err = e.start(cmd, nil, func(l string) {
		if strings.HasPrefix(l, "ready pid=") {
			c.pid, _ = strconv.Atoi(strings.TrimPrefix(l, "ready pid="))
			close(c.ready)
			return
		}
		c.lines = append(c.lines, l)
	})
	if err != nil {
		return nil, err
	}
	select {
	case <-c.ready:
		return c, nil
	case <-c.p.done:
		return nil, fmt.Errorf("calibrate %s exited: %v: %s", strings.Join(args, " "), cmd.ProcessState, tailText(stderr.b.String(), 600))
	case <-time.After(60 * time.Second):
		c.p.stop()
		return nil, fmt.Errorf("calibrate %s: not ready after 60 s", strings.Join(args, " "))
	}
}

// wait waits for the run's end; its lines are complete then.
func (c *calibrateProc) wait(timeout time.Duration) error {
	if !c.p.wait(timeout) {
		c.p.stop()
		return fmt.Errorf("still running after %s", timeout)
	}
	if len(c.lines) == 0 || c.lines[len(c.lines)-1] != "done" {
		return fmt.Errorf("ended without finishing: %v", c.p.cmd.ProcessState)
	}
	return nil
}

// calibrateNVML reads NVML's per-process samples for 3 s while one process
// keeps the engine busy and another holds an idle context.
func (e *env) calibrateNVML(ctx context.Context, r *Result, env []string) (profileKey, bool) {
	idle, err := e.startCalibrate(ctx, env, "idle", "6")
	if err != nil {
		r.Fail("NVML sample period", "%v", err)
		return profileKey{}, false
	}
	defer idle.p.stop()
	busy, err := e.startCalibrate(ctx, env, "run", "--kernel-us", "2000", "--seconds", "5")
	if err != nil {
		r.Fail("NVML sample period", "%v", err)
		return profileKey{}, false
	}
	defer busy.p.stop()
	time.Sleep(500 * time.Millisecond)
	out, err := e.calibrate(ctx, env, "nvml", "3")
	if err != nil {
		r.Fail("NVML sample period", "%v", err)
		return profileKey{}, false
	}
	s := parseSamples(out)
	period, n := samplePeriod(s)
	if n < 5 {
		r.Fail("NVML sample period", "%d samples with a distinct instant in 3 s, want at least 5: %s", n, tailText(out, 400))
		return profileKey{}, false
	}
	named := s.named(busy.pid, idle.pid)
	r.Bench("calibrate_nvml_sample_period_us", period, "us")
	r.Bench("calibrate_nvml_samples_naming_busy_ratio", named[0], "ratio")
	r.Bench("calibrate_nvml_samples_naming_idle_ratio", named[1], "ratio")
	detail := fmt.Sprintf("%.0f us between sample instants (median of %d); of the samples with utilization, %.0f%% name the busy process, %.0f%% the idle one",
		period, n, named[0]*100, named[1]*100)
	if e.o.Simulate {
		r.Expect(math.Abs(period/simNVMLPeriodUs-1) <= 0.1, "NVML sample period", "%s (the h200 model's: %d us, want within 10%%)", detail, simNVMLPeriodUs)
	} else {
		r.Pass("NVML sample period", "%s", detail)
	}
	return profileKey{key: "nvml_sample_period_us", value: period, modeled: true, lo: 1000, hi: 60000000,
		how: fmt.Sprintf("calibrate nvml: median gap between NVML per-process sample instants, read every 10 ms for 3 s, one process busy and one idle (%d samples)", n)}, true
}

// samples are NVML per-process samples: instant (us), pid, SM percent.
type samples []struct {
	ts       uint64
	pid, pct int
}

func parseSamples(out string) samples {
	var s samples
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) != 4 || f[0] != "sample" {
			continue
		}
		ts, err1 := strconv.ParseUint(f[1], 10, 64)
		pid, err2 := strconv.Atoi(f[2])
		pct, err3 := strconv.Atoi(f[3])
		if err1 == nil && err2 == nil && err3 == nil {
			s = append(s, struct {
				ts       uint64
				pid, pct int
			}{ts, pid, pct})
		}
	}
	return s
}

// samplePeriod is the median gap between distinct sample instants, and how
// many instants there were.
func samplePeriod(s samples) (float64, int) {
	var ts []float64
	seen := map[uint64]bool{}
	for _, x := range s {
		if !seen[x.ts] {
			seen[x.ts] = true
			ts = append(ts, float64(x.ts))
		}
	}
	sort.Float64s(ts)
	var gaps []float64
	for i := 1; i < len(ts); i++ {
		gaps = append(gaps, ts[i]-ts[i-1])
	}
	return medianOf(gaps), len(ts)
}

// named is the share of samples with utilization that name each pid.
func (s samples) named(pids ...int) []float64 {
	out := make([]float64, len(pids))
	total := 0
	for _, x := range s {
		if x.pct == 0 {
			continue
		}
		total++
		for i, p := range pids {
			if x.pid == p {
				out[i]++
			}
		}
	}
	for i := range out {
		out[i] /= math.Max(float64(total), 1)
	}
	return out
}

// calibrateSlices runs two processes side by side from one instant: one
// with 20 ms kernels, one with 50 us kernels and an event after each.
// The second's completions come in bursts; the gaps between them are the
// first's turns on the engine (a time slice, plus the switches). On
// NVIDIA's driver the kernels also log, by %globaltimer, each stretch they
// ran: the first's stretches are the slice itself, and the holes between
// one process's stretch and the other's are the switches. NVML is read
// meanwhile: with both busy, whom do its samples name?
func (e *env) calibrateSlices(ctx context.Context, r *Result, env []string) []profileKey {
	const secs = "3"
	at := strconv.FormatInt(time.Now().Add(1500*time.Millisecond).UnixNano(), 10)
	long, err := e.startCalibrate(ctx, env, "run", "--kernel-us", "20000", "--seconds", secs, "--start-at", at, "--records")
	if err != nil {
		r.Fail("time slice", "%v", err)
		return nil
	}
	defer long.p.stop()
	short, err := e.startCalibrate(ctx, env, "run", "--kernel-us", "50", "--seconds", secs, "--start-at", at, "--events", "--records")
	if err != nil {
		r.Fail("time slice", "%v", err)
		return nil
	}
	defer short.p.stop()
	nv, nvErr := e.calibrate(ctx, env, "nvml", "4")
	for _, c := range []*calibrateProc{long, short} {
		if err := c.wait(30 * time.Second); err != nil {
			r.Fail("time slice", "calibrate run: %v", err)
			return nil
		}
	}
	var keys []profileKey

	// By events: bursts of the short kernels' completions.
	bursts := intervals(short.lines, "burst")
	if len(bursts) > 2 {
		bursts = bursts[1 : len(bursts)-1] // the first and last are cut by the run's ends
	}
	var burstLen, gapLen []float64
	for i, b := range bursts {
		burstLen = append(burstLen, b[1]-b[0])
		if i > 0 {
			gapLen = append(gapLen, b[0]-bursts[i-1][1])
		}
	}
	if len(gapLen) < 10 {
		r.Fail("time slice", "%d bursts of the short kernels' completions, want at least 10: %s", len(bursts), tailText(strings.Join(short.lines, "\n"), 400))
		return nil
	}
	gap, burst := medianOf(gapLen), medianOf(burstLen)
	r.Bench("calibrate_event_gap_ns", gap, "ns")
	r.Bench("calibrate_event_burst_ns", burst, "ns")
	slice := profileKey{key: "time_slice_ns", value: gap, modeled: true, lo: 10000, hi: 1000000000,
		how: fmt.Sprintf("calibrate run --events: median gap between bursts of 50 us kernels' completions beside 20 ms kernels, the long kernels' turn plus two switches (%d gaps)", len(gapLen))}
	detail := fmt.Sprintf("by events: the short kernels completed in bursts of %.0f us (median) with gaps of %.0f us (the long kernels' turn, switches included)", burst/1000, gap/1000)

	// By %globaltimer (NVIDIA's driver): each process's stretches on the engine.
	longRuns, shortRuns := intervals(long.lines, "run"), intervals(short.lines, "run")
	if len(longRuns) > 2 && len(shortRuns) > 2 {
		var runLen []float64
		for _, x := range longRuns[1 : len(longRuns)-1] {
			runLen = append(runLen, x[1]-x[0])
		}
		slice.value = medianOf(runLen)
		slice.how = fmt.Sprintf("calibrate run --records: median stretch a 20 ms kernel ran on the engine by %%globaltimer beside a process of 50 us kernels (%d stretches)", len(runLen))
		sw := switchHoles(longRuns, shortRuns)
		detail += fmt.Sprintf("; by %%globaltimer: the long kernels ran %.0f us at a time (median of %d)", slice.value/1000, len(runLen))
		r.Bench("calibrate_time_slice_ns", slice.value, "ns")
		if len(sw) > 0 {
			c := medianOf(sw)
			r.Bench("calibrate_context_switch_ns", c, "ns")
			detail += fmt.Sprintf(", %.1f us between one process's stretch and the other's (median of %d switches)", c/1000, len(sw))
			keys = append(keys, profileKey{key: "context_switch_ns", value: c,
				how: fmt.Sprintf("calibrate run --records: median hole by %%globaltimer between one process's stretch on the engine and the other's (%d switches)", len(sw))})
		}
	} else {
		detail += "; no %globaltimer stretches (simgpu's kernels write no memory): the slice is the event gap"
	}
	if e.o.Simulate {
		r.Expect(slice.value >= simTimeSliceNs*0.8 && slice.value <= simTimeSliceNs*1.6, "time slice", "%s (the h200 model's slice: %d us; want 0.8-1.6 of it, simgpu's hand-over included)", detail, simTimeSliceNs/1000)
	} else {
		r.Pass("time slice", "%s", detail)
	}
	keys = append(keys, slice)

	if nvErr != nil {
		r.Fail("NVML attribution, both busy", "%v", nvErr)
	} else {
		s := parseSamples(nv)
		named := s.named(long.pid, short.pid)
		r.Bench("calibrate_nvml_both_busy_naming_long_ratio", named[0], "ratio")
		r.Bench("calibrate_nvml_both_busy_naming_short_ratio", named[1], "ratio")
		r.Pass("NVML attribution, both busy", "%d samples; %.0f%% name the 20 ms kernels' process, %.0f%% the 50 us kernels' (NVML credits a sample to one process)",
			len(s), named[0]*100, named[1]*100)
	}
	return keys
}

// intervals are the lines "<kind> START END" as [start, end] in ns.
func intervals(lines []string, kind string) [][2]float64 {
	var out [][2]float64
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) != 3 || f[0] != kind {
			continue
		}
		a, err1 := strconv.ParseFloat(f[1], 64)
		b, err2 := strconv.ParseFloat(f[2], 64)
		if err1 == nil && err2 == nil && b >= a {
			out = append(out, [2]float64{a, b})
		}
	}
	return out
}

// switchHoles are the holes, on the common %globaltimer clock, between a
// stretch of one process and the next stretch of the other (under 500 us:
// a longer one is idle time, not a switch).
func switchHoles(a, b [][2]float64) []float64 {
	type iv struct {
		s, e  float64
		owner int
	}
	var all []iv
	for _, x := range a {
		all = append(all, iv{x[0], x[1], 0})
	}
	for _, x := range b {
		all = append(all, iv{x[0], x[1], 1})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].s < all[j].s })
	var holes []float64
	for i := 1; i < len(all); i++ {
		if h := all[i].s - all[i-1].e; all[i].owner != all[i-1].owner && h >= 0 && h < 500000 {
			holes = append(holes, h)
		}
	}
	return holes
}

// writeProfile writes the measured keys as simgpu reads them.
func writeProfile(path string, e *env, keys []profileKey) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# simgpu profile measured by the GPU check's calibration part (%s), %s.\n", e.mode(), time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	b.WriteString("# Use: SIMGPU_MODEL=h200 SIMGPU_PROFILE=<this file> (docs/simgpu.md).\n\n")
	for _, k := range keys {
		v := math.Round(k.value)
		switch {
		case !k.modeled:
			fmt.Fprintf(&b, "# not modeled by simgpu yet:\n# %s = %.0f  # %s\n", k.key, v, k.how)
		case v < k.lo || v > k.hi:
			fmt.Fprintf(&b, "# out of simgpu's bounds (%.0f-%.0f), left out:\n# %s = %.0f  # %s\n", k.lo, k.hi, k.key, v, k.how)
		default:
			fmt.Fprintf(&b, "%s = %.0f  # %s\n", k.key, v, k.how)
		}
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// field is the value of the line "<name> <value>" in out.
func field(out, name string) (float64, bool) {
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) == 2 && f[0] == name {
			v, err := strconv.ParseFloat(f[1], 64)
			return v, err == nil
		}
	}
	return 0, false
}

// medianOf is the median of v; 0 when v is empty.
func medianOf(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
