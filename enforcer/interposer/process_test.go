package interposer_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

// TestKilledProcessReclaim: what a SIGKILLed process held comes back within
// a second, with no agent, through the survivors' reaper.
func TestKilledProcessReclaim(t *testing.T) {
	b := newBox(t, 1, "16Gi", "GPUWARDEN_MEMORY_LIMIT=2Gi")
	victim := b.start("init", "ctx", "0", "alloc", "1800Mi", "hold")
	vpid := victim.ready(t)
	survivor := b.start("init", "ctx", "0", "alloc", "500Mi", "hold", "alloc", "1800Mi")
	if l := survivor.WaitLine(t, "alloc", 10*time.Second); !strings.Contains(l, "OUT_OF_MEMORY") {
		t.Fatalf("500Mi beside 1800Mi under 2Gi: %s", l)
	}
	survivor.ready(t)
	if err := victim.Cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	victim.Wait()
	killed := time.Now()
	for b.ledger().ReservedBytes[0] != ctxReserve {
		if time.Since(killed) > time.Second {
			t.Fatalf("1s after SIGKILL of %d: %d bytes reserved, want %d", vpid, b.ledger().ReservedBytes[0], ctxReserve)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("reclaimed %v after SIGKILL", time.Since(killed))
	survivor.resume()
	if l := survivor.WaitLine(t, "alloc", 5*time.Second); !strings.Contains(l, "CUDA_SUCCESS") {
		t.Fatalf("after reclaim: %s", l)
	}
}

// TestFork: a child forked after cuInit has its own slot; its allocations
// count in the same quota and leave with it.
func TestFork(t *testing.T) {
	b := newBox(t, 1, "16Gi", "GPUWARDEN_MEMORY_LIMIT=1Gi")
	h := b.start("init", "ctx", "0", "alloc", "100Mi", "fork", "alloc", "200Mi", "alloc", "700Mi", "hold")
	child := h.ready(t)
	parent := h.Cmd.Process.Pid
	l := b.ledger()
	pp, cp := proc(l, parent), proc(l, child)
	if pp == nil || cp == nil || child == parent {
		t.Fatalf("parent %d child %d slots: %+v", parent, child, l.Procs)
	}
	if pp.Bytes[0] != ctxReserve+100*mi || cp.Bytes[0] != 200*mi || l.ReservedBytes[0] != ctxReserve+300*mi {
		t.Errorf("parent %d, child %d, reserved %d", pp.Bytes[0], cp.Bytes[0], l.ReservedBytes[0])
	}
	h.resume()
	out, err := h.Wait()
	if err != nil {
		t.Fatal(err, h.Stderr())
	}
	// the child's 700Mi does not fit beside 64+100+200
	if !strings.Contains(out, "alloc CUDA_ERROR_OUT_OF_MEMORY") || !strings.Contains(out, "fork parent child_exit=0") {
		t.Errorf("output:\n%s", out)
	}
	if r := b.ledger().ReservedBytes[0]; r != 0 {
		t.Errorf("after both exited: %d bytes reserved", r)
	}
}

// TestMalformed: a bad environment value or control block is a one-line
// error naming it, and cuInit and every later hooked call fail.
func TestMalformed(t *testing.T) {
	for _, kv := range []string{"GPUWARDEN_MEMORY_LIMIT=banana", "GPUWARDEN_MEMORY_LIMIT=", "GPUWARDEN_MEMORY_LIMIT=4GB",
		"ALIYUN_COM_GPU_MEM_CONTAINER=2.5", "GPUWARDEN_COMPUTE_WEIGHT=0", "GPUWARDEN_COMPUTE_LIMIT=150",
		"GPUWARDEN_PRIORITY=urgent", "ALIYUN_COM_GPU_SCHD_WEIGHT=-1", "GPUWARDEN_CONTROL_DIR=relative"} {
		name, _, _ := strings.Cut(kv, "=")
		b := newBox(t, 1, "16Gi", kv)
		r := b.run("init", "alloc", "1Mi", "ctx", "0")
		r.expect(t, "init CUDA_ERROR_NOT_PERMITTED", "alloc CUDA_ERROR_NOT_PERMITTED", "ctx CUDA_ERROR_NOT_PERMITTED")
		if lines := strings.Split(strings.TrimSpace(r.stderr), "\n"); len(lines) != 1 || !strings.Contains(lines[0], name+"=") {
			t.Errorf("%s: stderr %q, want one line naming %s", kv, r.stderr, name)
		}
	}

	b := newBox(t, 1, "16Gi")
	if err := os.MkdirAll(filepath.Join(b.ctl, b.key), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []struct {
		name string
		size int
	}{{"usage", 36864}, {"limits", 2048}} {
		path := filepath.Join(b.ctl, b.key, f.name)
		if err := os.WriteFile(path, make([]byte, f.size), 0o644); err != nil {
			t.Fatal(err)
		}
		r := b.run("init")
		r.expect(t, "init CUDA_ERROR_NOT_PERMITTED")
		if lines := strings.Split(strings.TrimSpace(r.stderr), "\n"); len(lines) != 1 || !strings.Contains(lines[0], path) {
			t.Errorf("bad %s: stderr %q, want one line naming %s", f.name, r.stderr, path)
		}
		os.Remove(path)
	}
}

// TestCFuzzers builds the libFuzzer harnesses of the C environment parser,
// the control-block checks, the remote protocol's frame decoder, the
// /proc/self/cgroup parser and the TLS record reader, warnings as errors
// (an undeclared function's pointer result is cut to an int), and runs
// them briefly.
func TestCFuzzers(t *testing.T) {
	if testing.Short() {
		t.Skip("fuzzing is not short")
	}
	root := simtest.Root(t)
	dir := filepath.Join(root, "enforcer", "interposer")
	inc := []string{"-I", filepath.Join(root, "simgpu", "include"), "-I", dir, "-I", filepath.Join(dir, "src"),
		"-I", filepath.Join(dir, "remote")}
	for _, h := range []struct {
		harness, src string
		runs         int
	}{
		{"fuzz_env.c", "src/env.c", 20000}, {"fuzz_controlblock.c", "src/cbcheck.c", 20000},
		{"fuzz_frame.c", "remote/decode.c", 20000}, {"fuzz_cgroup.c", "src/cgroup.c", 20000},
		// Each run sets up two record layers (key schedules, a socket pair
		// and their buffers under the sanitizers): 3 ms, not microseconds.
		{"fuzz_tlsrec.c", "remote/tls13.c", 5000},
	} {
		t.Run(h.harness, func(t *testing.T) {
			t.Parallel() // each builds and runs alone: the machine's cores share them
			bin := filepath.Join(t.TempDir(), strings.TrimSuffix(h.harness, ".c"))
			args := append([]string{"-g", "-O1", "-Wall", "-Werror", "-fsanitize=fuzzer,address,undefined", "-fno-sanitize-recover=all", "-o", bin},
				inc...)
			args = append(args, filepath.Join(dir, "fuzz", h.harness), filepath.Join(dir, h.src))
			if out, err := runCmd("clang", args...); err != nil {
				if os.Getenv("GPUWARDEN_REQUIRE_PRIVILEGED") != "1" && strings.Contains(err.Error(), "executable file not found") {
					t.Skip("clang is not installed (make deps-test installs it)")
				}
				t.Fatalf("build %s: %v\n%s", h.harness, err, out)
			}
			if out, err := runCmd(bin, fmt.Sprintf("-runs=%d", h.runs), "-seed=1", "-rss_limit_mb=1024"); err != nil {
				t.Fatalf("%s: %v\n%s", h.harness, err, out)
			}
		})
	}
}
