package simgpu_test

import (
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

// Under SIMGPU_MODEL=h200, per-process utilization is NVIDIA's sample stream:
// one sample a period, each the engine's busy percent in whole percents,
// credited to the one process on the engine at the sample's instant.
func TestNVMLSampledUtilization(t *testing.T) {
	const periodMs = 100
	path := nvmlLibrary(t)
	nvmlOnce.Do(func() { nvmlLib = nvml.New(nvml.WithLibraryPath(path)) })
	t.Setenv("SIMGPU_MODEL", "h100")
	if ret := nvmlLib.Init(); ret != nvml.ERROR_DRIVER_NOT_LOADED {
		nvmlLib.Shutdown()
		t.Fatalf("nvml.Init with SIMGPU_MODEL=h100 = %v, want ERROR_DRIVER_NOT_LOADED", ret)
	}
	// The workloads inherit the model from this process's environment.
	t.Setenv("SIMGPU_MODEL", "h200")
	t.Setenv("SIMGPU_NVML_SAMPLE_MS", "100")
	lib := initNVML(t)
	dev1 := device(t, lib, 1)

	a := startUser(t, 1, 64<<20, true)
	b := startUser(t, 1, 64<<20, true)
	time.Sleep(300 * time.Millisecond)

	// Read as the scheduler does, each time from the newest sample seen, for
	// about 20 periods.
	owner := map[uint64]uint32{} // sample instant -> the process credited
	start := time.Now()
	last := uint64(start.UnixMicro())
	for end := time.Now().Add(20 * periodMs * time.Millisecond); time.Now().Before(end); {
		time.Sleep(30 * time.Millisecond)
		samples, ret := dev1.GetProcessUtilization(last)
		if ret == nvml.ERROR_NOT_FOUND {
			continue
		}
		if ret != nvml.SUCCESS {
			t.Fatalf("GetProcessUtilization: %v", ret)
		}
		newest := last
		for _, s := range samples {
			if s.TimeStamp <= last {
				t.Errorf("pid %d: sample at %d is not after lastSeenTimeStamp %d", s.Pid, s.TimeStamp, last)
			}
			if s.TimeStamp%(periodMs*1000) != 0 {
				t.Errorf("pid %d: sample at %d is not on a %d ms period", s.Pid, s.TimeStamp, periodMs)
			}
			// Both keep the engine busy: each period is nearly all busy.
			if s.SmUtil < 50 || s.SmUtil > 100 {
				t.Errorf("pid %d: SmUtil %d%%, want the engine's busy percent (50-100)", s.Pid, s.SmUtil)
			}
			if p, seen := owner[s.TimeStamp]; seen && p != s.Pid {
				t.Errorf("the sample at %d is credited to pids %d and %d, want one", s.TimeStamp, p, s.Pid)
			}
			owner[s.TimeStamp] = s.Pid
			newest = max(newest, s.TimeStamp)
		}
		last = newest
	}
	periods := int(time.Since(start) / (periodMs * time.Millisecond))
	credited := map[uint32]int{}
	for _, pid := range owner {
		credited[pid]++
	}
	t.Logf("%d samples in %d periods: %v", len(owner), periods, credited)
	// At most one an instant; wide bounds below, for a loaded 2-core machine.
	if len(owner) < periods/2 || len(owner) > periods+1 {
		t.Errorf("%d samples over %d periods of %d ms, want %d-%d", len(owner), periods, periodMs, periods/2, periods+1)
	}
	for _, p := range []int{a.Cmd.Process.Pid, b.Cmd.Process.Pid} {
		if credited[uint32(p)] == 0 {
			t.Errorf("pid %d shared the engine but no sample credits it: %v", p, credited)
		}
	}

	// lastSeenTimeStamp 0 reads the whole buffer: one entry per process, its latest sample.
	samples, ret := dev1.GetProcessUtilization(0)
	if ret != nvml.SUCCESS {
		t.Fatalf("GetProcessUtilization(0): %v", ret)
	}
	seen := map[uint32]bool{}
	for _, s := range samples {
		if seen[s.Pid] {
			t.Errorf("pid %d has two entries: %+v", s.Pid, samples)
		}
		seen[s.Pid] = true
	}
	kill(t, a)
	kill(t, b)
}

// Under SIMGPU_MODEL=h200 the engine time-slices between contexts as a GPU
// does: a kernel longer than a slice (2.09 ms) is preempted when another
// process waits, so a process syncing on short kernels beside one running
// 20 ms kernels waits about a slice for each, not a whole 20 ms kernel.
func TestModelPreemptsLongKernels(t *testing.T) {
	exact, h200 := shortBesideLong(t, "SIMGPU_MODEL="), shortBesideLong(t, "SIMGPU_MODEL=h200")
	t.Logf("short kernels beside 20 ms ones: %.0f steps/s exact, %.0f under h200", exact, h200)
	// A 20 ms wait a step allows at most 50 steps/s; a slice's, hundreds.
	// Wide bounds: this must hold on a loaded 2-core machine.
	if h200 < 3*exact {
		t.Errorf("under h200 the short kernels ran %.0f steps/s, want at least 3x the exact model's %.0f", h200, exact)
	}
}

// shortBesideLong runs a process syncing on 100 µs kernels beside one running
// 20 ms kernels, eight a step so that its next is always queued (the
// engine idles, in device time, while a process's host catches up after a
// sync, and the short one would run in those gaps), both with env, and
// returns the short one's steps/s.
func shortBesideLong(t *testing.T, env ...string) float64 {
	t.Helper()
	workload := simtest.Bin(t, "simgpu/workload")
	m := simtest.NewMachine(t, 1, "16Gi")
	long := m.Command(workload, "--label", "long", "--seconds", "3", "--kernels", "8", "--kernel-ns", "20000000")
	short := m.Command(workload, "--label", "short", "--seconds", "2", "--start-after", "0.5", "--kernels", "1",
		"--kernel-ns", "100000", "--sync-every-launch")
	for _, c := range []*exec.Cmd{long, short} {
		c.Env = append(c.Env, env...)
	}
	a, b := simtest.Start(t, long), simtest.Start(t, short)
	out, err := b.Wait()
	if err != nil {
		t.Fatalf("short workload: %v: %s", err, b.Stderr())
	}
	if _, err := a.Wait(); err != nil {
		t.Fatalf("long workload: %v: %s", err, a.Stderr())
	}
	mm := regexp.MustCompile(`BENCH short_steps_per_sec ([0-9.]+)`).FindStringSubmatch(out)
	if mm == nil {
		t.Fatalf("no rate in %q", out)
	}
	v, _ := strconv.ParseFloat(mm[1], 64)
	return v
}

// Under SIMGPU_MODEL=h200 a synchronize polls, as NVIDIA's driver does by
// default (CU_CTX_SCHED_AUTO with fewer contexts than cores: spin), so the
// waiting thread does not sleep; a context made with
// CU_CTX_SCHED_BLOCKING_SYNC sleeps, and so does every synchronize without
// the model. gw-remote's wait mode prints, for each of five synchronizes of a
// 5 ms kernel, the waiting thread's voluntary context switches.
func TestSynchronizePollsUnderH200(t *testing.T) {
	prog := simtest.Bin(t, "interposer/gw-remote")
	for _, c := range []struct {
		model, flags string
		polls        bool
	}{{"h200", "0", runtime.NumCPU() > 1}, {"h200", "4", false}, {"", "0", false}} {
		m := simtest.NewMachine(t, 1, "1Gi")
		cmd := m.Command(prog, "wait", c.flags, "5")
		cmd.Env = append(cmd.Env, "SIMGPU_MODEL="+c.model)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("model %q, flags %s: %v\n%s", c.model, c.flags, err, out)
		}
		waits := regexp.MustCompile(`sleeps (\d+)`).FindAllStringSubmatch(string(out), -1)
		if len(waits) != 5 {
			t.Fatalf("model %q, flags %s: want five waits in %q", c.model, c.flags, out)
		}
		slept := 0
		for _, w := range waits {
			if w[1] != "0" {
				slept++
			}
		}
		// One wait may sleep where the host stalled the engine's thread
		// past the poll's limit; a sleeping wait always sleeps.
		if c.polls && slept > 1 || !c.polls && slept < 5 {
			t.Errorf("model %q, flags %s: %d of 5 synchronizes slept, want %s (%q)", c.model, c.flags, slept,
				map[bool]string{true: "at most 1", false: "all"}[c.polls], out)
		}
	}
}

// Kernels run in device time: back to back, whatever the host does. A
// simulated kernel's thread wakes late when the host is busy; without device
// time each such wake lengthened the kernel, so the device's throughput
// followed the host's load. Here two threads spin on the CPUs while ten 1 ms
// kernels a step run between two events: the step still takes 10 ms of
// device time. Both models.
func TestKernelsRunInDeviceTime(t *testing.T) {
	workload := simtest.Bin(t, "simgpu/workload")
	stop := make(chan struct{})
	var hogs sync.WaitGroup
	for i := 0; i < 2; i++ {
		hogs.Add(1)
		go func() {
			defer hogs.Done()
			for x := 0; ; x++ {
				if x%1024 == 0 {
					select {
					case <-stop:
						return
					default:
					}
				}
			}
		}()
	}
	defer func() { close(stop); hogs.Wait() }()
	for _, model := range []string{"", "h200"} {
		m := simtest.NewMachine(t, 1, "16Gi")
		c := m.Command(workload, "--seconds", "2", "--kernels", "10", "--kernel-ns", "1000000", "--batch", "1", "--progress")
		c.Env = append(c.Env, "SIMGPU_MODEL="+model)
		out, err := simtest.Start(t, c).Wait()
		if err != nil {
			t.Fatalf("model %q: %v", model, err)
		}
		last := regexp.MustCompile(`progress \S+ (\d+) ([0-9.]+)\n`).FindAllStringSubmatch(out, -1)
		if len(last) == 0 {
			t.Fatalf("model %q: no progress in %q", model, out)
		}
		steps, _ := strconv.ParseFloat(last[len(last)-1][1], 64)
		ms, _ := strconv.ParseFloat(last[len(last)-1][2], 64)
		t.Logf("model %q: %.0f steps, %.3f ms of device time a step", model, steps, ms/steps)
		// at least the kernels' 10 ms; above it only by the host's time
		// between the first event and the first launch (a preemption by
		// the spinning threads there is seldom, and averaged over the run)
		if per := ms / steps; per < 9.99 || per > 10.3 {
			t.Errorf("model %q: a step of ten 1 ms kernels took %.3f ms of device time, want 10", model, per)
		}
	}
}
