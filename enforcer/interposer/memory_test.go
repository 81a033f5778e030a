package interposer_test

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

// TestHookPaths: however the program finds the driver's functions (linked,
// dlsym under either glibc version, cuGetProcAddress v1/v2, per-thread
// default stream variants), the quota holds and launches are counted.
func TestHookPaths(t *testing.T) {
	b := newBox(t, 1, "16Gi", "GPUWARDEN_MEMORY_LIMIT=1Gi")
	for _, how := range []string{"direct", "direct-ptsz", "dlsym", "dlsym225", "procaddr", "procaddr-ptsz", "procaddr-v1"} {
		t.Run(how, func(t *testing.T) {
			h := b.start("--resolve", how, "init", "ctx", "0", "alloc", "900Mi", "alloc", "100Mi",
				"launch", "5", "launchex", "1", "coop", "1", "graph", "1", "hold")
			pid := h.ready(t)
			time.Sleep(flushWithin) // launch counts reach the ledger within this
			l := b.ledger()
			p := proc(l, pid)
			if p == nil {
				t.Fatalf("pid %d has no slot: %+v", pid, l.Procs)
			}
			// graph: one launch captured into the graph, one cuGraphLaunch
			if p.Launches != 9 || p.Bytes[0] != 900*mi+ctxReserve || l.ReservedBytes[0] != p.Bytes[0] {
				t.Errorf("slot %+v, reserved %d", p, l.ReservedBytes[0])
			}
			h.resume()
			out, err := h.Wait()
			if err != nil {
				t.Fatalf("%v: %s", err, h.Stderr())
			}
			want := []string{"init CUDA_SUCCESS", "ctx CUDA_SUCCESS", "alloc CUDA_SUCCESS", "alloc CUDA_ERROR_OUT_OF_MEMORY",
				"launch CUDA_SUCCESS", "launchex CUDA_SUCCESS", "coop CUDA_SUCCESS", "graph CUDA_SUCCESS"}
			(result{lines: strings.Split(strings.TrimSpace(out), "\n")[:len(want)]}).expect(t, want...)
			if r := b.ledger().ReservedBytes[0]; r != 0 {
				t.Errorf("after exit %d bytes still reserved", r)
			}
		})
	}

	// the CUDA runtime's way, as simgpu's workload does it
	t.Run("workload-procaddr", func(t *testing.T) {
		cmd := b.command(simtest.Bin(t, "simgpu/workload"), "--resolve", "procaddr", "--alloc", "2Gi", "--steps", "1")
		if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "CUDA_ERROR_OUT_OF_MEMORY") {
			t.Fatalf("2Gi under a 1Gi quota: %v: %s", err, out)
		}
	})
}

// TestAllocationPaths: every allocation path is charged, over the quota it
// fails without reaching the driver, and every free gives its bytes back.
func TestAllocationPaths(t *testing.T) {
	b := newBox(t, 1, "16Gi", "GPUWARDEN_MEMORY_LIMIT=1Gi")
	r := b.run("init", "ctx", "0", "meminfo", // 0
		"pitch", "1000", "1000", "meminfo", "free", // 1
		"managed", "512Mi", "managed", "512Mi", "meminfo", "free", // 2
		"async", "512Mi", "async", "512Mi", "meminfo", "free", // 3
		"pool-dev", "512Mi", "0", "pool-dev", "512Mi", "0", "meminfo", "free", // 4
		"defpool", "512Mi", "defpool", "512Mi", "meminfo", "free", // 5
		"pool-host", "3Gi", "meminfo", "free", // 6
		"vmm", "512Mi", "0", "vmm", "512Mi", "0", "vmm-release", "meminfo", "vmm-unmap", "meminfo", // 7, 8
		"vmm-host", "4Gi", "meminfo", "free", // 9
		"ctxcreate", "0", "alloc", "256Mi", "meminfo", "ctxdestroy", "ctx", "0", "meminfo", // 10, 11
		"alloc", "100Mi", "release", "0", "release", "0", "ctx", "0", "meminfo", // 12
	)
	r.expect(t, "init CUDA_SUCCESS", "ctx CUDA_SUCCESS", "meminfo CUDA_SUCCESS",
		"pitch CUDA_SUCCESS", "meminfo CUDA_SUCCESS", "free CUDA_SUCCESS",
		"managed CUDA_SUCCESS", "managed CUDA_ERROR_OUT_OF_MEMORY", "meminfo CUDA_SUCCESS", "free CUDA_SUCCESS",
		"async CUDA_SUCCESS", "async CUDA_ERROR_OUT_OF_MEMORY", "meminfo CUDA_SUCCESS", "free CUDA_SUCCESS",
		"pool-dev CUDA_SUCCESS", "pool-dev CUDA_ERROR_OUT_OF_MEMORY", "meminfo CUDA_SUCCESS", "free CUDA_SUCCESS",
		"defpool CUDA_SUCCESS", "defpool CUDA_ERROR_OUT_OF_MEMORY", "meminfo CUDA_SUCCESS", "free CUDA_SUCCESS",
		"pool-host CUDA_SUCCESS", "meminfo CUDA_SUCCESS", "free CUDA_SUCCESS",
		"vmm CUDA_SUCCESS", "vmm CUDA_ERROR_OUT_OF_MEMORY", "vmm-release CUDA_SUCCESS", "meminfo CUDA_SUCCESS",
		"vmm-unmap CUDA_SUCCESS", "meminfo CUDA_SUCCESS",
		"vmm-host CUDA_SUCCESS", "meminfo CUDA_SUCCESS", "free CUDA_SUCCESS",
		"ctxcreate CUDA_SUCCESS", "alloc CUDA_SUCCESS", "meminfo CUDA_SUCCESS", "ctxdestroy CUDA_SUCCESS",
		"ctx CUDA_SUCCESS", "meminfo CUDA_SUCCESS",
		"alloc CUDA_SUCCESS", "release CUDA_SUCCESS", "release CUDA_SUCCESS", "ctx CUDA_SUCCESS", "meminfo CUDA_SUCCESS")
	base := gi - ctxReserve
	wantFree := []uint64{
		base,                       // after the primary context
		base - 1024*1000,           // pitch 1024 (the driver's) x 1000 rows
		base - 512*mi,              // managed
		base - 512*mi,              // async
		base - 512*mi,              // pool on device 0
		base - 512*mi,              // the default pool
		base,                       // a host pool is not device memory
		base - 512*mi,              // released but still mapped: still held
		base,                       // unmapped too: back
		base,                       // a host-located VMM handle
		base - ctxReserve - 256*mi, // a created context and an allocation in it
		base,                       // destroyed with its allocation
		base,                       // the primary context released (with its 100Mi) and retained again
	}
	for i, w := range wantFree {
		l := r.step(t, "meminfo", i)
		if f, tot := field(t, l, "free"), field(t, l, "total"); f != w || tot != gi {
			t.Errorf("meminfo #%d: free %d total %d, want free %d (%d MiB less) total %d", i, f, tot, w, (int64(w)-int64(f))/int64(mi), gi)
		}
	}
}

// TestContextCreateForms: each cuCtxCreate form (CUDA 3.2, 11.4, 12.5) is
// charged the context reserve, given back when the context is destroyed.
func TestContextCreateForms(t *testing.T) {
	b := newBox(t, 1, "16Gi", "GPUWARDEN_MEMORY_LIMIT=1Gi")
	var args, want []string
	for _, form := range []string{"ctxcreate", "ctxcreate3", "ctxcreate4"} {
		args = append(args, form, "0", "meminfo", "ctxdestroy")
		want = append(want, form+" CUDA_SUCCESS", "meminfo CUDA_SUCCESS", "ctxdestroy CUDA_SUCCESS")
	}
	r := b.run(append(append([]string{"init"}, args...), "ctx", "0", "meminfo")...)
	r.expect(t, append(append([]string{"init CUDA_SUCCESS"}, want...), "ctx CUDA_SUCCESS", "meminfo CUDA_SUCCESS")...)
	for i := 0; i < 3; i++ {
		if f := field(t, r.step(t, "meminfo", i), "free"); f != gi-ctxReserve {
			t.Errorf("form %d: free %d with one created context, want %d", i, f, gi-ctxReserve)
		}
	}
	if f := field(t, r.step(t, "meminfo", 3), "free"); f != gi-ctxReserve {
		t.Errorf("free %d with only the primary context, want %d: a destroyed context kept its reserve", f, gi-ctxReserve)
	}
}

// TestMultiGPU: a list of limits applies per device, the last value repeating.
func TestMultiGPU(t *testing.T) {
	b := newBox(t, 4, "16Gi", "GPUWARDEN_MEMORY_LIMIT=3Gi,1Gi")
	var args []string
	limits := []uint64{3 * gi, gi, gi, gi}
	for d, lim := range limits {
		args = append(args, "ctx", fmt.Sprint(d), "totalmem", fmt.Sprint(d), "alloc", fmt.Sprint((lim-ctxReserve)/mi)+"Mi", "alloc", "1Mi")
	}
	r := b.run(append([]string{"init"}, args...)...)
	var want []string
	want = append(want, "init CUDA_SUCCESS")
	for range limits {
		want = append(want, "ctx CUDA_SUCCESS", "totalmem CUDA_SUCCESS", "alloc CUDA_SUCCESS", "alloc CUDA_ERROR_OUT_OF_MEMORY")
	}
	r.expect(t, want...)
	for d, lim := range limits {
		if tot := field(t, r.step(t, "totalmem", d), "total"); tot != lim {
			t.Errorf("device %d: total %d, want %d", d, tot, lim)
		}
	}
}

// TestStorm: 4 processes x 8 threads allocating and freeing at random, with
// linear, pitched, stream-ordered, pool and VMM allocations mixed, never
// hold more than the quota on the device: simgpu's own count of the
// device's memory is sampled throughout and must never pass it by one byte.
func TestStorm(t *testing.T) {
	for _, mode := range []string{"linear", "mixed"} {
		t.Run(mode, func(t *testing.T) {
			const quota = 2 * gi
			b := newBox(t, 1, "16Gi", "GPUWARDEN_MEMORY_LIMIT=2Gi").inCgroup("storm")
			var procs []*simtest.Proc
			for i := 0; i < 4; i++ {
				procs = append(procs, simtest.Start(t, b.check("init", "storm", "8", "600", "300Mi", mode)))
			}
			st := openState(t, b.m.State)
			for i := 0; i < 500 && st.total0() == 0; i++ {
				time.Sleep(10 * time.Millisecond) // the first process lays the machine out
			}
			if st.total0() != 16*gi {
				t.Fatalf("simgpu state layout: device 0 total %d", st.total0())
			}
			var peak, samples atomic.Uint64
			var stop atomic.Bool
			var wg sync.WaitGroup
			defer func() { stop.Store(true); wg.Wait() }() // before the state is unmapped
			wg.Add(1)
			go func() {
				defer wg.Done()
				for !stop.Load() {
					if u := st.used0(); u > peak.Load() {
						peak.Store(u)
					}
					samples.Add(1)
					runtime.Gosched() // sample as often as the machine allows

				}
			}()
			var ok, oom uint64
			for _, p := range procs {
				out, err := p.Wait()
				if err != nil {
					t.Fatalf("storm process: %v: %s", err, p.Stderr())
				}
				line := ""
				for _, l := range strings.Split(out, "\n") {
					if strings.HasPrefix(l, "storm ") {
						line = l
					}
				}
				if !strings.HasPrefix(line, "storm CUDA_SUCCESS") {
					t.Fatalf("storm: %q: %s", line, p.Stderr())
				}
				ok += field(t, line, "ok")
				oom += field(t, line, "oom")
			}
			stop.Store(true)
			wg.Wait()
			t.Logf("%d allocations, %d refused, peak %d MiB of %d MiB, %d samples", ok, oom, peak.Load()/mi, quota/mi, samples.Load())
			if peak.Load() > quota {
				t.Errorf("device held %d bytes, over the %d quota by %d", peak.Load(), quota, peak.Load()-quota)
			}
			if oom == 0 || ok == 0 {
				t.Errorf("no pressure: %d ok, %d refused", ok, oom)
			}
			if l := b.ledger(); l.ReservedBytes[0] != 0 || len(l.Procs) != 0 {
				t.Errorf("after the storm: reserved %d, procs %+v", l.ReservedBytes[0], l.Procs)
			}
		})
	}
}

// TestThreadsBeforeInit: threads that exist before the library initialises
// share the one quota like any other.
func TestThreadsBeforeInit(t *testing.T) {
	b := newBox(t, 1, "16Gi", "GPUWARDEN_MEMORY_LIMIT=1Gi")
	r := b.run("prethreads", "8", "300Mi", "init", "prethreads-go")
	r.expect(t, "prethreads CUDA_SUCCESS", "init CUDA_SUCCESS", "prethreads-go CUDA_SUCCESS")
	l := r.step(t, "prethreads-go", 0)
	// one primary context (64Mi) and three 300Mi allocations fit in 1Gi
	if field(t, l, "ok") != 3 || field(t, l, "oom") != 5 {
		t.Errorf("%s: want ok=3 oom=5", l)
	}
}
