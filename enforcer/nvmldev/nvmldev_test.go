package nvmldev_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/nvmldev"
	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

var machine *simtest.Machine

// simgpu's NVML reads SIMGPU_STATE once per process: one machine per test binary.
func TestMain(m *testing.M) { os.Exit(simtest.RunWithProcessMachine(m, &machine, 2, "8Gi")) }

func TestDevicesAndProcesses(t *testing.T) {
	r, err := nvmldev.Open(simtest.Bin(t, "simgpu/libnvidia-ml.so.1"))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	w := simtest.Start(t, machine.Command(simtest.Bin(t, "simgpu/workload"), "--device", "1", "--alloc", "1Gi",
		"--seconds", "100", "--kernels", "4", "--kernel-ns", "5000000"))
	line := w.WaitLine(t, "ready", 10*time.Second)
	time.Sleep(500 * time.Millisecond) // let it run a few hundred milliseconds of kernels

	devs, err := r.Devices()
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 2 {
		t.Fatalf("got %d devices, want 2", len(devs))
	}
	d := devs[1]
	if d.MemoryTotalBytes != 8<<30 || !strings.HasPrefix(d.UUID, "GPU-") || d.Name == "" {
		t.Errorf("device 1 = %+v", d)
	}
	const held = 1<<30 + 64<<20 // its allocation and its context
	if len(d.Processes) != 1 || d.Processes[0].PID != uint32(w.Cmd.Process.Pid) || d.Processes[0].MemoryBytes != held {
		t.Fatalf("device 1 processes = %+v, want the workload (%s) holding %d", d.Processes, line, held)
	}
	if d.Processes[0].Utilization < 0.5 || d.Utilization < 0.5 {
		t.Errorf("the only busy process has utilization %.2f, the device %.2f; want both over 0.5",
			d.Processes[0].Utilization, d.Utilization)
	}
	if devs[0].MemoryUsedBytes != 0 || len(devs[0].Processes) != 0 {
		t.Errorf("device 0 is idle but reports %+v", devs[0])
	}
	uuids, err := r.UUIDs()
	if err != nil || len(uuids) != 2 || uuids[0] != devs[0].UUID || uuids[1] != devs[1].UUID || uuids[0] == uuids[1] {
		t.Errorf("UUIDs = %q, %v; want the devices' own, by index", uuids, err)
	}
}

func TestOpenMissingLibrary(t *testing.T) {
	if _, err := nvmldev.Open(filepath.Join(t.TempDir(), "libnvidia-ml.so.1")); err == nil {
		t.Error("opening a missing NVML library gave no error")
	}
}
