package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuwarden/gpuwarden/enforcer/agentapi"

	"github.com/gpuwarden/gpuwarden/collector"
)

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
	r := &breaches{a: &Agent{nsRoot: "/"}}
	r.a.cfg.Paths.Proc = proc
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
	var w breachWatch
	w.init()
	view := func(reasons ...string) *collector.View {
		c := agentapi.ContainerDevice{CgroupPath: "/a"}
		for _, r := range reasons {
			c.Breaches = append(c.Breaches, agentapi.Breach{Reason: r})
		}
		return &collector.View{Containers: []agentapi.ContainerDevice{c}}
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
