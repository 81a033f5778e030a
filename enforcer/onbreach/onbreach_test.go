package onbreach

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/gpuwarden/gpuwarden/enforcer/agentapi"
	"github.com/gpuwarden/gpuwarden/enforcer/changeapi"
	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
	"github.com/gpuwarden/gpuwarden/enforcer/hostcgroup"
	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

// A cgroup is in scope when it is a scope's path or below it, never a
// sibling that shares its prefix; no scope is everything.
func TestInScope(t *testing.T) {
	if !InScope(nil, "/system.slice/dcgm.service") {
		t.Error("without a scope, a cgroup is out of it")
	}
	scope := []string{"/kubepods.slice", "/kubepods"}
	for path, want := range map[string]bool{
		"/kubepods.slice": true, "/kubepods.slice/kubepods-burstable.slice/pod1/ctr": true, "/kubepods/besteffort/pod2/ctr": true,
		"/kubepods.slicex/x": false, "/kubepodsx": false, "/system.slice/dcgm.service": false, "/": false, "": false,
	} {
		if got := InScope(scope, path); got != want {
			t.Errorf("InScope(%q) = %v, want %v", path, got, want)
		}
	}
	if !InScope([]string{"/"}, "/system.slice/x.service") {
		t.Error("the scope / leaves a cgroup out")
	}
}

// On a host with a hybrid cgroup layout /proc/self/cgroup lists the v1
// hierarchies before the "0::" line: the agent must still know its own
// cgroup, and never freeze or kill it or an ancestor of it.
func TestStoppableRefusesTheAgentsOwnCgroups(t *testing.T) {
	proc := t.TempDir()
	self := filepath.Join(proc, fmt.Sprint(os.Getpid()))
	if err := os.MkdirAll(self, 0o755); err != nil {
		t.Fatal(err)
	}
	hybrid := "12:memory:/system.slice/gpuwarden.service\n1:name=systemd:/system.slice/gpuwarden.service\n0::/system.slice/gpuwarden.service\n"
	if err := os.WriteFile(filepath.Join(self, "cgroup"), []byte(hybrid), 0o644); err != nil {
		t.Fatal(err)
	}
	r := New(Config{ProcRoot: proc, NSRoot: "/"})
	for path, refused := range map[string]bool{
		"/":                                 true,
		"":                                  true,
		"/system.slice":                     true,
		"/system.slice/gpuwarden.service":   true,
		"/system.slice/gpuwarden.service/x": false,
		"/system.slice/gpuwarden.servicex":  false,
		"/kubepods/besteffort/pod1/ctr":     false,
	} {
		if err := r.stoppable(path); (err != nil) != refused {
			t.Errorf("stoppable(%q) = %v, want refused %v", path, err, refused)
		}
	}
}

// A breach is reported once while it lasts, and again when it returns.
func TestFreshBreaches(t *testing.T) {
	var w watch
	w.init()
	view := func(reasons ...string) []agentapi.ContainerDevice {
		c := agentapi.ContainerDevice{CgroupPath: "/a"}
		for _, r := range reasons {
			c.Breaches = append(c.Breaches, agentapi.Breach{Reason: r})
		}
		return []agentapi.ContainerDevice{c}
	}
	reasons := func(fs []breachAt) string {
		var out []string
		for _, f := range fs {
			out = append(out, f.b.Reason)
		}
		return strings.Join(out, ",")
	}
	for i, step := range []struct {
		seen []string
		want string
	}{
		{[]string{"over_limit"}, "over_limit"},
		{[]string{"over_limit", "bad_ledger"}, "bad_ledger"},
		{[]string{"over_limit"}, ""},
		{nil, ""},
		{[]string{"over_limit"}, "over_limit"},
	} {
		if got := reasons(w.fresh(view(step.seen...))); got != step.want {
			t.Errorf("step %d: fresh = %q, want %q", i, got, step.want)
		}
	}
}

// inBreach is a container of cgroup rel in breach, its offenders procs.
func inBreach(rel string, procs ...agentapi.Process) []agentapi.ContainerDevice {
	return []agentapi.ContainerDevice{{CgroupPath: rel, Breaches: []agentapi.Breach{{Reason: "bypass", Evidence: "test", Procs: procs}}}}
}

func kinds(r *Responder) []string {
	var out []string
	for _, ev := range r.Events() {
		out = append(out, ev.Kind)
	}
	return out
}

// responder acts on this machine's cgroup2 tree.
func responder(t *testing.T, action string, scope ...string) *Responder {
	mnt, err := hostcgroup.Mount("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	return New(Config{Action: action, Scope: scope, CgroupFS: mnt, ProcRoot: "/proc", NSRoot: "/",
		Log: slog.New(slog.DiscardHandler)})
}

func sleeper(t *testing.T, cg *simtest.Cgroup) *exec.Cmd {
	cmd := cg.Place(exec.Command("sleep", "60"))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd
}

func freezeFile(t *testing.T, cg *simtest.Cgroup) string {
	b, err := os.ReadFile(filepath.Join(cg.Path, "cgroup.freeze"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// A breach in scope freezes its cgroup once while it lasts; ctl's
// Unfreeze thaws it, once; out of scope a breach is reported only.
func TestFreezeAndUnfreeze(t *testing.T) {
	cg := simtest.NewCgroup(t, "onbreach-freeze")
	sleeper(t, cg)
	out := responder(t, Freeze, "/elsewhere")
	out.Check(inBreach(cg.Rel))
	if got := kinds(out); !slices.Equal(got, []string{"breach"}) || freezeFile(t, cg) != "0" {
		t.Fatalf("out of scope: events %v, cgroup.freeze %s; want a breach reported only", got, freezeFile(t, cg))
	}

	r := responder(t, Freeze, filepath.Dir(cg.Rel))
	r.Check(inBreach(cg.Rel))
	r.Check(inBreach(cg.Rel))
	if got := kinds(r); !slices.Equal(got, []string{"breach", "frozen"}) || freezeFile(t, cg) != "1" {
		t.Fatalf("events %v, cgroup.freeze %s; want breach, frozen and 1", got, freezeFile(t, cg))
	}
	if err := r.Unfreeze(cg.Rel); err != nil {
		t.Fatal(err)
	}
	if got := kinds(r); !slices.Equal(got, []string{"breach", "frozen", "unfrozen"}) || freezeFile(t, cg) != "0" {
		t.Errorf("after Unfreeze: events %v, cgroup.freeze %s", got, freezeFile(t, cg))
	}
	if err := r.Unfreeze(cg.Rel); !errors.Is(err, changeapi.ErrNotFrozen) {
		t.Errorf("a second Unfreeze = %v, want ErrNotFrozen", err)
	}
}

// Kill signals a named offender only while it is the process judged (its
// start time), and leaves the rest of its cgroup running.
func TestKillOffenderAlone(t *testing.T) {
	cg := simtest.NewCgroup(t, "onbreach-kill")
	offender, bystander := sleeper(t, cg), sleeper(t, cg)
	pid := offender.Process.Pid
	start, err := controlblock.StartTime("/proc", pid)
	if err != nil {
		t.Fatal(err)
	}
	r := responder(t, Kill)
	r.Check(inBreach(cg.Rel, agentapi.Process{PID: pid, StartTime: start + 1}))
	if got := kinds(r); !slices.Equal(got, []string{"breach"}) {
		t.Fatalf("a process of another start time: events %v, want the breach only", got)
	}
	r.Check(nil) // the breach ends, so its return is acted on
	r.Check(inBreach(cg.Rel, agentapi.Process{PID: pid, StartTime: start}))
	if err := offender.Wait(); err == nil || offender.ProcessState.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the offender ended with %v, want SIGKILL", err)
	}
	evs := r.Events()
	if last := evs[len(evs)-1]; last.Kind != "killed" || !slices.Equal(last.PIDs, []int{pid}) {
		t.Errorf("last event %+v, want killed %d", last, pid)
	}
	if err := bystander.Process.Signal(syscall.Signal(0)); err != nil {
		t.Errorf("the bystander was killed too: %v", err)
	}
}
