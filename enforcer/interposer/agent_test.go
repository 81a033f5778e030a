package interposer_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

func runCmd(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).CombinedOutput()
	return string(out), err
}

// agent writes the container's limits as the agent will.
func (b *box) agent(cfg controlblock.LimitsConfig) *controlblock.LimitsFile {
	b.t.Helper()
	f, err := controlblock.CreateLimits(b.limitsPath(), cfg)
	if err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(func() { f.Close() })
	return f
}

// TestAgentLimitsHotChange: with a limits file, the agent's limits hold (not
// the environment's), and a new generation applies on the next call.
func TestAgentLimitsHotChange(t *testing.T) {
	b := newBox(t, 1, "16Gi", "GPUWARDEN_MEMORY_LIMIT=8Gi")
	var cfg controlblock.LimitsConfig
	cfg.MemLimit[0] = gi
	lim := b.agent(cfg)
	h := b.start("init", "ctx", "0", "alloc", "900Mi", "alloc", "200Mi", "hold", "alloc", "200Mi", "meminfo")
	h.ready(t)
	gen := lim.Update(func(c *controlblock.LimitsConfig) { c.MemLimit[0] = 2 * gi })
	if gen != 2 {
		t.Errorf("generation %d, want 2", gen)
	}
	h.resume()
	out, err := h.Wait()
	if err != nil {
		t.Fatal(err, h.Stderr())
	}
	r := result{lines: dropReady(out)}
	r.expect(t, "init CUDA_SUCCESS", "ctx CUDA_SUCCESS", "alloc CUDA_SUCCESS", "alloc CUDA_ERROR_OUT_OF_MEMORY",
		"hold CUDA_SUCCESS", "alloc CUDA_SUCCESS", "meminfo CUDA_SUCCESS")
	if tot := field(t, r.step(t, "meminfo", 0), "total"); tot != 2*gi {
		t.Errorf("total after the change: %d, want %d", tot, 2*gi)
	}
}

// TestStandaloneThenAgent: limits written after the workload started are
// picked up without a restart.
func TestStandaloneThenAgent(t *testing.T) {
	b := newBox(t, 1, "16Gi", "GPUWARDEN_MEMORY_LIMIT=4Gi")
	h := b.start("init", "ctx", "0", "alloc", "1Gi", "hold", "alloc", "1Gi")
	h.ready(t)
	var cfg controlblock.LimitsConfig
	cfg.MemLimit[0] = 1536 * mi
	b.agent(cfg)
	time.Sleep(600 * time.Millisecond) // the reaper looks for it every 250 ms
	h.resume()
	out, _ := h.Wait()
	if !strings.Contains(out, "alloc CUDA_ERROR_OUT_OF_MEMORY") {
		t.Errorf("1Gi more under the agent's 1.5Gi:\n%s", out)
	}
}

// TestLaunchGate: with the gate on, launches wait (without spinning) until
// the agent raises the grant, and the wait is counted as throttled time.
func TestLaunchGate(t *testing.T) {
	b := newBox(t, 1, "16Gi")
	lim := b.agent(controlblock.LimitsConfig{GateMask: 1, GraceNs: uint64(60 * time.Second)})
	h := b.start("init", "ctx", "0", "launch", "10", "hold")
	pid := 0
	// the process reaches the gate: tickets are taken, the launches wait
	deadline := time.Now().Add(10 * time.Second)
	for {
		lim.Heartbeat()
		u, err := controlblock.OpenUsage(b.usagePath())
		if err == nil {
			issued := u.Issued(0)
			u.Close()
			if issued >= 1 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no launch reached the gate")
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	if err := lim.RaiseGrant(0, 5); err != nil { // not enough for 10
		t.Fatal(err)
	}
	// tickets 2-5 run, the 6th waits
	for b.ledger().LaunchesIssued[0] < 6 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	if l := b.ledger(); l.LaunchesIssued[0] != 6 {
		t.Errorf("issued %d tickets with grant 5, want 6 (5 ran, the 6th waits)", l.LaunchesIssued[0])
	}
	if err := lim.RaiseGrant(0, 1000); err != nil {
		t.Fatal(err)
	}
	if line := h.WaitLine(t, "launch", 10*time.Second); !strings.Contains(line, "launch CUDA_SUCCESS") {
		t.Errorf("launch: %s", line)
	}
	pid = h.ready(t)
	time.Sleep(flushWithin) // launch counts reach the ledger within this
	p := proc(b.ledger(), pid)
	if p == nil || p.Launches != 10 || p.ThrottledNs < uint64(300*time.Millisecond) {
		t.Errorf("slot %+v: want 10 launches and >= 300ms throttled", p)
	}
	h.resume()
	h.Wait()
}

// TestLaunchGateDeadAgent: launches are not held for long by an agent that
// never grants: once it is silent (half the 700ms grace here) the grant goes
// on at the slowest pace (no pace was ever seen), and at the grace period
// the gate lifts; lifting the gate releases waiters at once.
func TestLaunchGateDeadAgent(t *testing.T) {
	b := newBox(t, 1, "16Gi")
	lim := b.agent(controlblock.LimitsConfig{GateMask: 1, GraceNs: uint64(700 * time.Millisecond)})
	lim.Heartbeat()
	start := time.Now()
	r := b.run("init", "ctx", "0", "launch", "3")
	r.expect(t, "init CUDA_SUCCESS", "ctx CUDA_SUCCESS", "launch CUDA_SUCCESS")
	if el := time.Since(start); el < 300*time.Millisecond || el > 8*time.Second {
		t.Errorf("launches under a silent agent took %v, want them held until it is silent (350ms), then paced", el)
	}

	lim.Update(func(c *controlblock.LimitsConfig) { c.GraceNs = uint64(time.Minute) })
	lim.Heartbeat()
	h := b.start("init", "ctx", "0", "launch", "3", "hold")
	time.Sleep(300 * time.Millisecond)
	lim.Update(func(c *controlblock.LimitsConfig) { c.GateMask = 0 })
	h.ready(t)
	h.resume()
	h.Wait()
}

// TestNVMLView: inside a container NVML shows the quota as the device's
// memory and only the container's own processes.
func TestNVMLView(t *testing.T) {
	b := newBox(t, 1, "16Gi", "GPUWARDEN_MEMORY_LIMIT=2Gi")
	mine := b.start("init", "ctx", "0", "alloc", "500Mi", "hold")
	mypid := mine.ready(t)
	other := b.sibling() // another container, no limit
	theirs := other.start("init", "ctx", "0", "alloc", "1Gi", "hold")
	theirpid := theirs.ready(t)

	r := b.run("nvml")
	line := r.step(t, "nvml", 0)
	used := ctxReserve + 500*mi
	if field(t, line, "total") != 2*gi || field(t, line, "used") != used || field(t, line, "free") != 2*gi-used ||
		field(t, line, "total2") != 2*gi || field(t, line, "count") != 1 {
		t.Errorf("container view: %s", line)
	}
	want := " procs=" + itoa(mypid) + ":" + itoa(int(used)) + " procs1=" + itoa(mypid) + ":" + itoa(int(used))
	if !strings.Contains(line, want) {
		t.Errorf("container view %s, want%s", line, want)
	}

	// without the interposer, NVML sees the whole device
	cmd := exec.Command(b.check().Path, "nvml")
	cmd.Env = append(cleanEnv(), b.m.Env()...)
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	if s := string(out); !strings.Contains(s, "total=17179869184") || !strings.Contains(s, itoa(theirpid)+":") {
		t.Errorf("host view: %s", s)
	}
	mine.resume()
	theirs.resume()
}

// TestLimitsOverwritten: limits whose bytes are overwritten in place (a new
// seq, so the interposer reads them again) with a bad header or impossible
// config, and no memory limit, lift nothing: the last good limits stay.
func TestLimitsOverwritten(t *testing.T) {
	off := func(f string) int {
		sf, ok := reflect.TypeOf(controlblock.Limits{}).FieldByName(f)
		if !ok {
			t.Fatalf("no field %s", f)
		}
		return int(sf.Offset)
	}
	le := binary.LittleEndian
	for _, c := range []struct {
		name  string
		spoil func(b []byte)
	}{
		{"magic", func(b []byte) { copy(b[off("Magic"):], "NOTLIMIT") }},
		{"abi-major", func(b []byte) { le.PutUint16(b[off("ABIMajor"):], controlblock.ABIMajor+1) }},
		{"size-small", func(b []byte) { le.PutUint32(b[off("Size"):], 16) }},
		{"size-huge", func(b []byte) { le.PutUint32(b[off("Size"):], 1<<31) }},
		{"ndev", func(b []byte) { le.PutUint32(b[off("NDev"):], 1000) }},
		{"gate-mask", func(b []byte) { le.PutUint32(b[off("GateMask"):], 1<<20) }},
		{"generation-back", func(b []byte) { le.PutUint64(b[off("Generation"):], 0) }},
		{"garbage", func(b []byte) {
			for i := range b {
				b[i] = byte(i*131 + 7)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := newBox(t, 1, "16Gi")
			var cfg controlblock.LimitsConfig
			cfg.MemLimit[0] = gi
			b.agent(cfg)
			h := b.start("init", "ctx", "0", "alloc", "512Mi", "hold", "alloc", "8Gi", "alloc", "256Mi")
			h.ready(t)

			raw, err := os.ReadFile(b.limitsPath())
			if err != nil {
				t.Fatal(err)
			}
			seq := le.Uint64(raw[off("Seq"):])
			c.spoil(raw)
			for d := 0; d < controlblock.MaxDevices; d++ { // and no memory limit
				le.PutUint64(raw[off("MemLimit")+8*d:], 0)
			}
			le.PutUint64(raw[off("Seq"):], seq+2) // a new, even seq: read again
			f, err := os.OpenFile(b.limitsPath(), os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteAt(raw, 0); err != nil {
				t.Fatal(err)
			}
			f.Close()

			h.resume()
			out, err := h.Wait()
			if err != nil {
				t.Fatal(err, h.Stderr())
			}
			r := result{lines: dropReady(out)}
			r.expect(t, "init CUDA_SUCCESS", "ctx CUDA_SUCCESS", "alloc CUDA_SUCCESS", "hold CUDA_SUCCESS",
				"alloc CUDA_ERROR_OUT_OF_MEMORY", "alloc CUDA_SUCCESS")
			if !strings.Contains(h.Stderr(), "keeping the last good limits") {
				t.Errorf("stderr %q, want the bad limits named", h.Stderr())
			}
		})
	}
}

// TestLaunchGateSilentAgentPaces: an agent that falls silent (SIGKILLed)
// stalls nobody. For the grace period its gated container's launches go on
// at about the pace it last granted, not frozen and not unlimited; then the
// gate lifts. The memory limit holds throughout.
func TestLaunchGateSilentAgentPaces(t *testing.T) {
	const grace = 6 * time.Second
	b := newBox(t, 1, "16Gi")
	cfg := controlblock.LimitsConfig{GateMask: 1, GraceNs: uint64(grace)}
	cfg.MemLimit[0] = gi
	lim := b.agent(cfg)
	lim.Heartbeat()
	// the agent: a beat every 100ms, and 20 more launches with each (200/s)
	stop, stopped := make(chan struct{}), make(chan struct{})
	began := time.Now()
	go func() {
		defer close(stopped)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		var grant uint64
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			grant += 20
			lim.RaiseGrant(0, grant)
			lim.Heartbeat()
		}
	}()
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
	}()
	h := b.start("init", "ctx", "0", "launch", "1000000")
	issued := func() uint64 {
		raw, err := os.ReadFile(b.usagePath())
		if err != nil {
			return 0
		}
		s, err := controlblock.ParseUsage(raw)
		if err != nil {
			return 0
		}
		return s.LaunchesIssued[0]
	}
	simtest.Eventually(t, 20*time.Second, func() error {
		if issued() == 0 {
			return errors.New("no launch at the gate yet")
		}
		return nil
	})
	time.Sleep(3 * time.Second) // long enough for the pace to be seen (windows of 1-4 s of beats)
	if n := issued(); n > uint64(400*time.Since(began).Seconds())+100 {
		t.Fatalf("%d launches in %v under a 200/s grant", n, time.Since(began))
	}
	close(stop)
	<-stopped
	silent := time.Now()

	time.Sleep(time.Second) // the agent is taken as silent after 0.5s
	i1, t1 := issued(), time.Now()
	r := b.run("init", "ctx", "0", "alloc", "2Gi")
	r.expect(t, "init CUDA_SUCCESS", "ctx CUDA_SUCCESS", "alloc CUDA_ERROR_OUT_OF_MEMORY")
	time.Sleep(time.Until(silent.Add(4 * time.Second)))
	i2, t2 := issued(), time.Now()
	rate := float64(i2-i1) / t2.Sub(t1).Seconds()
	t.Logf("%.0f launches/s while the agent was silent", rate)
	if rate < 40 || rate > 1000 {
		t.Errorf("%.0f launches/s while the agent was silent, want about the 200/s it last granted", rate)
	}

	// after the grace period the gate lifts: the rest run at once
	line := h.WaitLine(t, "launch", grace+30*time.Second)
	if !strings.Contains(line, "launch CUDA_SUCCESS") {
		t.Errorf("launch: %s", line)
	}
	if el := time.Since(silent); el < grace-time.Second {
		t.Errorf("a million launches done %v after the agent fell silent, before the %v grace", el, grace)
	}
	h.Wait()
}

// TestRealAgentKilled: SIGKILL the real agent while it gates two containers
// (weights 1 and 2): during its grace period their launches go on (not
// frozen) and their memory limits hold.
func TestRealAgentKilled(t *testing.T) {
	simtest.RequirePrivileged(t, "eBPF and cgroups")
	m := simtest.NewMachine(t, 1, "16Gi")
	agent := simtest.StartAgent(t, m, "GPUWARDEN_ENFORCEMENT_GRACE_PERIOD=8s")
	type ctr struct {
		cg    *simtest.Cgroup
		usage string
	}
	var ctrs []ctr
	for i, w := range []string{"1", "2"} {
		cg := simtest.NewCgroup(t, "killed"+itoa(i))
		cmd := cg.Place(m.Command(simtest.Bin(t, "simgpu/workload"), "--alloc", "1Gi", "--seconds", "120",
			"--kernels", "8", "--kernel-ns", "2000000"))
		cmd.Env = append(cmd.Env, "LD_PRELOAD="+simtest.Bin(t, "libgpuwarden.so"), "GPUWARDEN_CONTROL_DIR="+agent.ControlDir,
			"GPUWARDEN_COMPUTE_WEIGHT="+w, "GPUWARDEN_MEMORY_LIMIT=2Gi")
		simtest.Start(t, cmd).WaitLine(t, "ready", 10*time.Second)
		key := controlblock.ContainerKey(cg.Rel)
		ctrs = append(ctrs, ctr{cg, controlblock.UsagePath(agent.ControlDir, key)})
	}
	issued := func(c ctr) uint64 {
		u, err := controlblock.OpenUsage(c.usage)
		if err != nil {
			t.Fatal(err)
		}
		defer u.Close()
		return u.Issued(0)
	}
	// both gated, and long enough for the pace to be seen
	simtest.Eventually(t, 20*time.Second, func() error {
		for _, c := range ctrs {
			l, err := controlblock.OpenLimits(controlblock.LimitsPath(agent.ControlDir, controlblock.ContainerKey(c.cg.Rel)))
			if err != nil {
				return err
			}
			mask := l.Config().GateMask
			l.Close()
			if mask&1 == 0 {
				return fmt.Errorf("%s: not gated", c.cg.Rel)
			}
		}
		return nil
	})
	time.Sleep(4 * time.Second) // long enough for the pace to be seen (windows of 1-4 s of beats)

	agent.Kill(t)
	killed := time.Now()
	time.Sleep(1500 * time.Millisecond) // silent after 0.5s
	var before [2]uint64
	for i, c := range ctrs {
		before[i] = issued(c)
	}
	t1 := time.Now()
	time.Sleep(time.Until(killed.Add(5 * time.Second)))
	for i, c := range ctrs {
		rate := float64(issued(c)-before[i]) / time.Since(t1).Seconds()
		t.Logf("%s: %.0f launches/s while the agent was dead", c.cg.Rel, rate)
		if rate < 3 {
			t.Errorf("%s: %.1f launches/s while the agent was dead, want it to go on", c.cg.Rel, rate)
		}
	}
	// memory: each container still holds its 2Gi (1Gi and a context taken)
	b := &box{t: t, m: m, ctl: agent.ControlDir, lib: simtest.Bin(t, "libgpuwarden.so"), cg: ctrs[0].cg,
		env: []string{"GPUWARDEN_MEMORY_LIMIT=2Gi"}}
	r := b.run("init", "ctx", "0", "alloc", "1Gi")
	r.expect(t, "init CUDA_SUCCESS", "ctx CUDA_SUCCESS", "alloc CUDA_ERROR_OUT_OF_MEMORY")
}

// TestLimitsReplaced: a limits file replaced by rename (as the agent replaces
// one it did not write) is followed by running processes within the
// reaper's period; a replacement that fails its check keeps the last good
// limits.
func TestLimitsReplaced(t *testing.T) {
	for _, c := range []struct {
		name     string
		first    uint64
		replace  func(t *testing.T, path string)
		overWant string // the 2 GiB allocation after the replacement
	}{
		{"lower limit", 8 * gi, func(t *testing.T, path string) {
			var cfg controlblock.LimitsConfig
			cfg.MemLimit[0] = gi
			f, err := controlblock.CreateLimits(path, cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { f.Close() })
		}, "alloc CUDA_ERROR_OUT_OF_MEMORY"},
		{"bad file", gi, func(t *testing.T, path string) {
			tmp := path + ".new"
			if err := os.WriteFile(tmp, make([]byte, controlblock.LimitsSize), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(tmp, path); err != nil {
				t.Fatal(err)
			}
		}, "alloc CUDA_ERROR_OUT_OF_MEMORY"},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := newBox(t, 1, "16Gi")
			var cfg controlblock.LimitsConfig
			cfg.MemLimit[0] = c.first
			b.agent(cfg)
			h := b.start("init", "ctx", "0", "alloc", "512Mi", "hold", "alloc", "2Gi")
			h.ready(t)
			c.replace(t, b.limitsPath())
			time.Sleep(time.Second) // the reaper looks every 250 ms
			h.resume()
			out, err := h.Wait()
			if err != nil {
				t.Fatal(err, h.Stderr())
			}
			r := result{lines: dropReady(out)}
			r.expect(t, "init CUDA_SUCCESS", "ctx CUDA_SUCCESS", "alloc CUDA_SUCCESS", "hold CUDA_SUCCESS", c.overWant)
		})
	}
}
