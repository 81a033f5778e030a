package simtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/hostcgroup"
)

// Cgroup is a cgroup v2 group made for one test: a "container".
type Cgroup struct {
	Path string // absolute path under the cgroup2 mount
	Rel  string // path relative to the mount, as /proc/<pid>/cgroup shows it ("/gpuwarden-test/...")
	ID   uint64 // the cgroup id (its directory's inode), as bpf_get_current_cgroup_id returns
	fd   int
}

// cgroupRoot holds every test's cgroups.
const cgroupRoot = "/gpuwarden-test"

// NewCgroup makes a cgroup for the test, removed (its processes killed) when
// the test ends. It needs root.
func NewCgroup(t testing.TB, name string) *Cgroup {
	t.Helper()
	RequirePrivileged(t, "cgroups")
	mnt, err := hostcgroup.Mount("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	rel := fmt.Sprintf("%s/%s-%d-%d", cgroupRoot, name, os.Getpid(), time.Now().UnixNano())
	path := filepath.Join(mnt, rel)
	if err := os.MkdirAll(path, 0o755); err != nil {
		t.Fatalf("make cgroup: %v", err)
	}
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("open cgroup: %v", err)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		t.Fatalf("stat cgroup: %v", err)
	}
	c := &Cgroup{Path: path, Rel: rel, ID: st.Ino, fd: fd}
	t.Cleanup(func() { c.remove(t) })
	return c
}

// OpenCgroup is a cgroup the test made itself (made again under an old
// name, say) and removes itself: its directory is held open for Place
// until the test ends.
func OpenCgroup(t testing.TB, path, rel string) *Cgroup {
	t.Helper()
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("open cgroup: %v", err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		t.Fatalf("stat cgroup: %v", err)
	}
	return &Cgroup{Path: path, Rel: rel, ID: st.Ino, fd: fd}
}

// NestedCgroup makes the cgroup sub (one level or more) below parent, as a
// container with cgroup delegation or the kubelet's layout would, and
// removes it, deepest level first, before parent is removed.
func NestedCgroup(t testing.TB, parent *Cgroup, sub string) *Cgroup {
	t.Helper()
	path := filepath.Join(parent.Path, sub)
	if err := os.MkdirAll(path, 0o755); err != nil {
		t.Fatalf("make cgroup: %v", err)
	}
	t.Cleanup(func() { // after its descriptor is closed, before the parent's removal
		_ = os.WriteFile(filepath.Join(path, "cgroup.kill"), []byte("1"), 0)
		for dir := path; dir != parent.Path; dir = filepath.Dir(dir) {
			for i := 0; i < 100; i++ {
				if err := os.Remove(dir); err == nil || os.IsNotExist(err) {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
	})
	return OpenCgroup(t, path, parent.Rel+"/"+sub)
}

// Place makes cmd start inside the cgroup (clone3 with CLONE_INTO_CGROUP), so
// the process is in it from its first instruction.
func (c *Cgroup) Place(cmd *exec.Cmd) *exec.Cmd {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.UseCgroupFD = true
	cmd.SysProcAttr.CgroupFD = c.fd
	return cmd
}

// Pids lists the processes in the cgroup.
func (c *Cgroup) Pids() []string {
	b, _ := os.ReadFile(filepath.Join(c.Path, "cgroup.procs"))
	return strings.Fields(string(b))
}

func (c *Cgroup) remove(t testing.TB) {
	_ = os.WriteFile(filepath.Join(c.Path, "cgroup.freeze"), []byte("0"), 0)
	_ = os.WriteFile(filepath.Join(c.Path, "cgroup.kill"), []byte("1"), 0)
	syscall.Close(c.fd)
	for i := 0; i < 100; i++ {
		if err := os.Remove(c.Path); err == nil || os.IsNotExist(err) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Errorf("cgroup %s could not be removed; processes left: %v", c.Path, c.Pids())
}
