// Package bpftest holds what the eBPF tests share: a bpffs directory per
// test (simtest.AllocProg drives cuda-alloc).
package bpftest

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

// PinDir returns an empty pin directory for the test on bpffs, removed when
// the test ends: under /sys/fs/bpf when that is bpffs, else on a private
// bpffs instance mounted for the test (machines that mount none there).
func PinDir(t testing.TB) string {
	t.Helper()
	simtest.RequirePrivileged(t, "eBPF")
	name := fmt.Sprintf("gpuwarden-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	var st unix.Statfs_t
	if unix.Statfs("/sys/fs/bpf", &st) == nil && st.Type == unix.BPF_FS_MAGIC {
		dir := filepath.Join("/sys/fs/bpf", name)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		return dir
	}
	mnt := t.TempDir()
	if err := unix.Mount("bpf", mnt, "bpf", 0, "mode=0700"); err != nil {
		t.Fatalf("/sys/fs/bpf is not bpffs, and mounting a bpffs for the test failed: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount test bpffs: %v", err)
		}
	})
	return filepath.Join(mnt, name)
}
