package interposer_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
	"github.com/gpuwarden/gpuwarden/enforcer/hostcgroup"
	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

// TestCgroupAsGoReadsIt: a process placed into a fresh cgroup of the v2
// hierarchy (/sys/fs/cgroup/unified on this hybrid machine, /sys/fs/cgroup
// on a cgroup v2 one) is in the cgroup the agent's reader (hostcgroup.Of)
// names, as the interposer sees it: its control directory is that path's
// key and its ledger names that path and cgroup. The long path (over the
// ledger's 512 bytes) is where a key from a cut path would differ; the
// ledger names no path then, rather than a cut one (which, cut inside a
// UTF-8 character, the agent would take for a forged ledger).
func TestCgroupAsGoReadsIt(t *testing.T) {
	for _, c := range []struct {
		name string
		sub  func(parent string) string
	}{
		{"short", func(string) string { return "c" }},
		{"long", func(string) string {
			return strings.Repeat("a", 200) + "/" + strings.Repeat("b", 200) + "/" + strings.Repeat("c", 200)
		}},
		{"long-utf8", func(parent string) string {
			// "é" is two bytes, each starting at an even offset of the
			// path: the 511-byte cut falls inside one.
			pad := strings.Repeat("x", (len(parent)+1)%2)
			return pad + strings.Repeat("é", 100) + "/" + strings.Repeat("é", 100) + "/" + strings.Repeat("é", 100)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := newBox(t, 1, "16Gi")
			parent := simtest.NewCgroup(t, "hostcgroup")
			b.cg = simtest.NestedCgroup(t, parent, c.sub(parent.Rel))

			sleeper := b.cg.Place(exec.Command("sleep", "30"))
			if err := sleeper.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = sleeper.Process.Kill(); _ = sleeper.Wait() }()
			goPath, err := hostcgroup.Of("/proc", sleeper.Process.Pid)
			if err != nil || goPath != b.cg.Rel {
				t.Fatalf("hostcgroup.Of = %q, %v; want %q", goPath, err, b.cg.Rel)
			}

			b.key = controlblock.ContainerKey(goPath)
			b.run("init").expect(t, "init CUDA_SUCCESS")
			entries, err := os.ReadDir(b.ctl)
			if err != nil {
				t.Fatal(err)
			}
			if len(entries) != 1 || entries[0].Name() != b.key {
				var names []string
				for _, e := range entries {
					names = append(names, e.Name())
				}
				t.Fatalf("control directories %q, want only %q", names, b.key)
			}
			want := goPath
			if len(want) > controlblock.CgroupPathMax-1 {
				want = ""
			}
			s := b.ledger()
			if s.CgroupPath != want || s.CgroupID != b.cg.ID {
				t.Errorf("ledger names %q (id %d), want %q (id %d)", s.CgroupPath, s.CgroupID, want, b.cg.ID)
			}
			if len(s.Problems) > 0 {
				t.Errorf("the agent reads the ledger as malformed: %v", s.Problems)
			}
		})
	}
}

// TestCgroupOutsideNamespaceRoot: a process moved out of its cgroup
// namespace's root sees its cgroup as "/../memory". Joined to the cgroup2
// mount, that path leaves it (on this hybrid host, for the v1 memory
// hierarchy beside it): the ledger names no cgroup id rather than that
// directory's.
func TestCgroupOutsideNamespaceRoot(t *testing.T) {
	simtest.RequirePrivileged(t, "a cgroup namespace")
	b := newBox(t, 1, "16Gi")
	parent := simtest.NewCgroup(t, "cgns")
	b.cg = simtest.NestedCgroup(t, parent, "root")
	outside := simtest.NestedCgroup(t, parent, "memory")
	// unshare execs sh, which execs gw-check: one pid throughout.
	cmd := b.command("unshare", "--cgroup", "sh", "-c", `echo ready; read go; exec "$0" init`,
		simtest.Bin(t, "interposer/gw-check"))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := simtest.Start(t, cmd)
	p.WaitLine(t, "ready", 10*time.Second)
	if err := os.WriteFile(filepath.Join(outside.Path, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := stdin.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	if out, err := p.Wait(); err != nil || !strings.Contains(out, "init CUDA_SUCCESS") {
		t.Fatalf("gw-check init: %v; stdout %q, stderr %q", err, out, p.Stderr())
	}
	b.key = controlblock.ContainerKey("/../memory")
	if s := b.ledger(); s.CgroupID != 0 && s.CgroupID != outside.ID {
		t.Errorf("ledger names cgroup id %d, want 0 (unknown) or the process's own (%d)", s.CgroupID, outside.ID)
	}
}

// TestCgroupV1OnlyFailsClosed: where /proc/self/cgroup has no v2 line (a
// cgroup v1-only host, shown here by a file mounted over it) every hook
// fails, with one line that names the file and the layout; no v1 path
// becomes a control directory.
func TestCgroupV1OnlyFailsClosed(t *testing.T) {
	simtest.RequirePrivileged(t, "a mount namespace")
	b := newBox(t, 1, "16Gi")
	fake := t.TempDir() + "/cgroup"
	if err := os.WriteFile(fake, []byte("4:memory:/docker/abc\n1:name=systemd:/docker/abc\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The shell's pid is gw-check's: exec keeps it.
	cmd := b.command("unshare", "-m", "sh", "-c", `mount --bind "$1" /proc/$$/cgroup && exec "$2" init`, "sh",
		fake, simtest.Bin(t, "interposer/gw-check"))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	r := result{lines: strings.Split(strings.TrimSpace(string(out)), "\n"), stderr: stderr.String(), err: err}
	r.expect(t, "init CUDA_ERROR_NOT_PERMITTED")
	lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], "/proc/self/cgroup") || !strings.Contains(lines[0], "only cgroup v1") {
		t.Errorf("stderr %q, want one line naming /proc/self/cgroup and the v1-only layout", r.stderr)
	}
	if entries, _ := os.ReadDir(b.ctl); len(entries) != 0 {
		t.Errorf("a control directory was made: %v", entries)
	}
}
