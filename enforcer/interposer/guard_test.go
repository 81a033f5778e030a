package interposer_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

// TestSignalHandlerInsideHook: a signal handler that allocates while a hook
// of the same thread is inside the driver is held to the quota like any
// other caller. The main thread's launch waits inside simgpu for room in a
// full stream queue (a 2 s kernel holds it) when SIGUSR1 arrives; the handler
// then allocates. Over the quota it is refused; within it, it is charged.
func TestSignalHandlerInsideHook(t *testing.T) {
	b := newBox(t, 1, "16Gi", "GPUWARDEN_MEMORY_LIMIT=1Gi")
	// 1 kernel + 1023 launches fill simgpu's 1024-deep queue; the next waits for the kernel.
	steps := func(size string) []string {
		return []string{"init", "ctx", "0", "kernel", "2000000000", "sigalloc", size, "300", "launch", "1100",
			"sigwait", "meminfo"}
	}
	want := func(sig string) []string {
		return []string{"init CUDA_SUCCESS", "ctx CUDA_SUCCESS", "kernel CUDA_SUCCESS", "sigalloc CUDA_SUCCESS",
			"launch CUDA_SUCCESS", "sigwait " + sig, "meminfo CUDA_SUCCESS"}
	}
	interrupted := func(r result) {
		t.Helper()
		if l := r.step(t, "sigwait", 0); !slices.Contains(strings.Fields(l), "step=launch") {
			t.Fatalf("the handler ran outside the launch (%s): the test did not reach a hook", l)
		}
	}

	// over the quota: 2 GiB on 1 GiB
	r := b.run(steps("2Gi")...)
	r.expect(t, want("CUDA_ERROR_OUT_OF_MEMORY")...)
	interrupted(r)

	// within it: charged, so the container's free memory shows it
	r = b.run(steps("512Mi")...)
	r.expect(t, want("CUDA_SUCCESS")...)
	interrupted(r)
	if free := field(t, r.step(t, "meminfo", 0), "free"); free != gi-ctxReserve-512*mi {
		t.Errorf("free after the handler's 512Mi: %d MiB, want %d MiB (the handler's allocation charged)",
			free/mi, (gi-ctxReserve-512*mi)/mi)
	}
}

// TestReentryUnderProbes: the agent's uretprobes on libcuda replace the
// return address of a probed driver function with the kernel's trampoline,
// so a driver function that tail-calls its base through the PLT
// (cuCtxCreate_v3/_v4 -> _v2, cuMemAllocFromPoolAsync_ptsz -> its base)
// reaches the base's hook from there. That call still passes through: each
// is charged once.
func TestReentryUnderProbes(t *testing.T) {
	simtest.RequirePrivileged(t, "eBPF")
	b := newBox(t, 1, "16Gi", "GPUWARDEN_MEMORY_LIMIT=1Gi")
	agent := simtest.StartAgent(t, b.m)
	t.Cleanup(func() { agent.Kill(t) }) // only its probes matter here
	lib := simtest.Bin(t, "simgpu/libcuda.so.1")
	simtest.Eventually(t, 60*time.Second, func() error {
		for _, l := range strings.Split(agent.Log(), "\n") {
			if strings.Contains(l, "attached to libcuda") && strings.Contains(l, lib) {
				return nil
			}
		}
		return fmt.Errorf("the agent's probes are not on %s yet", lib)
	})
	r := b.run("--resolve", "procaddr-ptsz", "init", "ctxcreate3", "0", "meminfo", "ctxdestroy", "ctxcreate4", "0",
		"meminfo", "ctxdestroy", "ctx", "0", "pool-dev", "100Mi", "0", "meminfo")
	r.expect(t, "init CUDA_SUCCESS", "ctxcreate3 CUDA_SUCCESS", "meminfo CUDA_SUCCESS", "ctxdestroy CUDA_SUCCESS",
		"ctxcreate4 CUDA_SUCCESS", "meminfo CUDA_SUCCESS", "ctxdestroy CUDA_SUCCESS", "ctx CUDA_SUCCESS",
		"pool-dev CUDA_SUCCESS", "meminfo CUDA_SUCCESS")
	for i, want := range []uint64{gi - ctxReserve, gi - ctxReserve, gi - ctxReserve - 100*mi} {
		if free := field(t, r.step(t, "meminfo", i), "free"); free != want {
			t.Errorf("meminfo #%d: free %d MiB, want %d MiB", i, free/mi, want/mi)
		}
	}
}
