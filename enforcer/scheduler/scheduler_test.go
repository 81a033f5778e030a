package scheduler_test

import (
	"math"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
	"unsafe"

	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
	"github.com/gpuwarden/gpuwarden/enforcer/policy"
	"github.com/gpuwarden/gpuwarden/enforcer/scheduler"
	"github.com/gpuwarden/gpuwarden/enforcer/scheduler/simrun"
	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

// simgpu's NVML binds one machine per process: every test shares it.
var machineDir string

func TestMain(m *testing.M) {
	d, err := os.MkdirTemp("", "gpuwarden-sched-")
	if err != nil {
		panic(err)
	}
	machineDir = d
	code := m.Run()
	os.RemoveAll(d)
	os.Exit(code)
}

func start(t *testing.T, gs scheduler.GPUSettings) *simrun.Run {
	t.Helper()
	bin := filepath.Dir(simtest.Bin(t, "libgpuwarden.so"))
	simtest.Bin(t, "simgpu/workload")
	r, err := simrun.Start(simrun.Machine{Bin: bin, Dir: machineDir, Devices: 1, Memory: "16Gi"}, scheduler.Config{}, gs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

// busyWork is a workload that keeps the device busy for secs: 8 kernels of 2 ms a step.
func busyWork(secs float64) []string {
	return []string{"--seconds", strconv.FormatFloat(secs, 'f', -1, 64), "--kernels", "8", "--kernel-ns", "2000000"}
}

func spawn(t *testing.T, r *simrun.Run, cs ...simrun.Container) {
	t.Helper()
	for _, c := range cs {
		if err := r.Spawn(c); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Admit(); err != nil {
		t.Fatal(err)
	}
}

// shares measures each container's share of device 0 over a window, after a warm-up.
func shares(t *testing.T, r *simrun.Run, warm, window time.Duration) map[string]float64 {
	t.Helper()
	time.Sleep(warm)
	b0, t0 := r.Busy(), time.Now()
	time.Sleep(window)
	b1, t1 := r.Busy(), time.Now()
	out := map[string]float64{}
	for k, v := range b1 {
		out[k] = float64(v-b0[k]) / float64(t1.Sub(t0))
	}
	t.Logf("shares: %v", out)
	for _, st := range r.Sched.Status() {
		t.Logf("%+v", st)
	}
	return out
}

func within(t *testing.T, what string, v, lo, hi float64) {
	t.Helper()
	if v < lo || v > hi {
		t.Errorf("%s = %.3f, want %.2f-%.2f", what, v, lo, hi)
	}
}

func claims(env ...string) simrun.Container {
	return simrun.Container{Env: env, Settings: scheduler.Settings{FromClaims: true}}
}

func named(c simrun.Container, name string, args []string) simrun.Container {
	c.Name, c.Args = name, args
	return c
}

// TestWeighted: weights 1:2 from the containers' environment put the GPU
// under weighted (no policy set) and split it 1:2.
func TestWeighted(t *testing.T) {
	r := start(t, scheduler.GPUSettings{})
	spawn(t, r, named(claims("GPUWARDEN_COMPUTE_WEIGHT=1"), "a", busyWork(5)),
		named(claims("GPUWARDEN_COMPUTE_WEIGHT=2"), "b", busyWork(5)))
	s := shares(t, r, time.Second, 3*time.Second)
	within(t, "b/a", s["b"]/s["a"], 1.5, 2.6)
	within(t, "a+b", s["a"]+s["b"], 0.4, 1.01)
	charged := map[string]float64{}
	for _, st := range r.Sched.Status() {
		if st.Policy != policy.Weighted {
			t.Errorf("%s: policy %v, want weighted", st.Key, st.Policy)
		}
		want := map[string]float64{"a": 1. / 3, "b": 2. / 3}[st.Key]
		within(t, st.Key+" target", st.Target, want-0.01, want+0.01)
		within(t, st.Key+" achieved", st.Achieved, want*0.4, want*1.4)
		if st.ThrottledSeconds <= 0 {
			t.Errorf("%s: no throttled time", st.Key)
		}
		charged[st.Key] = st.ChargedSeconds
	}
	// The clock's charge, ever, splits as the shares do; each slice's end
	// is a hand-over whose drain a completion mark ended, not the cap.
	within(t, "b/a charged", charged["b"]/charged["a"], 1.5, 2.6)
	gs := r.Sched.GPUs()
	if len(gs) != 1 {
		t.Fatalf("%d GPUs, want 1", len(gs))
	}
	sl := gs[0].Slices
	t.Logf("slices: %+v", sl)
	if sl.Handovers < 20 || sl.DrainsCapped > sl.Handovers/10 || sl.DrainSeconds <= 0 {
		t.Errorf("slices %+v: want 20 or more hand-overs (50 ms slices over 4 s), drains ended by marks", sl)
	}
}

// TestWeightedOnH200Model: weights 1:2 hold on simgpu's H200 model, whose
// NVML per-process utilization is a sample stream (here one sample a
// second, whole percents, one process each) and whose engine time-slices
// between contexts: the scheduler charges device time from its own clock
// and completion marks, not from NVML. Judged by images/s, from the
// workloads' progress.
func TestWeightedOnH200Model(t *testing.T) {
	bin := filepath.Dir(simtest.Bin(t, "libgpuwarden.so"))
	simtest.Bin(t, "simgpu/workload")
	m := simrun.Machine{Bin: bin, Dir: machineDir, Devices: 1, Memory: "16Gi", Model: "h200", SampleMs: 1000}
	r, err := simrun.Start(m, scheduler.Config{}, scheduler.GPUSettings{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	work := append(busyWork(9), "--progress")
	spawn(t, r, named(claims("GPUWARDEN_COMPUTE_WEIGHT=1"), "a", work),
		named(claims("GPUWARDEN_COMPUTE_WEIGHT=2"), "b", work))
	time.Sleep(2 * time.Second)
	t0 := time.Now()
	time.Sleep(6 * time.Second)
	t1 := time.Now()
	for _, st := range r.Sched.Status() {
		t.Logf("%+v", st)
	}
	rates := map[string]float64{}
	for _, n := range []string{"a", "b"} {
		if _, err := r.Wait(n, 30*time.Second); err != nil {
			t.Fatal(err)
		}
		if rates[n], err = r.Rate(n, t0, t1); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("images/s: a %.1f, b %.1f", rates["a"], rates["b"])
	within(t, "b/a images/s", rates["b"]/rates["a"], 1.6, 2.5)
}

// TestShortKernelsAloneKeepTheDevice: a container alone on a gated GPU,
// launching 5 us kernels, uses about what it uses ungated. Its slices are
// never closed (nobody else waits), and its cost per launch must still be
// measured: at the prior estimate (50 us a launch) each tick would release
// a fifth of what the device runs until the next. Each is measured twice,
// in turns, and its better window kept: these launches are all host time,
// and a loaded machine only ever slows a window (one ungated window ran at
// three quarters of the gated one's pace before it).
func TestShortKernelsAloneKeepTheDevice(t *testing.T) {
	r := start(t, scheduler.GPUSettings{Policy: policy.Weighted, PolicySet: true})
	work := []string{"--seconds", "3", "--kernels", "8", "--kernel-ns", "5000", "--progress"}
	rate := map[string]float64{}
	for round := 1; round <= 2; round++ {
		for _, c := range []simrun.Container{named(claims("GPUWARDEN_COMPUTE_WEIGHT=2"), "gated", work),
			{Name: "ungated", Args: work, Ungated: true}} {
			kind := c.Name
			c.Name = kind + strconv.Itoa(round)
			spawn(t, r, c)
			time.Sleep(500 * time.Millisecond)
			t0 := time.Now()
			time.Sleep(2 * time.Second)
			if _, err := r.Wait(c.Name, 30*time.Second); err != nil {
				t.Fatal(err)
			}
			x, err := r.Rate(c.Name, t0, t0.Add(2*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("round %d, %s: %.0f images/s", round, kind, x)
			rate[kind] = max(rate[kind], x)
		}
	}
	within(t, "gated/ungated images/s", rate["gated"]/rate["ungated"], 0.7, 1.3)
}

// TestWeightedIdlePartnerKeepsSlices: a container of weight 2 that holds a
// context but launches nothing keeps its 2 slices.
func TestWeightedIdlePartnerKeepsSlices(t *testing.T) {
	r := start(t, scheduler.GPUSettings{Policy: policy.Weighted, PolicySet: true})
	spawn(t, r, named(claims("GPUWARDEN_COMPUTE_WEIGHT=1"), "a", busyWork(10)),
		named(claims("GPUWARDEN_COMPUTE_WEIGHT=2"), "b", []string{"--hold"}))
	planned(t, r, "a", 1./3)
	s := shares(t, r, time.Second, 2500*time.Millisecond)
	within(t, "a", s["a"], 0.1, 0.45)
}

// planned waits until the scheduler plans key's share at want. An idle
// partner counts once the scheduler has seen the memory it holds, and it
// reads an idle container's ledger only every few rounds: on a loaded
// machine that can be seconds after the partner started.
func planned(t *testing.T, r *simrun.Run, key string, want float64) {
	t.Helper()
	start := time.Now()
	for {
		for _, st := range r.Sched.Status() {
			if st.Key == key && math.Abs(st.Target-want) < 0.01 {
				t.Logf("%s planned at %.3f after %v", key, want, time.Since(start).Round(time.Millisecond))
				return
			}
		}
		if time.Since(start) > 15*time.Second {
			t.Fatalf("%s not planned at %.3f within 15s: %+v", key, want, r.Sched.Status())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestFairShareIdlePartner: 1/max_inst, whether or not the others are busy.
func TestFairShareIdlePartner(t *testing.T) {
	r := start(t, scheduler.GPUSettings{Policy: policy.FairShare, PolicySet: true, MaxInst: 4})
	spawn(t, r, named(claims(), "a", busyWork(4)), named(claims(), "b", []string{"--hold"}))
	s := shares(t, r, time.Second, 2500*time.Millisecond)
	within(t, "a", s["a"], 0.08, 0.33)
}

// TestFairShareDefaultMaxInst: fair-share on a GPU whose max_inst nobody set
// takes the default, the device plugin's 4 slots: each busy container gets
// 25%, and free_weight is what two containers of weight 1 leave of 4.
func TestFairShareDefaultMaxInst(t *testing.T) {
	r := start(t, scheduler.GPUSettings{Policy: policy.FairShare, PolicySet: true})
	spawn(t, r, named(claims(), "a", busyWork(4)), named(claims(), "b", busyWork(4)))
	s := shares(t, r, time.Second, 2500*time.Millisecond)
	within(t, "a", s["a"], 0.17, 0.33)
	within(t, "b", s["b"], 0.17, 0.33)
	gs := r.Sched.GPUs()
	if len(gs) != 1 || gs[0].MaxInst != 4 || gs[0].FreeWeight != 2 || gs[0].Containers != 2 {
		t.Errorf("GPUs() = %+v, want max_inst 4, free_weight 2, 2 containers", gs)
	}
}

// TestPreemptiveIdlePartner: an idle container is skipped.
func TestPreemptiveIdlePartner(t *testing.T) {
	r := start(t, scheduler.GPUSettings{Policy: policy.Preemptive, PolicySet: true})
	spawn(t, r, named(claims(), "a", busyWork(4)), named(claims(), "b", []string{"--hold"}))
	s := shares(t, r, time.Second, 2500*time.Millisecond)
	within(t, "a", s["a"], 0.6, 1.01)
}

// TestFixed: weight/max_inst each, 30% and 70%.
func TestFixed(t *testing.T) {
	r := start(t, scheduler.GPUSettings{Policy: policy.Fixed, PolicySet: true, MaxInst: 10})
	spawn(t, r, named(claims("GPUWARDEN_COMPUTE_WEIGHT=3"), "a", busyWork(4)),
		named(claims("GPUWARDEN_COMPUTE_WEIGHT=7"), "b", busyWork(4)))
	s := shares(t, r, time.Second, 2500*time.Millisecond)
	within(t, "a", s["a"], 0.1, 0.4)
	within(t, "b", s["b"], 0.3, 0.8)
	within(t, "b/a", s["b"]/s["a"], 1.5, 3.6)
}

// TestCap: a 30% cap holds a container that is alone on the device, and
// the share the scheduler reports measuring is what it charged (alone, it
// pays for its tickets outside any slice).
func TestCap(t *testing.T) {
	r := start(t, scheduler.GPUSettings{})
	spawn(t, r, named(claims("GPUWARDEN_COMPUTE_LIMIT=30"), "a", busyWork(4)))
	s := shares(t, r, time.Second, 2500*time.Millisecond)
	within(t, "a", s["a"], 0.1, 0.38)
	for _, st := range r.Sched.Status() {
		within(t, st.Key+" achieved", st.Achieved, 0.1, 0.45)
	}
}

// TestSoftBorrows: under soft a busy container uses what a host-bound
// partner leaves (under preemptive it would be held to half).
func TestSoftBorrows(t *testing.T) {
	r := start(t, scheduler.GPUSettings{Policy: policy.Soft, PolicySet: true})
	spawn(t, r, named(claims(), "a", busyWork(4)),
		named(claims(), "b", []string{"--seconds", "4", "--kernels", "1", "--kernel-ns", "20000", "--sync-every-launch"}))
	s := shares(t, r, time.Second, 2500*time.Millisecond)
	within(t, "a", s["a"], 0.55, 1.01)
}

// TestCapHolds: a 30% cap holds under soft, whether the container is alone
// or beside a busy partner (which borrows what it leaves), and with high
// priority under soft and preemptive.
func TestCapHolds(t *testing.T) {
	for _, tc := range []struct {
		name    string
		p       policy.Policy
		high    bool
		partner bool
	}{
		{"soft alone", policy.Soft, false, false},
		{"soft busy partner", policy.Soft, false, true},
		{"soft high priority busy partner", policy.Soft, true, true},
		{"preemptive high priority busy partner", policy.Preemptive, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := start(t, scheduler.GPUSettings{Policy: tc.p, PolicySet: true})
			env := []string{"GPUWARDEN_COMPUTE_LIMIT=30"}
			if tc.high {
				env = append(env, "GPUWARDEN_PRIORITY=high")
			}
			cs := []simrun.Container{named(claims(env...), "a", busyWork(4))}
			if tc.partner {
				cs = append(cs, named(claims(), "b", busyWork(4)))
			}
			spawn(t, r, cs...)
			s := shares(t, r, time.Second, 2500*time.Millisecond)
			within(t, "a", s["a"], 0.1, 0.42)
			if tc.partner {
				within(t, "b", s["b"], 0.45, 1.01)
			}
		})
	}
}

// TestHighPriority: while a high-priority container is busy the other gets
// only what it leaves.
func TestHighPriority(t *testing.T) {
	r := start(t, scheduler.GPUSettings{})
	spawn(t, r, named(claims("GPUWARDEN_PRIORITY=high"), "a", busyWork(4)), named(claims(), "b", busyWork(4)))
	s := shares(t, r, time.Second, 2500*time.Millisecond)
	// Relative: on a loaded 2-core machine the loop itself may be starved.
	within(t, "a", s["a"], 0.3, 1.01)
	within(t, "b/(a+b)", s["b"]/(s["a"]+s["b"]), 0, 0.2)
}

// TestHotChange: a new weight takes effect while the workloads run.
func TestHotChange(t *testing.T) {
	r := start(t, scheduler.GPUSettings{Policy: policy.Weighted, PolicySet: true})
	spawn(t, r, named(simrun.Container{Settings: scheduler.Settings{Weight: 1}}, "a", busyWork(6)),
		named(simrun.Container{Settings: scheduler.Settings{Weight: 1}}, "b", busyWork(6)))
	s := shares(t, r, 800*time.Millisecond, 1500*time.Millisecond)
	within(t, "b/a at 1:1", s["b"]/s["a"], 0.7, 1.4)
	if err := r.Sched.SetContainer("b", scheduler.Settings{Weight: 3}); err != nil {
		t.Fatal(err)
	}
	s = shares(t, r, 500*time.Millisecond, 2500*time.Millisecond)
	within(t, "b/a at 1:3", s["b"]/s["a"], 2.0, 5.5)
	if err := r.Sched.SetContainer("nope", scheduler.Settings{Weight: 3}); err == nil {
		t.Error("unknown container accepted")
	}
	if err := r.Sched.SetContainer("b", scheduler.Settings{Weight: 1001}); err == nil {
		t.Error("weight 1001 accepted")
	}
}

// TestNativeAndStop: native lifts the gate; Stop lifts every gate and the
// workloads go on.
func TestNativeAndStop(t *testing.T) {
	r := start(t, scheduler.GPUSettings{})
	spawn(t, r, named(claims(), "a", busyWork(4)), named(claims(), "b", busyWork(4)))
	time.Sleep(300 * time.Millisecond)
	if m := r.Limits("a").Config().GateMask; m != 1 {
		t.Fatalf("gate mask %d under preemptive, want 1", m)
	}
	if err := r.Sched.SetGPU(r.GPU0(), scheduler.GPUSettings{Policy: policy.Native, PolicySet: true}); err != nil {
		t.Fatal(err)
	}
	if m := r.Limits("a").Config().GateMask; m != 0 {
		t.Fatalf("gate mask %d under native, want 0", m)
	}
	s := shares(t, r, 300*time.Millisecond, time.Second)
	within(t, "a+b ungated", s["a"]+s["b"], 0.6, 1.01)
	if err := r.Sched.SetGPU(r.GPU0(), scheduler.GPUSettings{Policy: policy.Preemptive, PolicySet: true}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if m := r.Limits("b").Config().GateMask; m != 1 {
		t.Fatalf("gate mask %d back under preemptive, want 1", m)
	}
	r.Sched.Stop()
	for _, n := range []string{"a", "b"} {
		if m := r.Limits(n).Config().GateMask; m != 0 {
			t.Errorf("%s: gate mask %d after Stop, want 0", n, m)
		}
	}
	s = shares(t, r, 200*time.Millisecond, 800*time.Millisecond)
	within(t, "a+b after Stop", s["a"]+s["b"], 0.6, 1.01)
}

// TestWakesAmongManyIdle: on a GPU shared by more containers than the
// scheduler looks at every tick, one that wakes up after idling is noticed
// and given the device it alone uses.
func TestWakesAmongManyIdle(t *testing.T) {
	r := start(t, scheduler.GPUSettings{Policy: policy.Preemptive, PolicySet: true})
	spawn(t, r, simrun.Container{Name: "a", Args: append([]string{"--start-after", "1"}, busyWork(3)...),
		Settings: scheduler.Settings{Weight: 1}})
	if err := r.AddIdle("a", 300); err != nil {
		t.Fatal(err)
	}
	res, err := r.Wait("a", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// Alone on the device it gets most of it; a container never noticed
	// would not finish at all. The floor leaves room for a loaded 2-core
	// machine, where runs gave 0.77-0.93.
	within(t, "a's device busy ratio", res["device_busy_ratio"], 0.6, 1.01)
	for _, st := range r.Sched.Status() {
		if st.Key == "a" && st.Launches == 0 {
			t.Errorf("a took no tickets: %+v", st)
		}
	}
}

// TestRewoundTicketsBuyNothing: a container that writes 0 over its ledger's
// launches_issued may run its launches up to its grant unthrottled, but the
// device time they take is measured and charged: over the next seconds it
// gets no more than its share (a launch that waited at the gate with its old
// ticket waits on: it may get less), its partner keeps its own, and the
// scheduler counts the rewind.
func TestRewoundTicketsBuyNothing(t *testing.T) {
	r := start(t, scheduler.GPUSettings{})
	spawn(t, r, named(claims("GPUWARDEN_COMPUTE_WEIGHT=1"), "a", busyWork(14)),
		named(claims("GPUWARDEN_COMPUTE_WEIGHT=2"), "b", busyWork(14)))
	time.Sleep(3 * time.Second) // tickets, and so the grant, grow
	f, err := os.OpenFile(r.UsagePath("a"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	var u controlblock.Usage
	if _, err := f.WriteAt(make([]byte, 8), int64(unsafe.Offsetof(u.LaunchesIssued))); err != nil {
		t.Fatal(err)
	}
	f.Close()
	s := shares(t, r, 0, 8*time.Second)
	within(t, "a (weight 1 of 1:2, rewound)", s["a"], 0, 0.42)
	within(t, "b (weight 2 of 1:2)", s["b"], 0.5, 1.01)
	for _, st := range r.Sched.Status() {
		if st.Key == "a" && st.Rewinds == 0 {
			t.Errorf("the scheduler did not count a's rewind: %+v", st)
		}
	}
}
