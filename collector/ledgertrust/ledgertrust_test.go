package ledgertrust

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
)

type fakeCgroups map[uint64]string

func (f fakeCgroups) Path(id uint64) (string, bool) { p, ok := f[id]; return p, ok }

// fixture lays out a cgroup2 tree and a /proc: each process has a host pid,
// a pid in its own namespace, a start time and a cgroup.
type fixture struct {
	t              *testing.T
	cgroupFS, proc string
}

func newFixture(t *testing.T) *fixture {
	return &fixture{t: t, cgroupFS: t.TempDir(), proc: t.TempDir()}
}

func (f *fixture) write(path, content string) {
	f.t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		f.t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) process(hostPID, nsPID int, start uint64, cgroup string) {
	dir := filepath.Join(f.proc, fmt.Sprint(hostPID))
	// comm with a space and a parenthesis: fields are counted from the last ')'.
	f.write(filepath.Join(dir, "stat"), fmt.Sprintf("%d (a b) c) S 1 1 1 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 %d 0 0\n", hostPID, start))
	f.write(filepath.Join(dir, "status"), fmt.Sprintf("Name:\tx\nNSpid:\t%d\t%d\n", hostPID, nsPID))
	procs := filepath.Join(f.cgroupFS, cgroup, "cgroup.procs")
	old, _ := os.ReadFile(procs)
	f.write(procs, string(old)+fmt.Sprintf("%d\n", hostPID))
}

func ledger(cg uint64, procs ...controlblock.ProcUsage) *controlblock.UsageSnapshot {
	return &controlblock.UsageSnapshot{CgroupID: cg, Procs: procs}
}

func slot(pid int32, start uint64) controlblock.ProcUsage {
	return controlblock.ProcUsage{Pid: pid, StartTime: start}
}

func TestVerify(t *testing.T) {
	f := newFixture(t)
	const victim, attacker = "/kubepods/pod-v/ctr", "/kubepods/pod-a/ctr"
	cgs := fakeCgroups{1: victim, 2: attacker}
	f.process(100, 7, 5000, victim)   // pid 7 in the victim's namespace
	f.process(200, 7, 6000, attacker) // pid 7 in the attacker's namespace too
	kubelet := func(dir, path string) bool {
		return dir == "alloc-a" && path == attacker || dir == "alloc-v" && path == victim
	}
	tests := []struct {
		name     string
		dir      string
		u        *controlblock.UsageSnapshot
		assigned Assigned
		want     string // the path, or part of the error
	}{
		{"derived directory, own process", controlblock.ContainerKey(victim), ledger(1, slot(7, 5000)), nil, victim},
		{"kubelet's directory, own process", "alloc-a", ledger(2, slot(7, 6000)), kubelet, attacker},
		{"no cgroup named", "alloc-a", ledger(0, slot(7, 6000)), kubelet, "names no cgroup"},
		{"cgroup gone", "alloc-a", ledger(9, slot(7, 6000)), kubelet, "does not exist"},
		{"directory of neither", "elsewhere", ledger(1, slot(7, 5000)), kubelet, "belongs neither"},
		{"another pod's cgroup in an assigned directory", "alloc-a", ledger(1, slot(7, 6000)), kubelet, "belongs neither"},
		{"assigned directory, another cgroup's process", "alloc-v", ledger(1, slot(7, 6000)), kubelet, "none of the ledger's processes"},
		{"no live process", controlblock.ContainerKey(victim), ledger(1), nil, "no live process"},
		{"pid reused (other start time)", controlblock.ContainerKey(victim), ledger(1, slot(7, 4999)), nil, "none of the ledger's processes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := NewVerifier(cgs, f.cgroupFS, f.proc)
			got, err := v.Verify(tt.dir, tt.u, tt.assigned)
			if err != nil {
				got = err.Error()
			}
			if !strings.Contains(got, tt.want) {
				t.Errorf("Verify = %q, want %q", got, tt.want)
			}
		})
	}
}

// A verdict stands while the process that vouched stays in a slot; once it
// is gone the claim is checked again.
func TestVerifyKeepsVerdicts(t *testing.T) {
	f := newFixture(t)
	cgs := fakeCgroups{1: "/a"}
	f.process(100, 100, 5000, "/a")
	v := NewVerifier(cgs, f.cgroupFS, f.proc)
	dir := controlblock.ContainerKey("/a")
	if _, err := v.Verify(dir, ledger(1, slot(100, 5000)), nil); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(f.cgroupFS, "a", "cgroup.procs")); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Verify(dir, ledger(1, slot(100, 5000)), nil); err != nil {
		t.Errorf("a kept verdict was checked again: %v", err)
	}
	if _, err := v.Verify(dir, ledger(1, slot(101, 5000)), nil); err == nil {
		t.Error("a ledger whose vouching process left was believed on the old verdict")
	}
}

func TestIdentify(t *testing.T) {
	f := newFixture(t)
	f.process(4242, 12, 987654, "/x")
	p, err := Identify(f.proc, 4242)
	if err != nil || p != (Proc{NSPid: 12, StartTime: 987654}) {
		t.Errorf("Identify = %+v, %v", p, err)
	}
	if _, err := Identify(f.proc, 1); err == nil {
		t.Error("Identify of a missing process gave no error")
	}
}

// Verdicts made together fall due over a spread of times, each within a
// quarter of recheck of it.
func TestRecheckSpread(t *testing.T) {
	lo, hi := time.Duration(1<<62), time.Duration(0)
	for i := range 1000 {
		d := recheckFor(fmt.Sprintf("k8s-ns-pod-%d-main", i))
		if d < recheck*3/4 || d > recheck*5/4 {
			t.Fatalf("recheck %v, want %v to %v", d, recheck*3/4, recheck*5/4)
		}
		lo, hi = min(lo, d), max(hi, d)
	}
	if hi-lo < recheck/3 {
		t.Errorf("1000 directories' rechecks span %v to %v; want them spread over most of %v", lo, hi, recheck/2)
	}
}

// A refusal stands while the ledger claims the same with the same
// processes, even once the claim would pass; a ledger that changes is
// judged again at once.
func TestVerifyBacksOffRefusals(t *testing.T) {
	f := newFixture(t)
	cgs := fakeCgroups{1: "/a"}
	v := NewVerifier(cgs, f.cgroupFS, f.proc)
	dir := controlblock.ContainerKey("/a")
	f.process(200, 200, 6000, "/b")
	f.write(filepath.Join(f.cgroupFS, "a", "cgroup.procs"), "")
	if _, err := v.Verify(dir, ledger(1, slot(100, 5000)), nil); err == nil {
		t.Fatal("a ledger none of whose processes is in its cgroup was believed")
	}
	f.process(100, 100, 5000, "/a")
	if _, err := v.Verify(dir, ledger(1, slot(100, 5000)), nil); err == nil {
		t.Error("a refusal was judged again before its wait")
	}
	if _, err := v.Verify(dir, ledger(1, slot(100, 5000), slot(7, 1)), nil); err != nil {
		t.Errorf("a changed ledger was not judged again: %v", err)
	}
	v.Forget(map[string]bool{})
	if len(v.cache)+len(v.refused) != 0 {
		t.Errorf("Forget kept %d verdicts and %d refusals", len(v.cache), len(v.refused))
	}
}
