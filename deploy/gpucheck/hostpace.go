package gpucheck

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// hostTiming is the host-pace row's schedule: intervals of interval each,
// the roles swapped between one and the next and the way of waiting every
// other two, then continuous without sleeping.
type hostTiming struct {
	intervals            int
	interval, continuous time.Duration
}

// hostSpin is how long before its slices a process spins in the row's
// spinning intervals.
const hostSpin = 2 * time.Millisecond

// hostTiming spends about 10 s (simulated) or 32 s on the roles, in
// intervals of a second, or of two rounds of slices (six) where slices are
// longer than a sixth of a second, and at least eight intervals, so that
// each process runs each role both ways twice.
func (e *env) hostTiming(slice time.Duration) hostTiming {
	tm := hostTiming{intervals: 32, interval: time.Second, continuous: 4 * time.Second}
	if e.o.Simulate {
		tm = hostTiming{intervals: 8, interval: time.Second, continuous: 2 * time.Second}
	}
	if long := 6 * slice; long > tm.interval {
		tm.intervals = max(8, int(time.Duration(tm.intervals)*tm.interval/long)/4*4)
		tm.interval = long
	}
	return tm
}

// hostPaces is one hostpace.py process's work per slice ms in each role
// and way of waiting ("small sleep", "large spin", "continuous sleep"),
// pooled over its intervals, and each interval's in order.
type hostPaces struct {
	pooled    map[string]float64
	intervals []hostInterval
}

type hostInterval struct {
	role, wait string
	pace       float64
}

// hostRoles are the roles and ways of waiting hostpace.py runs.
var hostRoles = []string{"small sleep", "large sleep", "small spin", "large spin", "continuous sleep"}

// parseHostPace reads hostpace.py's "interval <k> <role> <sleep|spin>
// <units> <ms>" lines.
func parseHostPace(out []byte) (hostPaces, error) {
	hp := hostPaces{pooled: map[string]float64{}}
	units, ms := map[string]float64{}, map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 6 || f[0] != "interval" {
			continue
		}
		u, err1 := strconv.ParseFloat(f[4], 64)
		m, err2 := strconv.ParseFloat(f[5], 64)
		if err1 != nil || err2 != nil || m <= 0 {
			return hp, fmt.Errorf("hostpace.py: bad line %q", sc.Text())
		}
		key := f[2] + " " + f[3]
		units[key] += u
		ms[key] += m
		hp.intervals = append(hp.intervals, hostInterval{f[2], f[3], u / m})
	}
	for _, key := range hostRoles {
		if ms[key] <= 0 || units[key] <= 0 {
			return hp, fmt.Errorf("hostpace.py did no work as %s: %q", key, tailText(string(out), 400))
		}
		hp.pooled[key] = units[key] / ms[key]
	}
	return hp, nil
}

// largeOverSmall is the larger role's pace over the smaller's in each pair
// of intervals (the first and second, the third and fourth...) that waited
// as wait: neighbours, so that a drift of the host's pace over the row
// cancels.
func (hp hostPaces) largeOverSmall(wait string) []float64 {
	var out []float64
	for i := 0; i+1 < len(hp.intervals); i += 2 {
		x, y := hp.intervals[i], hp.intervals[i+1]
		if x.wait != wait || y.wait != wait {
			continue
		}
		if x.role == "large" && y.role == "small" {
			out = append(out, x.pace/y.pace)
		} else if x.role == "small" && y.role == "large" {
			out = append(out, y.pace/x.pace)
		}
	}
	return out
}

// checkHostPace is part 4's first row, on the host alone: two Python
// processes pinned as the trainers are, in the duty cycles of weights 1:2
// at the agent's slice (one slice in three, two in three), each taking both
// roles in turn. A host that runs a process slower after a longer sleep
// (CPU idle states, frequency, caches) makes the smaller share's training do
// less per second of its slices, which images/s would charge to the
// scheduler; this row measures that apart from any GPU.
func (e *env) checkHostPace(ctx context.Context, r *Result, slice time.Duration) {
	const row = "host_pace"
	tm := e.hostTiming(slice)
	spin := min(hostSpin, slice)
	script := e.bundlePath("src", "hostpace.py")
	start := time.Now().Add(2 * time.Second) // both interpreters up
	total := time.Until(start) + time.Duration(tm.intervals)*tm.interval + tm.continuous
	ctx, cancel := context.WithTimeout(ctx, total+30*time.Second)
	defer cancel()
	type result struct {
		out []byte
		err error
	}
	done := make([]chan result, 2)
	for i := range done {
		argv := []string{e.python(), script, "--slice-ms", strconv.FormatFloat(float64(slice)/1e6, 'f', 3, 64),
			"--start", strconv.FormatFloat(float64(start.UnixNano())/1e9, 'f', 3, 64), "--intervals", strconv.Itoa(tm.intervals),
			"--interval-s", strconv.FormatFloat(tm.interval.Seconds(), 'f', 3, 64), "--continuous-s", strconv.FormatFloat(tm.continuous.Seconds(), 'f', 3, 64),
			"--spin-ms", strconv.FormatFloat(float64(spin)/1e6, 'f', 3, 64)}
		if i == 1 {
			argv = append(argv, "--second")
		}
		if cpus := trainerCPUs(i); cpus != "" {
			argv = append([]string{"taskset", "-c", cpus}, argv...)
		}
		cmd := e.command(ctx, e.baseEnv(), argv[0], argv[1:]...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		done[i] = make(chan result, 1)
		go func() {
			out, err := cmd.Output()
			if err != nil {
				err = fmt.Errorf("%v: %s", err, tailText(stderr.String(), 400))
			}
			done[i] <- result{out, err}
		}()
	}
	var paces [2]hostPaces
	for i := range done {
		res := <-done[i]
		if res.err != nil {
			r.Fail(row, "process %c: %v", 'a'+i, res.err)
			return
		}
		var err error
		if paces[i], err = parseHostPace(res.out); err != nil {
			r.Fail(row, "process %c: %v", 'a'+i, err)
			return
		}
	}
	// Each process against itself: two processes doing the same work
	// differ in pace (by up to a fifth on a loaded machine), a role's cost
	// does not.
	var sleeping, spinning, smallOverCont, largeOverCont []float64
	for _, hp := range paces {
		sleeping = append(sleeping, hp.largeOverSmall("sleep")...)
		spinning = append(spinning, hp.largeOverSmall("spin")...)
		smallOverCont = append(smallOverCont, hp.pooled["small sleep"]/hp.pooled["continuous sleep"])
		largeOverCont = append(largeOverCont, hp.pooled["large sleep"]/hp.pooled["continuous sleep"])
	}
	aOverB := paces[0].pooled["continuous sleep"] / paces[1].pooled["continuous sleep"]
	p := "shares_" + row
	r.Bench(p+"_slice_ms", float64(slice)/1e6, "ms")
	r.Bench(p+"_large_over_small", meanOf(sleeping), "ratio")
	r.Bench(p+"_large_over_small_se", seOf(sleeping), "ratio")
	r.Bench(p+"_large_over_small_spinning", meanOf(spinning), "ratio")
	r.Bench(p+"_large_over_small_spinning_se", seOf(spinning), "ratio")
	r.Bench(p+"_small_over_continuous", meanOf(smallOverCont), "ratio")
	r.Bench(p+"_large_over_continuous", meanOf(largeOverCont), "ratio")
	r.Bench(p+"_pair_sd", sdOf(sleeping), "ratio")
	r.Bench(p+"_a_over_b_continuous", aOverB, "ratio")
	r.Pass(row, "Python work at the duty cycles of weights 1:2 with %s slices, no GPU, roles swapped every %s: as the larger share "+
		"(two slices in three) %.3f ± %.3f (standard error; %d pairs of intervals, sd %.3f) as fast per second of its slices as the smaller "+
		"(one in three), and %.3f ± %.3f where each spun the last %s before its slices instead of sleeping; the smaller %.3f and the larger "+
		"%.3f as fast as running without sleeping; process a ran %.3f as fast as b",
		slice, tm.interval, meanOf(sleeping), seOf(sleeping), len(sleeping), sdOf(sleeping), meanOf(spinning), seOf(spinning), spin,
		meanOf(smallOverCont), meanOf(largeOverCont), aOverB)
}
