package hostcgroup_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gpuwarden/gpuwarden/enforcer/hostcgroup"
	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

// The layouts a host shows in /proc/<pid>/cgroup.
const (
	pureV2 = "0::/kubepods.slice/pod1/cri-containerd-abc.scope\n"
	hybrid = "12:pids:/system.slice/x.service\n" +
		"11:memory:/system.slice/x.service\n" +
		"1:name=systemd:/system.slice/x.service\n" +
		"0::/gpuwarden-test/box\n"
	v1Only = "12:pids:/docker/abc\n11:memory:/docker/abc\n1:name=systemd:/docker/abc\n"
)

// cases are inputs and the path the rule gives, or "" for an error; the C
// parser is held to the same answers (TestParseMatchesC).
var cases = []struct {
	name, in, want string
}{
	{"pure v2", pureV2, "/kubepods.slice/pod1/cri-containerd-abc.scope"},
	{"pure v2, root", "0::/\n", "/"},
	{"pure v2, no final newline", "0::/a", "/a"},
	{"hybrid: the v2 line, not the first", hybrid, "/gpuwarden-test/box"},
	{"hybrid, v2 line first", "0::/b\n4:memory:/a\n", "/b"},
	{"hybrid, v2 at its root beside v1 paths", "4:memory:/process_api/x\n0::/\n", "/"},
	{"v1 path holding colons", "4:memory:/a:b:c\n0::/x:y\n", "/x:y"},
	{"outside the namespace root", "0::/../../kubepods/x\n", "/../../kubepods/x"},
	{"only outside the namespace root", "0::/..\n", "/.."},
	{"names with odd bytes", "0::/a b/\tc/%41/\xff/.hidden/..x\n", "/a b/\tc/%41/\xff/.hidden/..x"},
	{"longest path", "0::/" + strings.Repeat("a", hostcgroup.PathMax-1) + "\n", "/" + strings.Repeat("a", hostcgroup.PathMax-1)},
	{"long v1 line before the v2 one", "4:memory:/" + strings.Repeat("x", 9000) + "0::/victim\n0::/me\n", "/me"},

	{"v1 only", v1Only, ""},
	{"empty", "", ""},
	{"only a newline", "\n", ""},
	{"blank line", "0::/a\n\n", ""},
	{"blank line between", "4:cpu:/\n\n0::/a\n", ""},
	{"no colons", "garbage\n0::/a\n", ""},
	{"one colon", "4:cpu\n0::/a\n", ""},
	{"hierarchy not a number", "x:cpu:/\n0::/a\n", ""},
	{"hierarchy empty", ":cpu:/\n0::/a\n", ""},
	{"hierarchy too long", "12345678901:cpu:/\n0::/a\n", ""},
	{"v1 line without controllers", "4::/\n0::/a\n", ""},
	{"hierarchy 0 with controllers", "0:cpu:/a\n", ""},
	{"v2 line with leading zeros", "00::/a\n", ""},
	{"two v2 lines", "0::/a\n0::/b\n", ""},
	{"a forged v2 line after the real one", "0::/me\n0::/victim\n", ""},
	{"a forged v2 line inside a v1 name", "4:memory:/x\n0::/victim\n0::/me\n", ""},
	{"relative path", "0::kubepods/x\n", ""},
	{"empty path", "0::\n", ""},
	{"dot-dot after a name", "0::/a/../b\n", ""},
	{"dot-dot at the end", "0::/a/..\n", ""},
	{"dot component", "0::/a/./b\n", ""},
	{"empty component", "0::/a//b\n", ""},
	{"trailing slash", "0::/a/\n", ""},
	{"double slash alone", "0:://\n", ""},
	{"path one byte too long", "0::/" + strings.Repeat("a", hostcgroup.PathMax) + "\n", ""},
	{"NUL byte", "0::/a\x00b\n", ""},
	{"NUL in a v1 line", "4:cpu:/\x00\n0::/a\n", ""},
	{"carriage return line end", "0::/a\r\n", "/a\r"},
	{"file over the limit", "0::/a\n" + strings.Repeat("4:cpu:/"+strings.Repeat("x", 4000)+"\n", 70), ""},
}

func TestParse(t *testing.T) {
	for _, c := range cases {
		got, err := hostcgroup.Parse([]byte(c.in))
		switch {
		case c.want == "" && err == nil:
			t.Errorf("%s: Parse = %.80q, want an error", c.name, got)
		case c.want != "" && (err != nil || got != c.want):
			t.Errorf("%s: Parse = %.80q, %v; want %.80q", c.name, got, err, c.want)
		case err != nil && strings.Contains(err.Error(), "\n"):
			t.Errorf("%s: the error is not one line: %q", c.name, err)
		}
	}
}

// On a cgroup v1-only host the error says so and names the file; it is
// never a v1 path.
func TestV1OnlyIsAnError(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "42"), 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "42", "cgroup")
	if err := os.WriteFile(file, []byte(v1Only), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := hostcgroup.Of(dir, 42)
	if err == nil {
		t.Fatalf("Of = %q on a v1-only host, want an error", p)
	}
	if !errors.Is(err, hostcgroup.ErrNoV2) {
		t.Errorf("error %v is not ErrNoV2", err)
	}
	for _, want := range []string{file, "only cgroup v1", "3 v1 hierarchies"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

func TestOfFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(pid, body string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(dir, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, pid, "cgroup"), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("1", hybrid)
	write("2", "0::/a\n0::/b\n")
	if p, err := hostcgroup.Of(dir, 1); err != nil || p != "/gpuwarden-test/box" {
		t.Errorf("Of(hybrid) = %q, %v; want /gpuwarden-test/box", p, err)
	}
	if _, err := hostcgroup.Of(dir, 2); err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "2", "cgroup")) {
		t.Errorf("Of(two v2 lines) error %v, want one naming the file", err)
	}
	if _, err := hostcgroup.Of(dir, 3); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Of(a process that is gone) error %v, want one that is os.ErrNotExist", err)
	}
}

// FuzzParse holds Parse to what a success promises: an absolute, clean
// path from the input's one "0::" line.
func FuzzParse(f *testing.F) {
	for _, c := range cases {
		if len(c.in) < 8192 {
			f.Add([]byte(c.in))
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := hostcgroup.Parse(b)
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("error on more than one line: %q", err)
			}
			return
		}
		lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
		n := 0
		for _, l := range lines {
			if strings.HasPrefix(l, "0::") {
				n++
				if l[3:] != p {
					t.Fatalf("Parse = %q, but the v2 line is %q", p, l)
				}
			}
		}
		if n != 1 || !strings.HasPrefix(p, "/") || len(p) > hostcgroup.PathMax {
			t.Fatalf("Parse(%q) = %q, not one absolute v2 path", b, p)
		}
		named := false
		for i, c := range strings.Split(p[1:], "/") {
			if (c == "" && p != "/") || c == "." || (c == ".." && named) {
				t.Fatalf("Parse(%q) = %q: component %d is %q", b, p, i, c)
			}
			named = named || c != ".."
		}
	})
}

// TestParseMatchesC runs the interposer's parser (gw-envcheck --cgroup) on
// every case: both take the same path, or both refuse.
func TestParseMatchesC(t *testing.T) {
	bin := simtest.Bin(t, "interposer/gw-envcheck")
	dir := t.TempDir()
	for i, c := range cases {
		file := filepath.Join(dir, "cgroup")
		if err := os.WriteFile(file, []byte(c.in), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(bin, "--cgroup", file).Output()
		if err != nil {
			t.Fatalf("gw-envcheck --cgroup (case %d): %v", i, err)
		}
		got := strings.TrimSuffix(string(out), "\n")
		goPath, goErr := hostcgroup.Parse([]byte(c.in))
		switch {
		case goErr != nil && !strings.HasPrefix(got, "error "+file+": "):
			t.Errorf("%s: C %.80q, Go refuses (%v)", c.name, got, goErr)
		case goErr == nil && got != "ok "+goPath:
			t.Errorf("%s: C %.80q, Go %.80q", c.name, got, goPath)
		}
	}
}

func TestHostPath(t *testing.T) {
	for _, tc := range []struct{ root, p, want string }{
		{"/", "/kubepods/pod1/c1", "/kubepods/pod1/c1"},
		{"/kubepods/podA/agent", "/", "/kubepods/podA/agent"},
		{"/kubepods/podA/agent", "/../../podB/c2", "/kubepods/podB/c2"},
		{"/kubepods/podA/agent", "/../../../system.slice/x.service", "/system.slice/x.service"},
	} {
		if got := hostcgroup.HostPath(tc.root, tc.p); got != tc.want {
			t.Errorf("HostPath(%q, %q) = %q, want %q", tc.root, tc.p, got, tc.want)
		}
	}
}

func TestWithin(t *testing.T) {
	for _, tc := range []struct {
		p, root string
		want    bool
	}{
		{"/kubepods/pod1/c1", "/", true},
		{"/kubepods/pod1/c1", "/kubepods", true},
		{"/kubepods", "/kubepods", true},
		{"/kubepods/", "/kubepods", true},
		{"/kubepods.slice/x", "/kubepods", false},
		{"/system.slice", "/kubepods", false},
		{"/", "/kubepods", false},
	} {
		if got := hostcgroup.Within(tc.p, tc.root); got != tc.want {
			t.Errorf("Within(%q, %q) = %v, want %v", tc.p, tc.root, got, tc.want)
		}
	}
}

// On this machine's layout (hybrid here: v1 controllers and v2 at
// /sys/fs/cgroup/unified; pure v2 elsewhere) a process placed into a fresh
// v2 cgroup is read there, whatever its v1 lines say.
func TestOfPlacedProcess(t *testing.T) {
	cg := simtest.NewCgroup(t, "hostcgroup")
	mnt, err := hostcgroup.Mount("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	cmd := cg.Place(exec.Command("sleep", "30"))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	raw, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(cmd.Process.Pid), "cgroup"))
	if err != nil {
		t.Fatal(err)
	}
	v1 := strings.Count(string(raw), "\n") - 1
	t.Logf("cgroup2 at %s, %d v1 hierarchies beside it", mnt, v1)
	if strings.HasSuffix(mnt, "/unified") && v1 == 0 {
		t.Errorf("cgroup2 at %s (a hybrid host) but no v1 line in %q", mnt, raw)
	}
	if p, err := hostcgroup.Of("/proc", cmd.Process.Pid); err != nil || p != cg.Rel {
		t.Errorf("Of = %q, %v; want %q", p, err, cg.Rel)
	}
}
