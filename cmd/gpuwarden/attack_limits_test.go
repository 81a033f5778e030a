package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

// nobody is the unprivileged user the container's processes run as.
const nobody = 65534

// asNobody makes cmd run as the unprivileged user.
func asNobody(cmd *exec.Cmd) *exec.Cmd {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Credential = &syscall.Credential{Uid: nobody, Gid: nobody}
	return cmd
}

// sharedMachine is a machine whose state and control directory a
// non-root process can use, as on a node off Kubernetes: the control
// directory is world-writable and sticky, like /tmp, so each container's
// interposer makes its own directory there.
func sharedMachine(t *testing.T) (*simtest.Machine, string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "gpuwarden-limits-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	control := filepath.Join(dir, "control")
	m := &simtest.Machine{State: filepath.Join(dir, "simgpu.state"), Devices: 1, Memory: "16Gi"}
	for _, step := range []error{
		os.Chmod(dir, 0o755),
		os.Mkdir(control, 0o755),
		os.Chmod(control, 0o1777),
		os.WriteFile(m.State, nil, 0o666), // empty: the first process lays the machine out
		os.Chmod(m.State, 0o666),
	} {
		if step != nil {
			t.Fatal(step)
		}
	}
	return m, control
}

// TestAttackSwapLimits: a non-root container cannot replace the limits the
// agent wrote. Off Kubernetes its interposer made its control directory as
// its own user; the agent takes the directory over before it writes
// `limits`, so a forged file renamed over them is refused, and the quota
// set with ctl holds: of two 4 GiB allocations under 6 GiB, the second is
// refused.
func TestAttackSwapLimits(t *testing.T) {
	simtest.RequirePrivileged(t, "cgroups and setuid")
	m, control := sharedMachine(t)
	agent := simtest.StartAgent(t, m, noEBPF, "GPUWARDEN_CONTROL_DIR="+control)
	cg := simtest.NewCgroup(t, "swap")
	workload := func(args ...string) *exec.Cmd {
		cmd := asNobody(cg.Place(m.Command(simtest.Bin(t, "simgpu/workload"), args...)))
		cmd.Env = append(cmd.Env, "LD_PRELOAD="+simtest.Bin(t, "libgpuwarden.so"), "GPUWARDEN_CONTROL_DIR="+control,
			"GPUWARDEN_MEMORY_LIMIT=2Gi")
		return cmd
	}
	simtest.Start(t, workload("--alloc", "512Mi", "--hold")).WaitLine(t, "ready", 10*time.Second)

	simtest.Eventually(t, 15*time.Second, func() error {
		out, err := ctl(t, agent, "set", cg.Rel, "--memory-limit", "6Gi")
		if err != nil {
			return fmt.Errorf("ctl set: %v: %s", err, out)
		}
		return nil
	})
	simtest.Eventually(t, 10*time.Second, func() error {
		if e, _ := entry(t, agent, cg); e.MemoryLimitBytes != 6*gib {
			return fmt.Errorf("limit %d, want 6 GiB", e.MemoryLimitBytes)
		}
		return nil
	})

	// The forgery, from inside the container: the agent's limits with the
	// memory limit zeroed (no limit), renamed over the real ones.
	dir := filepath.Join(control, controlblock.ContainerKey(cg.Rel))
	forged := filepath.Join(control, "forged")
	off := unsafe.Offsetof(controlblock.Limits{}.MemLimit)
	script := fmt.Sprintf(`cp "$1/limits" "$2" && dd if=/dev/zero of="$2" bs=1 seek=%d count=%d conv=notrunc status=none && mv -f "$2" "$1/limits"`,
		off, 8*controlblock.MaxDevices)
	out, err := asNobody(cg.Place(exec.Command("sh", "-c", script, "sh", dir, forged))).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "Permission denied") {
		t.Errorf("renaming a forged limits file over the agent's: %v %q; want permission denied", err, out)
	}

	p := simtest.Start(t, workload("--alloc", "4Gi", "--try-alloc", "4Gi", "--steps", "1"))
	if got := p.WaitLine(t, "try-alloc", 15*time.Second); got != "try-alloc CUDA_ERROR_OUT_OF_MEMORY" {
		t.Errorf("a second 4 GiB under a 6 GiB quota: %q, want CUDA_ERROR_OUT_OF_MEMORY", got)
	}
}
