package interposer_test

import (
	"bytes"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

// TestVisibleDevicesReordered: under CUDA_VISIBLE_DEVICES=2,0 a quota list
// applies by CUDA ordinal, and the ledger records for each ordinal the UUID
// of the machine's device it names (ordinal 0 is device 2, ordinal 1 device 0).
func TestVisibleDevicesReordered(t *testing.T) {
	b := newBox(t, 4, "16Gi", "GPUWARDEN_MEMORY_LIMIT=3Gi,1Gi", "CUDA_VISIBLE_DEVICES=2,0")
	uuids := machineUUIDs(t, b)
	h := b.start("init", "ctx", "0", "totalmem", "0", "alloc", "2Gi", "ctx", "1", "totalmem", "1", "alloc", "512Mi",
		"alloc", "1Gi", "hold")
	h.ready(t)

	l := b.ledger()
	if l.NDev != 2 {
		t.Errorf("ledger ndev %d, want 2 visible devices", l.NDev)
	}
	for ord, dev := range []int{2, 0} {
		want, err := hex.DecodeString(strings.ReplaceAll(strings.TrimPrefix(uuids[dev], "GPU-"), "-", ""))
		if err != nil || !bytes.Equal(l.DevUUID[ord][:], want) {
			t.Errorf("ledger: ordinal %d has UUID %x, want device %d's %s", ord, l.DevUUID[ord], dev, uuids[dev])
		}
	}
	if r := l.ReservedBytes; r[0] != ctxReserve+2*gi || r[1] != ctxReserve+512*mi {
		t.Errorf("reserved %d, %d by ordinal, want %d, %d", r[0], r[1], ctxReserve+2*gi, ctxReserve+512*mi)
	}

	h.resume()
	out, err := h.Wait()
	if err != nil {
		t.Fatal(err, h.Stderr())
	}
	r := result{lines: dropReady(out)}
	r.expect(t, "init CUDA_SUCCESS", "ctx CUDA_SUCCESS", "totalmem CUDA_SUCCESS", "alloc CUDA_SUCCESS",
		"ctx CUDA_SUCCESS", "totalmem CUDA_SUCCESS", "alloc CUDA_SUCCESS", "alloc CUDA_ERROR_OUT_OF_MEMORY", "hold CUDA_SUCCESS")
	for ord, want := range []uint64{3 * gi, gi} {
		if tot := field(t, r.step(t, "totalmem", ord), "total"); tot != want {
			t.Errorf("ordinal %d: total %d, want its quota %d", ord, tot, want)
		}
	}
}

// machineUUIDs lists the box's machine's UUIDs as NVML reports them.
func machineUUIDs(t *testing.T, b *box) []string {
	t.Helper()
	out, err := b.m.Command(simtest.Bin(t, "simgpu/visible-check"), "--list").Output()
	if err != nil {
		t.Fatalf("visible-check --list: %v", err)
	}
	uuids := strings.Fields(string(out))
	if len(uuids) != b.m.Devices {
		t.Fatalf("visible-check --list: %q, want %d UUIDs", out, b.m.Devices)
	}
	return uuids
}

// TestCGPUMemoryList: cGPU's ALIYUN_COM_GPU_MEM_CONTAINER=3,1 on four GPUs
// is 3 GiB on the first and 1 GiB on each other, as cuMemGetInfo shows in a
// context on each; a malformed list stops cuInit with one line naming it.
func TestCGPUMemoryList(t *testing.T) {
	b := newBox(t, 4, "16Gi", "ALIYUN_COM_GPU_MEM_CONTAINER=3,1", "ALIYUN_COM_GPU_MEM_DEV=16")
	args, want := []string{"init"}, []string{"init CUDA_SUCCESS"}
	limits := []uint64{3 * gi, gi, gi, gi}
	for d := range limits {
		args = append(args, "ctx", itoa(d), "meminfo")
		want = append(want, "ctx CUDA_SUCCESS", "meminfo CUDA_SUCCESS")
	}
	r := b.run(args...)
	r.expect(t, want...)
	for d, lim := range limits {
		l := r.step(t, "meminfo", d)
		if tot, free := field(t, l, "total"), field(t, l, "free"); tot != lim || free != lim-ctxReserve {
			t.Errorf("device %d: cuMemGetInfo total %d free %d, want %d and %d", d, tot, free, lim, lim-ctxReserve)
		}
	}

	bad := newBox(t, 4, "16Gi", "ALIYUN_COM_GPU_MEM_CONTAINER=3,1.5")
	r = bad.run("init")
	r.expect(t, "init CUDA_ERROR_NOT_PERMITTED")
	if lines := strings.Split(strings.TrimSpace(r.stderr), "\n"); len(lines) != 1 || !strings.Contains(lines[0], "ALIYUN_COM_GPU_MEM_CONTAINER=3,1.5") {
		t.Errorf("stderr %q, want one line naming ALIYUN_COM_GPU_MEM_CONTAINER", r.stderr)
	}
}
