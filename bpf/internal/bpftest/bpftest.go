// Package bpftest holds what the eBPF tests share: a bpffs directory per
// test, and the cuda-alloc program driven line by line.
package bpftest

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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

// Prog is a running cuda-alloc.
type Prog struct {
	P     *simtest.Proc
	stdin io.WriteCloser
	lines *bufio.Scanner
}

// StartProg starts cmd (cuda-alloc or a copy), waiting for its "ready".
func StartProg(t testing.TB, cmd *exec.Cmd) *Prog {
	t.Helper()
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &Prog{P: simtest.Start(t, cmd), stdin: in}
	p.P.WaitLine(t, "ready", 20*time.Second)
	return p
}

// Do sends a command and returns its reply's fields after "ok", failing the
// test on "err".
func (p *Prog) Do(t testing.TB, format string, args ...any) []string {
	t.Helper()
	reply := p.Try(t, format, args...)
	if reply[0] != "ok" {
		t.Fatalf("cuda-alloc %q: %s; stderr: %s", fmt.Sprintf(format, args...), strings.Join(reply, " "), p.P.Stderr())
	}
	return reply[1:]
}

// Try sends a command and returns its whole reply ("ok ..." or "err N").
func (p *Prog) Try(t testing.TB, format string, args ...any) []string {
	t.Helper()
	cmd := fmt.Sprintf(format, args...)
	if _, err := fmt.Fprintln(p.stdin, cmd); err != nil {
		t.Fatalf("cuda-alloc %q: %v; stderr: %s", cmd, err, p.P.Stderr())
	}
	line := p.P.WaitLine(t, "", 60*time.Second)
	return strings.Fields(line)
}

// Quit asks the program to exit and waits for it.
func (p *Prog) Quit(t testing.TB) {
	t.Helper()
	fmt.Fprintln(p.stdin, "quit")
	p.stdin.Close()
	if _, err := p.P.Wait(); err != nil {
		t.Fatalf("cuda-alloc: %v; stderr: %s", err, p.P.Stderr())
	}
}
