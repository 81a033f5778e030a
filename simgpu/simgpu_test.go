package simgpu_test

import (
	"errors"
	"os/exec"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

// exitCode runs cmd to completion and returns its exit code.
func exitCode(t *testing.T, cmd *exec.Cmd) int {
	t.Helper()
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		t.Fatalf("%s: %v: %s", cmd, err, out)
	}
	return 0
}

// The workload exits 3 when an allocation fails with CUDA_ERROR_OUT_OF_MEMORY.
const exitOutOfMemory = 3

func TestProcessesShareOneDevice(t *testing.T) {
	m := simtest.NewMachine(t, 1, "16Gi")
	workload := simtest.Bin(t, "simgpu/workload")

	holder := simtest.Start(t, m.Command(workload, "--alloc", "10Gi", "--hold"))
	holder.WaitLine(t, "ready", 10*time.Second)

	// 10 GiB more does not fit beside the holder's 10 GiB, 4 GiB does.
	if code := exitCode(t, m.Command(workload, "--alloc", "10Gi", "--steps", "1")); code != exitOutOfMemory {
		t.Fatalf("second 10Gi allocation: exit %d, want %d (out of memory)", code, exitOutOfMemory)
	}
	if code := exitCode(t, m.Command(workload, "--alloc", "4Gi", "--steps", "1")); code != 0 {
		t.Fatalf("4Gi allocation beside the holder: exit %d, want 0", code)
	}
}

func TestKilledProcessMemoryReturns(t *testing.T) {
	m := simtest.NewMachine(t, 1, "16Gi")
	workload := simtest.Bin(t, "simgpu/workload")

	holder := simtest.Start(t, m.Command(workload, "--alloc", "12Gi", "--hold"))
	holder.WaitLine(t, "ready", 10*time.Second)
	if code := exitCode(t, m.Command(workload, "--alloc", "12Gi", "--steps", "1")); code != exitOutOfMemory {
		t.Fatalf("allocation while the holder lives: exit %d, want %d", code, exitOutOfMemory)
	}

	if err := holder.Cmd.Process.Kill(); err != nil { // SIGKILL: no chance to free anything
		t.Fatal(err)
	}
	_, _ = holder.Wait()
	if code := exitCode(t, m.Command(workload, "--alloc", "12Gi", "--steps", "1")); code != 0 {
		t.Fatalf("allocation after SIGKILL of the holder: exit %d, want 0 (its memory should be back)", code)
	}
}

var busyRe = regexp.MustCompile(`BENCH (\w+)_device_busy_ratio ([0-9.]+)`)

// busyRatio waits for a workload and returns its label and the share of the
// device it kept busy.
func busyRatio(t *testing.T, p *simtest.Proc) (string, float64) {
	t.Helper()
	out, err := p.Wait()
	if err != nil {
		t.Fatalf("workload: %v: %s", err, p.Stderr())
	}
	mm := busyRe.FindStringSubmatch(out)
	if mm == nil {
		t.Fatalf("no busy ratio in %q", out)
	}
	v, err := strconv.ParseFloat(mm[2], 64)
	if err != nil {
		t.Fatalf("busy ratio %q: %v", mm[2], err)
	}
	return mm[1], v
}

// Two processes that keep the device busy each get about half of its time,
// as a GPU time-slices between contexts.
func TestBusyProcessesShareDeviceTime(t *testing.T) {
	m := simtest.NewMachine(t, 1, "16Gi")
	workload := simtest.Bin(t, "simgpu/workload")
	args := []string{"--seconds", "3", "--kernels", "4", "--kernel-ns", "2000000"}
	a := simtest.Start(t, m.Command(workload, append([]string{"--label", "a"}, args...)...))
	b := simtest.Start(t, m.Command(workload, append([]string{"--label", "b"}, args...)...))
	share := map[string]float64{}
	for _, p := range []*simtest.Proc{a, b} {
		name, s := busyRatio(t, p)
		share[name] = s
	}
	// Wide bounds: this must hold on a loaded 2-core machine.
	for name, s := range share {
		if s < 0.3 || s > 0.7 {
			t.Errorf("process %s had %.2f of the device, want about half (0.3-0.7)", name, s)
		}
	}
	if sum := share["a"] + share["b"]; sum < 0.75 || sum > 1.05 {
		t.Errorf("together the processes kept the device %.2f busy, want 0.75-1.05", sum)
	}
}

// A process killed while it waits for the engine leaves nothing behind: the
// next process alone on the device gets all of it (a leaked waiter would
// make the engine wait for a hand-over after every kernel).
func TestKilledWaiterLeavesEngineFree(t *testing.T) {
	m := simtest.NewMachine(t, 1, "16Gi")
	workload := simtest.Bin(t, "simgpu/workload")
	// Kernels of 100 ms: at any moment one process runs and the others wait.
	long := []string{"--seconds", "30", "--kernels", "1", "--kernel-ns", "100000000"}
	var procs []*simtest.Proc
	for i := 0; i < 3; i++ {
		p := simtest.Start(t, m.Command(workload, long...))
		p.WaitLine(t, "ready", 10*time.Second)
		procs = append(procs, p)
	}
	time.Sleep(500 * time.Millisecond)
	for _, p := range procs {
		if err := p.Cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range procs {
		_, _ = p.Wait()
	}
	alone := simtest.Start(t, m.Command(workload, "--seconds", "1", "--kernels", "4", "--kernel-ns", "2000000"))
	// Without the waiter's count taken back: about 0.5.
	if _, s := busyRatio(t, alone); s < 0.8 {
		t.Errorf("alone after the kill the process kept the device %.2f busy, want over 0.8", s)
	}
}
