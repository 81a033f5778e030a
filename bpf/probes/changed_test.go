package probes

import (
	"io"
	"os/exec"
	"testing"
	"time"

	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

// Changed names a process that maps a library (dlopen, here bash loading a
// builtin) and one that exits, and not one that only waits.
func TestChangedNamesProcesses(t *testing.T) {
	simtest.RequirePrivileged(t, "eBPF kprobes")
	p, err := Open("", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if p.mapping == nil {
		t.Skip("this kernel has no mmap_lock_released tracepoint: scans check every process")
	}
	cmd := exec.Command("bash", "-c", "read a; enable -f libm.so.6 nosuch 2>/dev/null; read b")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	pid := cmd.Process.Pid
	named := func() bool {
		t.Helper()
		pids, all, err := p.Changed()
		if err != nil || all {
			t.Fatalf("Changed: all %v, %v", all, err)
		}
		return pids[pid]
	}
	if !named() {
		t.Error("a process that exec'd is not named")
	}
	time.Sleep(200 * time.Millisecond) // its start's last mappings
	named()
	if named() {
		t.Error("a waiting process is named")
	}
	if _, err := io.WriteString(in, "go\n"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !named() {
		if time.Now().After(deadline) {
			t.Fatal("a process that loaded a library is not named")
		}
		time.Sleep(20 * time.Millisecond)
	}
	in.Close()
	_ = cmd.Wait()
	if !named() {
		t.Error("a process that exited is not named")
	}
}
