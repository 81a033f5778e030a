package interposer_test

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
	"github.com/gpuwarden/gpuwarden/enforcer/hostcgroup"
	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

const (
	mi = uint64(1) << 20
	gi = uint64(1) << 30
	// ctxReserve is what the interposer charges for a context by default.
	ctxReserve = controlblock.DefaultContextReserve
)

// box is one "container": a simulated machine, a control directory and the
// cgroup whose key names the container's control block.
type box struct {
	t   testing.TB
	m   *simtest.Machine
	ctl string
	key string
	lib string
	cg  *simtest.Cgroup // nil: the test's own cgroup
	env []string        // GPUWARDEN_* variables for the processes
}

func newBox(t testing.TB, devices int, memory string, env ...string) *box {
	t.Helper()
	b := &box{t: t, m: simtest.NewMachine(t, devices, memory), ctl: filepath.Join(t.TempDir(), "ctl"),
		lib: simtest.Bin(t, "libgpuwarden.so"), env: env}
	cg, err := hostcgroup.Of("/proc", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	b.key = controlblock.ContainerKey(cg)
	return b
}

// inCgroup moves the box's processes into a cgroup of their own (root only).
func (b *box) inCgroup(name string) *box {
	b.cg = simtest.NewCgroup(b.t, name)
	b.key = controlblock.ContainerKey(b.cg.Rel)
	return b
}

// sibling is another container on the same machine: its own control directory.
func (b *box) sibling(env ...string) *box {
	s := *b
	s.ctl = filepath.Join(b.t.TempDir(), "ctl")
	s.env = env
	s.cg = nil
	return &s
}

func cleanEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		if (strings.HasPrefix(kv, "GPUWARDEN_") && !strings.HasPrefix(kv, "GPUWARDEN_REQUIRE_PRIVILEGED=")) ||
			strings.HasPrefix(kv, "ALIYUN_COM_GPU_") || strings.HasPrefix(kv, "LD_PRELOAD=") || strings.HasPrefix(kv, "SIMGPU_") {
			continue
		}
		out = append(out, kv)
	}
	return out
}

// command builds a command running in the container with the interposer preloaded.
func (b *box) command(bin string, args ...string) *exec.Cmd {
	cmd := exec.Command(bin, args...)
	cmd.Env = append(cleanEnv(), b.m.Env()...)
	cmd.Env = append(cmd.Env, "LD_PRELOAD="+b.lib, "GPUWARDEN_CONTROL_DIR="+b.ctl)
	cmd.Env = append(cmd.Env, b.env...)
	if b.cg != nil {
		b.cg.Place(cmd)
	}
	return cmd
}

func (b *box) check(args ...string) *exec.Cmd {
	return b.command(simtest.Bin(b.t, "interposer/gw-check"), args...)
}

// result is what a gw-check run printed, one line per step.
type result struct {
	lines  []string
	stderr string
	err    error
}

func (b *box) run(args ...string) result {
	b.t.Helper()
	cmd := b.check(args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	return result{lines: strings.Split(strings.TrimSpace(string(out)), "\n"), stderr: stderr.String(), err: err}
}

// step returns the n-th (from 0) line starting with name.
func (r result) step(t testing.TB, name string, n int) string {
	t.Helper()
	for _, l := range r.lines {
		if strings.HasPrefix(l, name+" ") {
			if n == 0 {
				return l
			}
			n--
		}
	}
	t.Fatalf("no %q line #%d in output:\n%s\nstderr: %s", name, n, strings.Join(r.lines, "\n"), r.stderr)
	return ""
}

// expect checks the CUDA results of the steps named, in order of appearance.
func (r result) expect(t testing.TB, want ...string) {
	t.Helper()
	if r.err != nil {
		t.Fatalf("gw-check: %v\n%s\nstderr: %s", r.err, strings.Join(r.lines, "\n"), r.stderr)
	}
	if len(r.lines) != len(want) {
		t.Fatalf("got %d lines, want %d:\n%s\nstderr: %s", len(r.lines), len(want), strings.Join(r.lines, "\n"), r.stderr)
	}
	for i, w := range want {
		name, res, _ := strings.Cut(w, " ")
		f := strings.Fields(r.lines[i])
		if len(f) < 2 || f[0] != name || f[1] != res {
			t.Errorf("line %d: %q, want %q", i, r.lines[i], w)
		}
	}
}

// field reads k=v from a line.
func field(t testing.TB, line, k string) uint64 {
	t.Helper()
	for _, f := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(f, k+"="); ok {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				t.Fatalf("%s in %q: %v", k, line, err)
			}
			return n
		}
	}
	t.Fatalf("no %s= in %q", k, line)
	return 0
}

func (b *box) usagePath() string  { return controlblock.UsagePath(b.ctl, b.key) }
func (b *box) limitsPath() string { return controlblock.LimitsPath(b.ctl, b.key) }

// ledger reads the container's ledger now.
func (b *box) ledger() *controlblock.UsageSnapshot {
	b.t.Helper()
	raw, err := os.ReadFile(b.usagePath())
	if err != nil {
		b.t.Fatal(err)
	}
	s, err := controlblock.ParseUsage(raw)
	if err != nil {
		b.t.Fatal(err)
	}
	if len(s.Problems) > 0 {
		b.t.Fatalf("ledger problems: %q", s.Problems)
	}
	return s
}

// proc finds a process's entry in the ledger.
func proc(s *controlblock.UsageSnapshot, pid int) *controlblock.ProcUsage {
	for i := range s.Procs {
		if int(s.Procs[i].Pid) == pid {
			return &s.Procs[i]
		}
	}
	return nil
}

// held is a gw-check started with a "hold" step: it waits on stdin.
type held struct {
	*simtest.Proc
	stdin io.WriteCloser
	pid   int
}

func (b *box) start(args ...string) *held {
	b.t.Helper()
	cmd := b.check(args...)
	in, err := cmd.StdinPipe()
	if err != nil {
		b.t.Fatal(err)
	}
	p := simtest.Start(b.t, cmd)
	return &held{Proc: p, stdin: in}
}

// ready waits for the hold step and returns the pid it printed.
func (h *held) ready(t testing.TB) int {
	t.Helper()
	l := h.WaitLine(t, "ready", 20*time.Second)
	h.pid = int(field(t, l, "pid"))
	return h.pid
}

func (h *held) resume() { fmt.Fprintln(h.stdin) }

// deviceUsed reads simgpu's own count of device 0's used memory from its
// state file: struct sg_state { u64 magic; u32 version, ndev; u64 size;
// struct sg_device dev[8]; } with sg_device { u64 total_mem; u64 used_mem; ... }.
type simState struct {
	mem []byte
}

func openState(t testing.TB, path string) *simState {
	t.Helper()
	// The first simgpu process creates the file, then sizes and lays it out
	// under an exclusive flock: map it only once it is laid out (mapping
	// past the end of the file would fault).
	var f *os.File
	var err error
	for i := 0; ; i++ {
		if f, err = os.Open(path); err == nil {
			err = syscall.Flock(int(f.Fd()), syscall.LOCK_SH)
			var st os.FileInfo
			if err == nil {
				st, err = f.Stat()
			}
			if err == nil && st.Size() >= 4096 {
				break
			}
			if err == nil {
				err = fmt.Errorf("%s is not laid out yet", path)
			}
			f.Close()
		}
		if i == 200 {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	defer f.Close()
	// Unlocked explicitly: the mapping keeps the open file, and with it a
	// lock, alive after Close.
	syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	mem, err := syscall.Mmap(int(f.Fd()), 0, 4096, syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Munmap(mem) })
	return &simState{mem: mem}
}

func (s *simState) total0() uint64 { return binary.LittleEndian.Uint64(s.mem[24:]) }

func (s *simState) used0() uint64 { return atomic.LoadUint64((*uint64)(unsafe.Pointer(&s.mem[32]))) }

func itoa(n int) string { return strconv.Itoa(n) }

// dropReady splits output into lines without the hold step's "ready" line.
func dropReady(out string) []string {
	var l []string
	for _, s := range strings.Split(strings.TrimSpace(out), "\n") {
		if !strings.HasPrefix(s, "ready ") {
			l = append(l, s)
		}
	}
	return l
}
