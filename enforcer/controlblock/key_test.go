package controlblock

import (
	"os"
	"os/exec"
	"strings"
	"testing"

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

// TestKeyMatchesC checks the interposer's key rule gives the same names.
func TestKeyMatchesC(t *testing.T) {
	bin := simtest.Bin(t, "interposer/gw-envcheck")
	paths := []string{"/" + strings.Repeat("abc/", 80), "/" + strings.Repeat("%", 70), "/x/" + strings.Repeat("é", 120)}
	for in := range keyCases {
		if in != "" {
			paths = append(paths, in)
		}
	}
	if own, err := CgroupOf("/proc", os.Getpid()); err == nil {
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
