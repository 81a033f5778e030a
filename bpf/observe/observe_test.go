package observe

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpuwarden/gpuwarden/bpf/internal/bpftest"
	"github.com/gpuwarden/gpuwarden/bpf/libcuda"
	"github.com/gpuwarden/gpuwarden/bpf/probes"
	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

// testConfig observes simgpu's libcuda with a pin directory of the test's
// own. Launch probes are off: other packages' tests time launches on the same
// library at the same time; the launch tests attach them to a private copy.
func testConfig(t *testing.T) Config {
	c := DefaultConfig()
	c.PinDir = bpftest.PinDir(t)
	c.Libraries = []string{simtest.Bin(t, "simgpu/libcuda.so.1")}
	c.LdconfigSoname = ""
	c.ScanInterval = 200 * time.Millisecond
	c.LaunchWindow = 0
	c.GCInterval = time.Second
	c.Logger = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	return c
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

func start(t *testing.T, c Config) *Observer {
	t.Helper()
	o, err := Start(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { o.Close() })
	return o
}

func snapshot(t *testing.T, o *Observer) Snapshot {
	t.Helper()
	s, err := o.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// waitFor polls cond until it holds, failing with what it last said.
func waitFor(t *testing.T, timeout time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", timeout, why)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func cudaAlloc(t *testing.T, m *simtest.Machine, cg *simtest.Cgroup) *simtest.AllocProg {
	return simtest.StartAllocProg(t, cg.Place(m.Command(simtest.Bin(t, "bpf/cuda-alloc"))))
}

type want struct {
	bytes                 int64
	allocs, frees, failed uint64
	created, destroyed    uint64
}

func check(t *testing.T, s Snapshot, what string, cg uint64, dev int, w want) {
	t.Helper()
	u := s.Find(cg, dev)
	got := want{u.Bytes, u.Allocs, u.Frees, u.AllocFailures, u.ContextsCreated, u.ContextsDestroyed}
	if got != w {
		t.Errorf("%s (cgroup %d, device %d): got %+v, want %+v", what, cg, dev, got, w)
	}
}

// Two containers allocate different amounts through every allocation path,
// on two devices; the view is exact to the byte, per cgroup and device, and
// frees (one from another thread) are charged to the owner.
func TestTwoCgroupsEveryPathExact(t *testing.T) {
	o := start(t, testConfig(t))
	m := simtest.NewMachine(t, 2, "4Gi")
	a, b := simtest.NewCgroup(t, "a"), simtest.NewCgroup(t, "b")

	// a: device 0 through its primary context, then device 1.
	pa := cudaAlloc(t, m, a)
	pa.Do(t, "ctx 0")
	linear := pa.Do(t, "alloc linear 1000003")[0]
	pitchReply := pa.Do(t, "pitch 1000 37")
	pitch, _ := strconv.ParseInt(pitchReply[1], 10, 64)
	managed := pa.Do(t, "alloc managed 5555")[0]
	pa.Do(t, "ctx 1")
	async := pa.Do(t, "alloc async 7777")[0]
	vmm := pa.Do(t, "alloc vmm 2097152 1")[0]
	pa.Do(t, "alloc pool 4444 1")
	pa.Do(t, "alloc vmmhost 2097152") // host memory: not the GPU's

	// b: a context of its own on device 1; a pool of device 0 from there.
	pb := cudaAlloc(t, m, b)
	pb.Do(t, "ctxnew 1")
	pb.Do(t, "alloc async_ptsz 123457")
	pb.Do(t, "alloc pool_ptsz 99 0")
	pb.Do(t, "alloc vmm 4194304 0")

	s := snapshot(t, o)
	check(t, s, "a", a.ID, 0, want{bytes: 1000003 + pitch*37 + 5555, allocs: 3, created: 1})
	check(t, s, "a", a.ID, 1, want{bytes: 7777 + 2097152 + 4444, allocs: 3, created: 1})
	check(t, s, "b", b.ID, 1, want{bytes: 123457, allocs: 1, created: 1})
	check(t, s, "b", b.ID, 0, want{bytes: 99 + 4194304, allocs: 2})
	if pitch < 1000 {
		t.Errorf("pitch %d below the width", pitch)
	}

	// Frees, one of them from another thread, and a context destroyed.
	pa.Do(t, "freethread %s", linear)
	pa.Do(t, "free %s", managed)
	pa.Do(t, "free %s", async)
	pa.Do(t, "free %s", vmm)
	pb.Do(t, "ctxdestroy")
	s = snapshot(t, o)
	check(t, s, "a after frees", a.ID, 0, want{bytes: pitch * 37, allocs: 3, frees: 2, created: 1})
	check(t, s, "a after frees", a.ID, 1, want{bytes: 4444, allocs: 3, frees: 2, created: 1})
	// A destroyed context's allocations go with it (its pool allocation on
	// device 0 too), not its VMM handle.
	check(t, s, "b after destroy", b.ID, 1, want{allocs: 1, frees: 1, created: 1, destroyed: 1})
	check(t, s, "b after destroy", b.ID, 0, want{bytes: 4194304, allocs: 2, frees: 1})

	// Both exit: everything they held leaves the view.
	pa.Quit(t)
	pb.Quit(t)
	s = snapshot(t, o)
	for _, u := range s.Usage {
		if (u.Cgroup == a.ID || u.Cgroup == b.ID) && u.Bytes != 0 {
			t.Errorf("after exit: cgroup %d device %d still holds %d bytes", u.Cgroup, u.Device, u.Bytes)
		}
	}
	if s.Probes.Events == 0 || s.Probes.Exits < 2 {
		t.Errorf("probe stats %+v: want events and 2 exits", s.Probes)
	}
}

// A SIGKILLed process's bytes leave the view; the table entries go with the
// next garbage collection.
func TestKilledProcessLeavesView(t *testing.T) {
	o := start(t, testConfig(t))
	m := simtest.NewMachine(t, 1, "4Gi")
	cg := simtest.NewCgroup(t, "killed")
	p := cudaAlloc(t, m, cg)
	p.Do(t, "ctx 0")
	p.Do(t, "alloc linear 33554432")
	p.Do(t, "alloc async 1048576")
	check(t, snapshot(t, o), "before kill", cg.ID, 0, want{bytes: 33554432 + 1048576, allocs: 2, created: 1})

	p.P.Cmd.Process.Kill()
	p.P.Wait()
	s := snapshot(t, o)
	check(t, s, "after kill", cg.ID, 0, want{allocs: 2, created: 1, destroyed: 1})
	if got := s.Find(cg.ID, 0).ExitFreedBytes; got != 33554432+1048576 {
		t.Errorf("bytes given back at exit = %d, want %d", got, 33554432+1048576)
	}
	pid := uint32(p.P.Cmd.Process.Pid)
	waitFor(t, 10*time.Second, func() (bool, string) {
		n, err := o.Probes().TrackedAllocations(pid)
		return err == nil && n == 0, fmt.Sprintf("%d allocation entries of pid %d left (%v)", n, pid, err)
	})
}

// A copy of libcuda at another path (a container bringing its own) is found
// by the /proc scan and attached within a couple of seconds, and observed
// exactly; it is detached once no process maps it.
func TestCopyOfLibcudaFound(t *testing.T) {
	o := start(t, testConfig(t))
	dir := privateCopy(t)
	id, err := libcuda.Identify(filepath.Join(dir, "libcuda.so.1"))
	if err != nil {
		t.Fatal(err)
	}
	m := simtest.NewMachine(t, 1, "4Gi")
	cg := simtest.NewCgroup(t, "copy")
	began := time.Now()
	p := simtest.StartAllocProg(t, cg.Place(m.Command(filepath.Join(dir, "cuda-alloc"))))
	waitFor(t, 5*time.Second, func() (bool, string) {
		return attachedTo(o, id), fmt.Sprintf("libraries %+v lack %s", o.Libraries(), id)
	})
	t.Logf("copy attached %v after the process started", time.Since(began).Round(time.Millisecond))

	p.Do(t, "ctx 0")
	p.Do(t, "alloc linear 424242")
	check(t, snapshot(t, o), "through the copy", cg.ID, 0, want{bytes: 424242, allocs: 1, created: 1})
	p.Quit(t)
	waitFor(t, 10*time.Second, func() (bool, string) {
		return !attachedTo(o, id), "the copy is still attached after its last process exited"
	})
}

func attachedTo(o *Observer, id libcuda.FileID) bool {
	for _, l := range o.Libraries() {
		if l.File == id {
			return true
		}
	}
	return false
}

// privateCopy copies libcuda and cuda-alloc (which finds the library beside
// itself) to a directory of the test's own.
func privateCopy(t *testing.T) string {
	dir := t.TempDir()
	for _, f := range []string{"simgpu/libcuda.so.1", "bpf/cuda-alloc"} {
		copyFile(t, simtest.Bin(t, f), filepath.Join(dir, filepath.Base(f)))
	}
	return dir
}

// launchConfig observes only a private copy, so launch probes slow no other test.
func launchConfig(t *testing.T, window, period time.Duration) (Config, string) {
	dir := privateCopy(t)
	c := testConfig(t)
	c.Libraries = []string{filepath.Join(dir, "libcuda.so.1")}
	c.ScanInterval = 0
	c.LaunchWindow, c.LaunchPeriod = window, period
	return c, filepath.Join(dir, "cuda-alloc")
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// An agent restart keeps the pinned state: bytes held, the pointer table (a
// free after the restart is charged to its owner), and a process that died
// while no agent ran leaves the view when the next one starts.
func TestRestartKeepsPinnedState(t *testing.T) {
	c := testConfig(t)
	o1, err := Start(c)
	if err != nil {
		t.Fatal(err)
	}
	m := simtest.NewMachine(t, 1, "4Gi")
	cg := simtest.NewCgroup(t, "restart")
	p := cudaAlloc(t, m, cg)
	p.Do(t, "ctx 0")
	kept := p.Do(t, "alloc linear 1048576")[0]
	p.Do(t, "alloc managed 4096")
	dies := cudaAlloc(t, m, cg)
	dies.Do(t, "ctx 0")
	dies.Do(t, "alloc linear 65536")
	check(t, snapshot(t, o1), "before restart", cg.ID, 0, want{bytes: 1048576 + 4096 + 65536, allocs: 3, created: 2})
	if err := o1.Close(); err != nil {
		t.Fatal(err)
	}

	// While no agent runs, one process dies.
	dies.P.Cmd.Process.Kill()
	dies.P.Wait()

	o2 := start(t, c)
	check(t, snapshot(t, o2), "after restart", cg.ID, 0, want{bytes: 1048576 + 4096, allocs: 3, created: 2, destroyed: 1})
	p.Do(t, "free %s", kept)
	check(t, snapshot(t, o2), "freed after restart", cg.ID, 0, want{bytes: 4096, allocs: 3, frees: 1, created: 2, destroyed: 1})
	p.Quit(t)
}

// A failed allocation arrives as an event with its CUDA error code.
func TestFailedAllocationEvent(t *testing.T) {
	o := start(t, testConfig(t))
	m := simtest.NewMachine(t, 2, "1Gi")
	cg := simtest.NewCgroup(t, "oom")
	p := cudaAlloc(t, m, cg)
	p.Do(t, "ctx 1")
	if reply := p.Try(t, "alloc linear %d", int64(2)<<30); strings.Join(reply, " ") != "err 2" {
		t.Fatalf("allocating 2 GiB of 1 GiB: %v, want err 2", reply)
	}
	// Other processes on simgpu (other packages' tests) may fail too: take ours.
	deadline := time.After(10 * time.Second)
	for found := false; !found; {
		select {
		case ev := <-o.FailedAllocs():
			if ev.Cgroup != cg.ID {
				continue
			}
			found = true
			if ev.Device != 1 || ev.Bytes != 2<<30 || ev.Result != 2 || ev.PID != uint32(p.P.Cmd.Process.Pid) ||
				ev.API != "cuMemAlloc_v2" || ev.Comm != "cuda-alloc" {
				t.Errorf("event %+v: want device 1, 2 GiB, result 2, pid %d, cuMemAlloc_v2, cuda-alloc",
					ev, p.P.Cmd.Process.Pid)
			}
		case <-deadline:
			t.Fatalf("no failed-allocation event of cgroup %d within 10s", cg.ID)
		}
	}
	check(t, snapshot(t, o), "after failure", cg.ID, 1, want{failed: 1, created: 1})
	p.Quit(t)
}

// With the launch probes attached for good, every launch path is counted
// exactly.
func TestLaunchesCountedWhileAttached(t *testing.T) {
	c, prog := launchConfig(t, time.Second, time.Second)
	o := start(t, c)
	m := simtest.NewMachine(t, 1, "4Gi")
	cg := simtest.NewCgroup(t, "launch")
	p := simtest.StartAllocProg(t, cg.Place(m.Command(prog)))
	p.Do(t, "ctx 0")
	p.Do(t, "launch 100")
	p.Do(t, "launch 10 ex")
	p.Do(t, "launch 5 graph") // one cuLaunchKernel while capturing, then 5 cuGraphLaunch
	if got := snapshot(t, o).Find(cg.ID, 0).LaunchesObserved; got != 116 {
		t.Errorf("launches observed = %d, want 116", got)
	}
	p.Quit(t)
}

// With the default duty cycle shape (a short window each period), launches
// are seen during a window and the rate is extrapolated from it.
func TestLaunchWindowSampled(t *testing.T) {
	c, prog := launchConfig(t, 100*time.Millisecond, 500*time.Millisecond)
	c.Ledgered = func(int) bool { return true } // windows sample the processes that keep a ledger
	o := start(t, c)
	m := simtest.NewMachine(t, 1, "4Gi")
	cg := simtest.NewCgroup(t, "window")
	p := simtest.StartAllocProg(t, cg.Place(m.Command(prog)))
	p.Do(t, "ctx 0")
	var rate float64
	began := time.Now()
	for time.Since(began) < 20*time.Second {
		done, _ := strconv.ParseFloat(p.Do(t, "launchfor 1500")[0], 64)
		s := snapshot(t, o)
		u := s.Find(cg.ID, 0)
		if u.LaunchRate > 0 && u.LaunchesObserved > 0 {
			rate = u.LaunchRate
			t.Logf("%v launches in 1.5s; observed %d in %d windows (%.2fs attached of %.2fs); rate %.0f/s; estimated %.0f",
				done, u.LaunchesObserved, s.Launch.Windows, s.Launch.ObservedSeconds, s.Launch.ElapsedSeconds, u.LaunchRate, u.LaunchesEstimated)
			if u.LaunchesObserved >= uint64(done) {
				t.Errorf("observed %d launches of %v with the probes attached 20%% of the time", u.LaunchesObserved, done)
			}
			break
		}
	}
	if rate == 0 {
		t.Fatal("no launch rate within 20s of launching")
	}
	if s := snapshot(t, o); s.Launch.DutyCycle != 0.2 || s.Launch.Windows == 0 || s.Launch.ObservedSeconds <= 0 {
		t.Errorf("sampling %+v: want duty cycle 0.2 and windows observed", s.Launch)
	}
	p.Quit(t)
}

// Without bpffs under the pin directory, the error says so.
func TestNoBPFFSError(t *testing.T) {
	simtest.RequirePrivileged(t, "eBPF")
	c := testConfig(t)
	c.PinDir = filepath.Join(t.TempDir(), "pins")
	_, err := Start(c)
	if err == nil || !strings.Contains(err.Error(), "not on bpffs") {
		t.Fatalf("Start with a pin dir on %s = %v, want a bpffs error", c.PinDir, err)
	}
}

// A process that keeps a ledger takes no launch probe at all, and every
// launch of one that keeps none is counted, from any thread, by a probe on
// that process alone.
func TestExactLaunchesOnlyWithoutLedger(t *testing.T) {
	c, prog := launchConfig(t, time.Millisecond, time.Hour) // a window is unlikely within the test: checked below
	c.ScanInterval = 100 * time.Millisecond
	// Every process on the machine keeps a ledger as far as this observer
	// is told, but the one the test makes bypass it: no other test's
	// process is probed.
	var bypass atomic.Int64
	var asked sync.Map
	c.Ledgered = func(pid int) bool {
		asked.Store(pid, true)
		return int64(pid) != bypass.Load()
	}
	stats, err := probes.EnableStats()
	if err != nil {
		t.Fatal(err)
	}
	defer stats.Close()
	o := start(t, c)
	if !o.Probes().ExactLaunches() {
		t.Skip("the kernel has no uprobe-multi links (Linux 6.6): every process's launches are sampled")
	}
	runs := func() map[string]uint64 {
		st, err := o.Probes().ProgramStats()
		if err != nil {
			t.Fatal(err)
		}
		return map[string]uint64{"launch": st["launch"].RunCount, "launch_exact": st["launch_exact"].RunCount}
	}
	m := simtest.NewMachine(t, 1, "4Gi")
	ledgered, bypassing := simtest.NewCgroup(t, "ledgered"), simtest.NewCgroup(t, "bypassing")

	led := simtest.StartAllocProg(t, ledgered.Place(m.Command(prog)))
	led.Do(t, "ctx 0")
	waitFor(t, 5*time.Second, func() (bool, string) {
		_, ok := asked.Load(led.P.Cmd.Process.Pid)
		return ok, "the scan never asked whether the ledgered process keeps a ledger"
	})
	before := runs()
	led.Do(t, "launch 1000")
	led.Do(t, "launch 10 ex")
	led.Do(t, "launchthread 100")
	if got := runs(); got["launch_exact"] != before["launch_exact"] || got["launch"] != before["launch"] {
		t.Errorf("launch programs ran %v times after %v while only a ledgered process launched, want no run", got, before)
	}

	byp := simtest.StartAllocProg(t, bypassing.Place(m.Command(prog)))
	bypass.Store(int64(byp.P.Cmd.Process.Pid))
	byp.Do(t, "ctx 0")
	waitFor(t, 5*time.Second, func() (bool, string) {
		s := snapshot(t, o)
		return s.Launch.ExactProcesses == 1, fmt.Sprintf("%d processes counted exactly, want the bypassing one", s.Launch.ExactProcesses)
	})
	before = runs()
	byp.Do(t, "launch 1000")
	byp.Do(t, "launch 10 ex")
	byp.Do(t, "launch 5 graph") // one cuLaunchKernel while capturing, then 5 cuGraphLaunch
	byp.Do(t, "launchthread 100")
	led.Do(t, "launch 1000")
	s := snapshot(t, o)
	if u := s.Find(bypassing.ID, 0); u.LaunchesObserved != 1116 || u.LaunchesExact != 1116 {
		t.Errorf("bypassing process: %d launches observed, %d exact, want 1116 of each", u.LaunchesObserved, u.LaunchesExact)
	}
	if got := runs(); got["launch_exact"]-before["launch_exact"] != 1116 {
		t.Errorf("the exact launch program ran %d times for 1116 launches of the bypassing process", got["launch_exact"]-before["launch_exact"])
	}
	if s.Launch.Windows == 0 {
		if u := s.Find(ledgered.ID, 0); u.LaunchesObserved != 0 {
			t.Errorf("ledgered process: %d launches observed with no window, want 0", u.LaunchesObserved)
		}
	}
	led.Quit(t)
	byp.Quit(t)
	waitFor(t, 5*time.Second, func() (bool, string) {
		s := snapshot(t, o)
		return s.Launch.ExactProcesses == 0, fmt.Sprintf("%d processes counted exactly after both exited", s.Launch.ExactProcesses)
	})
}
