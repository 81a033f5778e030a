package main

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/hostcgroup"
	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

type readyz struct {
	Ready bool `json:"ready"`
	Parts map[string]struct {
		Enabled, Up bool
		Error       string
	} `json:"parts"`
}

func getReadyz(t *testing.T, a *simtest.Agent) (int, readyz) {
	code, body := a.Get(t, "/readyz")
	var r readyz
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatalf("/readyz %d %s: %v", code, body, err)
	}
	return code, r
}

// TestAgentFindsCgroupTreeBelowPathsCgroup: paths.cgroup names the directory
// the host's cgroup filesystems are mounted in (as the chart mounts the
// host's /sys/fs/cgroup); the agent finds the cgroup v2 tree at it or below
// it (on a hybrid host, its unified directory) and lists the containers.
func TestAgentFindsCgroupTreeBelowPathsCgroup(t *testing.T) {
	simtest.RequirePrivileged(t, "cgroups")
	mnt, err := hostcgroup.Mount("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	m := simtest.NewMachine(t, 1, "8Gi")
	cg := simtest.NewCgroup(t, "below")
	w := simtest.Start(t, cg.Place(m.Command(simtest.Bin(t, "simgpu/workload"), "--alloc", "1Gi", "--hold")))
	w.WaitLine(t, "ready", 10*time.Second)
	agent := simtest.StartAgent(t, m, "GPUWARDEN_EBPF_ENABLED=false", "GPUWARDEN_PATHS_CGROUP="+filepath.Dir(mnt))
	t.Cleanup(func() { agent.Kill(t) }) // a clean stop is not what this test is about
	simtest.Eventually(t, 15*time.Second, func() error {
		f := agent.Scrape(t)
		if s, ok := simtest.Find(f, "gpuwarden_container_gpu_memory_used_bytes", map[string]string{"container": cg.Rel}); !ok || s.Value < gib {
			return fmt.Errorf("memory used of %s: %v, %v; series: %v", cg.Rel, s.Value, ok, f["gpuwarden_container_gpu_memory_used_bytes"])
		}
		return nil
	})
	if code, r := getReadyz(t, agent); code != 200 || !r.Parts["cgroups"].Up {
		t.Errorf("/readyz = %d %+v; want cgroups up", code, r)
	}
}

// TestAgentReadyzCgroupsDownOnWrongTree: a cgroup2 mount that holds none of
// the GPU processes (here a bind mount of an unrelated subtree, as a wrong
// paths.cgroup gives) leaves every container unseen: /readyz says the
// cgroups part is down, and why.
func TestAgentReadyzCgroupsDownOnWrongTree(t *testing.T) {
	simtest.RequirePrivileged(t, "cgroups and mounts")
	m := simtest.NewMachine(t, 1, "8Gi")
	cg, other := simtest.NewCgroup(t, "gpu-user"), simtest.NewCgroup(t, "elsewhere")
	wrong := t.TempDir()
	if err := syscall.Mount(other.Path, wrong, "", syscall.MS_BIND, ""); err != nil {
		t.Fatalf("bind %s: %v", other.Path, err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(wrong, syscall.MNT_DETACH) })
	w := simtest.Start(t, cg.Place(m.Command(simtest.Bin(t, "simgpu/workload"), "--alloc", "1Gi", "--hold")))
	w.WaitLine(t, "ready", 10*time.Second)
	agent := simtest.StartAgent(t, m, "GPUWARDEN_EBPF_ENABLED=false", "GPUWARDEN_PATHS_CGROUP="+wrong)
	t.Cleanup(func() { agent.Kill(t) }) // a clean stop is not what this test is about
	code, r := getReadyz(t, agent)
	if c := r.Parts["cgroups"]; code != 503 || r.Ready || !c.Enabled || c.Up ||
		!strings.Contains(c.Error, "none of 1 GPU processes is in the cgroup v2 tree at "+wrong) {
		t.Errorf("/readyz = %d %+v; want 503, cgroups down naming %s", code, r, wrong)
	}
	// Once the process is gone, nothing is left unplaced.
	if err := w.Cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_, _ = w.Wait()
	simtest.Eventually(t, 10*time.Second, func() error {
		if _, r := getReadyz(t, agent); !r.Parts["cgroups"].Up {
			return fmt.Errorf("cgroups still down: %+v", r.Parts["cgroups"])
		}
		return nil
	})
}
