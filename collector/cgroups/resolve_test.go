package cgroups_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/gpuwarden/gpuwarden/collector/cgroups"
	"github.com/gpuwarden/gpuwarden/enforcer/hostcgroup"
	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

func TestResolverFindsTestCgroup(t *testing.T) {
	cg := simtest.NewCgroup(t, "resolve")
	mnt, err := hostcgroup.Mount("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	r := cgroups.NewResolver(mnt)
	got, ok := r.Path(cg.ID)
	if !ok || got != cg.Rel {
		t.Fatalf("Path(%d) = %q, %v; want %q", cg.ID, got, ok, cg.Rel)
	}
	if id, err := r.ID(cg.Rel); err != nil || id != cg.ID {
		t.Errorf("ID(%q) = %d, %v; want %d", cg.Rel, id, err, cg.ID)
	}
	if _, ok := r.Path(1 << 62); ok {
		t.Error("an id no cgroup has resolved to a path")
	}
	gone := simtest.NewCgroup(t, "gone")
	if _, ok := r.Path(gone.ID); ok {
		t.Error("a cgroup made after the last walk resolved before the walk interval passed")
	}
	time.Sleep(1100 * time.Millisecond)
	if p, ok := r.Path(gone.ID); !ok || p != gone.Rel {
		t.Fatalf("Path(new cgroup) = %q, %v; want %q", p, ok, gone.Rel)
	}
	if err := os.Remove(gone.Path); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3100 * time.Millisecond) // past the recheck interval
	if p, ok := r.Path(gone.ID); ok {
		t.Errorf("a removed cgroup still resolves to %q", p)
	}
}

// A removed cgroup's id (below one the walk found) is not walked for again;
// an id above every one found is: it may be a cgroup made since.
func TestResolverRemembersRemovedIDs(t *testing.T) {
	mnt, err := hostcgroup.Mount("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	removed := simtest.NewCgroup(t, "removed")
	newer := simtest.NewCgroup(t, "newer")
	r := cgroups.NewResolver(mnt)
	r.NoWait()
	if _, ok := r.Path(removed.ID); !ok {
		t.Fatal("a cgroup does not resolve")
	}
	if err := os.Remove(removed.Path); err != nil {
		t.Fatal(err)
	}
	if p, ok := r.Path(removed.ID); ok {
		t.Fatalf("a removed cgroup resolves to %q", p)
	}
	walked := r.Walked()
	if _, ok := r.Path(removed.ID); ok || r.Walked() != walked {
		t.Error("a removed cgroup's id was walked for again")
	}
	if p, ok := r.Path(newer.ID); !ok || p != newer.Rel {
		t.Errorf("Path(%d) = %q, %v; want %q", newer.ID, p, ok, newer.Rel)
	}
	walked = r.Walked()
	later := simtest.NewCgroup(t, "later")
	if p, ok := r.Path(later.ID); !ok || p != later.Rel || r.Walked() == walked {
		t.Errorf("a cgroup made after the walk: Path = %q, %v; want %q from a new walk", p, ok, later.Rel)
	}
}

// Outside a cgroup namespace the caller's own mount is the host tree's root.
func TestNamespaceRootOutsideNamespace(t *testing.T) {
	mnt, err := hostcgroup.Mount("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	root, err := cgroups.NamespaceRoot(cgroups.NewResolver(mnt), "/proc/self/mountinfo")
	if err != nil || root != "/" {
		t.Errorf("NamespaceRoot = %q, %v; want /", root, err)
	}
}

// TestCheckPlaced: a process in a test cgroup is placed in the cgroup v2
// tree and not in the directory a hybrid host mounts its v1 controllers on.
func TestCheckPlaced(t *testing.T) {
	cg := simtest.NewCgroup(t, "placed")
	mnt, err := hostcgroup.Mount("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	cmd := cg.Place(exec.Command("sleep", "30"))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	pids := []int{cmd.Process.Pid, 1 << 30} // the second is no process: it counts for nothing
	if err := cgroups.NewResolver(mnt).CheckPlaced("/proc", "/", pids); err != nil {
		t.Errorf("the cgroup v2 mount %s: %v", mnt, err)
	}
	if err := cgroups.NewResolver(mnt).CheckPlaced("/proc", "/", []int{1 << 30}); err != nil {
		t.Errorf("no live process reported: %v", err)
	}
	wrong := t.TempDir() // no cgroup tree: as /sys/fs/cgroup on a hybrid host
	err = cgroups.NewResolver(wrong).CheckPlaced("/proc", "/", pids)
	if err == nil || !strings.Contains(err.Error(), "none of 1 GPU processes is in the cgroup v2 tree at "+wrong) {
		t.Errorf("a root without the tree: %v", err)
	}
}
