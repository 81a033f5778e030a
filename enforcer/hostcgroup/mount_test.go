package hostcgroup_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuwarden/gpuwarden/enforcer/hostcgroup"
)

func TestMountUnder(t *testing.T) {
	tests := []struct {
		name, file, dir string
		want, err       string
	}{
		{"pure v2", "mountinfo-v2", "/", "/sys/fs/cgroup", ""},
		{"pure v2, its mount named", "mountinfo-v2", "/sys/fs/cgroup", "/sys/fs/cgroup", ""},
		{"hybrid", "mountinfo-hybrid", "/", "/sys/fs/cgroup/unified", ""},
		{"hybrid, the cgroup directory named", "mountinfo-hybrid", "/sys/fs/cgroup", "/sys/fs/cgroup/unified", ""},
		{"hybrid, the v2 mount named", "mountinfo-hybrid", "/sys/fs/cgroup/unified", "/sys/fs/cgroup/unified", ""},
		{"the chart's mount on a hybrid host", "mountinfo-pod-hybrid", "/host/sys/fs/cgroup", "/host/sys/fs/cgroup/unified", ""},
		{"the chart's mount on a v2 host", "mountinfo-pod-v2", "/host/sys/fs/cgroup", "/host/sys/fs/cgroup", ""},
		{"a pod's own view is its namespaced mount", "mountinfo-pod-hybrid", "/", "/sys/fs/cgroup", ""},
		{"an escaped mount point", "mountinfo-pod-hybrid", "/host/my root", "/host/my root/cg", ""},
		{"a prefix is a directory, not a string prefix", "mountinfo-pod-hybrid", "/host/sys/fs/cg", "", "no cgroup2 mount at or under /host/sys/fs/cg"},
		{"v1 only under dir", "mountinfo-hybrid", "/sys/fs/cgroup/cpu", "", "no cgroup2 mount"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := hostcgroup.MountUnder(filepath.Join("testdata", tt.file), tt.dir)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("MountUnder(%s, %q) = %q, %v; want an error with %q", tt.file, tt.dir, got, err, tt.err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("MountUnder(%s, %q) = %q, %v; want %q", tt.file, tt.dir, got, err, tt.want)
			}
		})
	}
}

func TestMountErrors(t *testing.T) {
	f := t.TempDir() + "/mountinfo"
	if err := os.WriteFile(f, []byte("22 1 0:21 / /proc rw - proc proc rw\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := hostcgroup.Mount(f); err == nil {
		t.Error("a mountinfo without cgroup2 gave no error")
	}
	if _, err := hostcgroup.Mount(f + ".missing"); err == nil {
		t.Error("a missing mountinfo gave no error")
	}
}
