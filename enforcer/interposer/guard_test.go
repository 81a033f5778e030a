package interposer_test

import (
	"slices"
	"strings"
	"testing"
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
