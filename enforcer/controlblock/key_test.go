package controlblock

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/gpuwarden/gpuwarden/enforcer/hostcgroup"
	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

var keyCases = map[string]string{
	"/":    "root",
	"":     "root",
	"/a/b": "a+b",
	"/kubepods.slice/kubepods-burstable.slice/cri-containerd-0a1b.scope": "kubepods.slice+kubepods-burstable.slice+cri-containerd-0a1b.scope",
	"/.hidden":  "%2Ehidden",
	"/a+b c%":   "a%2Bb%20c%25",
	"/docker/ü": "docker+%C3%BC",
}

func TestContainerKey(t *testing.T) {
	for in, want := range keyCases {
		if got := ContainerKey(in); got != want {
			t.Errorf("ContainerKey(%q) = %q, want %q", in, got, want)
		}
	}
	long := ContainerKey("/" + strings.Repeat("abc/", 80))
	if len(long) != 200 || long[183] != '~' {
		t.Errorf("long key %q (%d bytes)", long, len(long))
	}
	if ContainerKey("/"+strings.Repeat("abc/", 80)) == ContainerKey("/"+strings.Repeat("abc/", 80)+"x") {
		t.Error("long keys of different paths collide")
	}
}

// TestKeyPath: a key's cgroup path is found again, except where the key
// was truncated or is no key at all.
func TestKeyPath(t *testing.T) {
	for in, key := range keyCases {
		if in == "" {
			continue
		}
		if got, ok := KeyPath(key); !ok || got != in {
			t.Errorf("KeyPath(%q) = %q, %v; want %q", key, got, ok, in)
		}
	}
	for _, key := range []string{ContainerKey("/" + strings.Repeat("abc/", 80)), "a%2", "a%zz", "a b", ".a", "a%2bb"} {
		if got, ok := KeyPath(key); ok {
			t.Errorf("KeyPath(%q) = %q: want no path", key, got)
		}
	}
}

// FuzzKeyPath: a path KeyPath gives escapes back to the same key.
func FuzzKeyPath(f *testing.F) {
	for _, key := range keyCases {
		f.Add(key)
	}
	f.Add("a%2")
	f.Fuzz(func(t *testing.T, key string) {
		if p, ok := KeyPath(key); ok && ContainerKey(p) != key {
			t.Fatalf("KeyPath(%q) = %q, whose key is %q", key, p, ContainerKey(p))
		}
	})
}

// TestKeyMatchesC checks the interposer's key rule gives the same names.
func TestKeyMatchesC(t *testing.T) {
	bin := simtest.Bin(t, "interposer/gw-envcheck")
	paths := []string{"/" + strings.Repeat("abc/", 80), "/" + strings.Repeat("%", 70), "/x/" + strings.Repeat("é", 120)}
	for in := range keyCases {
		if in != "" {
			paths = append(paths, in)
		}
	}
	if own, err := hostcgroup.Of("/proc", os.Getpid()); err == nil {
		paths = append(paths, own)
	}
	for _, p := range paths {
		out, err := exec.Command(bin, "--key", p).Output()
		if err != nil {
			t.Fatalf("gw-envcheck --key %q: %v", p, err)
		}
		if c, g := strings.TrimSpace(string(out)), ContainerKey(p); c != g {
			t.Errorf("key of %q: C %q, Go %q", p, c, g)
		}
	}
}
