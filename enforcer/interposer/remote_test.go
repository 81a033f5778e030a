package interposer_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/remote/handover"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/link"
	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

// Remote GPUs: programs run on bin/remote's libcuda.so.1 (the client
// library) with GPUWARDEN_REMOTE=unix:SOCK and no simulated machine of their
// own; bin/gpuwarden-worker --listen SOCK runs their calls on simgpu, under
// the interposer where the test says so.

// worker is one gpuwarden-worker serving one session.
type worker struct {
	sock string
	cmd  *exec.Cmd
	errb *bytes.Buffer
	done chan error
}

// startWorker starts a worker on machine m; preload runs it under the
// interposer with env (GPUWARDEN_MEMORY_LIMIT=..., ...).
func startWorker(t *testing.T, m *simtest.Machine, preload bool, env ...string) *worker {
	t.Helper()
	dir, err := os.MkdirTemp("", "gwr") // short: a socket path has 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return startWorkerAt(t, filepath.Join(dir, "s"), m, preload, env...)
}

// startWorkerAt starts a worker listening on sock.
func startWorkerAt(t *testing.T, sock string, m *simtest.Machine, preload bool, env ...string) *worker {
	t.Helper()
	w := &worker{sock: sock}
	w.start(t, exec.Command(simtest.Bin(t, "gpuwarden-worker"), "--listen", w.sock), m, preload, env...)
	for i := 0; ; i++ {
		if _, err := os.Stat(w.sock); err == nil {
			return w
		}
		if i == 1000 {
			t.Fatalf("worker made no socket in 10s; stderr:\n%s", w.errb)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// start runs cmd, a worker, on machine m.
func (w *worker) start(t *testing.T, cmd *exec.Cmd, m *simtest.Machine, preload bool, env ...string) {
	t.Helper()
	w.cmd, w.errb, w.done = cmd, &bytes.Buffer{}, make(chan error, 1)
	w.cmd.Env = append(cleanEnv(), m.Env()...)
	w.cmd.Env = append(w.cmd.Env, "LD_LIBRARY_PATH="+filepath.Dir(simtest.Bin(t, "simgpu/libcuda.so.1")))
	if preload {
		w.cmd.Env = append(w.cmd.Env, "LD_PRELOAD="+simtest.Bin(t, "libgpuwarden.so"),
			"GPUWARDEN_CONTROL_DIR="+filepath.Join(t.TempDir(), "ctl"))
	}
	w.cmd.Env = append(w.cmd.Env, env...)
	w.cmd.Stderr = w.errb
	if err := w.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { w.done <- w.cmd.Wait() }()
	t.Cleanup(func() {
		_ = w.cmd.Process.Kill()
		<-w.done
	})
}

// startHandedOver starts a worker on m whose session arrives as the agents
// hand one over: a TLS 1.3 connection, handshaken and used by Go, whose two
// ends the client library and the worker then carry on by themselves
// (TLS records in C). The test serves w.sock as an agent serves the
// library's: it reads the hello and answers with the handover.
func startHandedOver(t *testing.T, m *simtest.Machine, preload bool, env ...string) *worker {
	t.Helper()
	p := tlsPair(t, true) // the library's end is the TLS client, as it is in a session
	clientState, err := handover.Export(p.cEnd)
	if err != nil {
		t.Fatal(err)
	}
	workerState, err := handover.Export(p.goEnd)
	if err != nil {
		t.Fatal(err)
	}
	clientTCP, workerTCP := socketFile(t, p.cRaw), socketFile(t, p.goRaw)

	// The worker: its agent's socket as --fd 3, the handover its first frame.
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	agentEnd, workerEnd := unixConn(t, fds[0]), os.NewFile(uintptr(fds[1]), "worker")
	t.Cleanup(func() { agentEnd.Close() }) // the worker's session ends with it
	cmd := exec.Command(simtest.Bin(t, "gpuwarden-worker"), "--fd", "3")
	cmd.ExtraFiles = []*os.File{workerEnd}
	w := &worker{}
	w.start(t, cmd, m, preload, env...)
	workerEnd.Close()
	err = handover.Send(agentEnd, workerState, workerTCP)
	workerTCP.Close()
	if err != nil {
		t.Fatal(err)
	}

	// The library's agent: one connection, answered with its end.
	t.Cleanup(func() { clientTCP.Close() }) // in case the library never connects
	w.sock = serveLibrary(t, "handing the session to the library", func(c *net.UnixConn, hello []byte) error {
		if takes, err := handover.Hello(hello); err != nil || !takes {
			return fmt.Errorf("the library's hello does not take a handover (%v)", err)
		}
		defer clientTCP.Close() // once sent, the connection ends when the library's process does
		return handover.Send(c, clientState, clientTCP)
	})
	return w
}

// serveLibrary serves a socket for the client library as its agent does
// (returned): it accepts one connection, reads the library's hello, and
// hands both to serve, whose error fails the test (as what).
func serveLibrary(t *testing.T, what string, serve func(c *net.UnixConn, hello []byte) error) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "gwr") // short: a socket path has 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "s")
	lis, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() {
		defer lis.Close()
		c, err := lis.AcceptUnix()
		if err != nil {
			served <- err
			return
		}
		t.Cleanup(func() { c.Close() })
		hello := make([]byte, handover.HelloLen)
		if _, err := io.ReadFull(c, hello); err != nil {
			served <- err
			return
		}
		served <- serve(c, hello)
	}()
	t.Cleanup(func() {
		lis.Close()
		if err := <-served; err != nil && !errors.Is(err, net.ErrClosed) {
			t.Errorf("%s: %v", what, err)
		}
	})
	return sock
}

// startRelayed starts a worker on m whose session goes through two Go
// relays, as the relayed path's does: the library's bytes in link frames
// over a TLS 1.3 connection, between the library's socket (w.sock, served
// by the test) and the worker's.
func startRelayed(t *testing.T, m *simtest.Machine, preload bool, env ...string) *worker {
	t.Helper()
	w := startWorker(t, m, preload, env...)
	p := tlsPair(t, true)
	clientLink, serverLink := link.New(p.cEnd, 5*time.Second), link.New(p.goEnd, 5*time.Second)
	workerSock := w.sock
	w.sock = serveLibrary(t, "relaying the session", func(c *net.UnixConn, hello []byte) error {
		wc, err := net.Dial("unix", workerSock)
		if err == nil {
			err = clientLink.SendData(hello)
		}
		if err != nil {
			return err
		}
		go func() { _ = serverLink.Relay(wc) }()
		return clientLink.Relay(c)
	})
	return w
}

// socketFile duplicates c's socket, and closes c: the file is the only
// descriptor left, to be handed over.
func socketFile(t *testing.T, c net.Conn) *os.File {
	t.Helper()
	f, err := c.(*net.TCPConn).File()
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	return f
}

func unixConn(t *testing.T, fd int) *net.UnixConn {
	t.Helper()
	f := os.NewFile(uintptr(fd), "agent")
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		t.Fatal(err)
	}
	return c.(*net.UnixConn)
}

// wait waits for the worker to exit by itself.
func (w *worker) wait(t *testing.T, within time.Duration) error {
	t.Helper()
	select {
	case err := <-w.done:
		w.done <- err // for the cleanup
		return err
	case <-time.After(within):
		t.Fatalf("worker still running %v after its client ended; stderr:\n%s", within, w.errb)
		return nil
	}
}

// remote builds a command that reaches the GPU only through the worker.
func (w *worker) remote(t *testing.T, bin string, args ...string) *exec.Cmd {
	cmd := exec.Command(bin, args...)
	cmd.Env = append(cleanEnv(), "GPUWARDEN_REMOTE=unix:"+w.sock,
		"LD_LIBRARY_PATH="+filepath.Dir(simtest.Bin(t, "remote/libcuda.so.1")))
	return cmd
}

func output(t *testing.T, cmd *exec.Cmd) (string, string) {
	t.Helper()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %q: %v\nstdout:\n%s\nstderr:\n%s", filepath.Base(cmd.Path), cmd.Args[1:], err, out, stderr.String())
	}
	return string(out), stderr.String()
}

var benchValue = regexp.MustCompile(`(?m)^BENCH (\S+) (\S+) `)

// TestRemoteWorkload runs simgpu's workload remotely and locally, by both of
// its ways of finding the driver (linking and cuGetProcAddress_v2).
func TestRemoteWorkload(t *testing.T) {
	bin := simtest.Bin(t, "simgpu/workload")
	for _, resolve := range []string{"direct", "procaddr"} {
		t.Run(resolve, func(t *testing.T) {
			args := []string{"--steps", "30", "--kernels", "8", "--kernel-ns", "50000", "--alloc", "1Gi", "--resolve", resolve}
			m := simtest.NewMachine(t, 1, "8Gi")
			local, _ := output(t, m.Command(bin, args...))
			w := startWorker(t, m, true, "GPUWARDEN_MEMORY_LIMIT=4Gi")
			remote, _ := output(t, w.remote(t, bin, args...))
			if err := w.wait(t, 10*time.Second); err != nil {
				t.Errorf("worker: %v; stderr:\n%s", err, w.errb)
			}
			for _, out := range []string{local, remote} {
				if !strings.Contains(out, "alloc=1073741824") {
					t.Errorf("workload did not report its allocation:\n%s", out)
				}
			}
			lm, rm := benchValue.FindAllStringSubmatch(local, -1), benchValue.FindAllStringSubmatch(remote, -1)
			if len(lm) == 0 || len(lm) != len(rm) {
				t.Fatalf("local printed %d BENCH lines, remote %d:\n%s\n%s", len(lm), len(rm), local, remote)
			}
			for i := range lm {
				if lm[i][1] != rm[i][1] || rm[i][2] == "0" || rm[i][2] == "0.00" {
					t.Errorf("BENCH line %d: local %s, remote %s %s", i, lm[i][1], rm[i][1], rm[i][2])
				}
			}
			if !strings.Contains(w.errb.String(), "1 images received") {
				t.Errorf("the worker did not receive workload's module image once: %s", w.errb)
			}
		})
	}
}

// TestRemoteBulkRing: a client straight on a worker's unix socket moves
// bulk copies through the shared ring, byte for byte both ways (gw-remote
// compares what comes back). Device-to-host chunks are announced in the
// ring, without a frame each, except to wake a client that sleeps (a
// handful: the copies stream); with a worker that keeps to frames (as an
// older one does) each chunk has its frame, and the client reads them.
func TestRemoteBulkRing(t *testing.T) {
	m := simtest.NewMachine(t, 1, "8Gi")
	chunks := regexp.MustCompile(`, bulk ring \((\d+) device-to-host chunks announced (in it, (\d+) of them by a frame too|by frames)\)`)
	for _, frames := range []bool{false, true} {
		t.Run(map[bool]string{false: "announced-in-ring", true: "older-worker-frames"}[frames], func(t *testing.T) {
			older := "GPUWARDEN_WORKER_RING_FRAMES=0"
			if frames {
				older = "GPUWARDEN_WORKER_RING_FRAMES=1"
			}
			w := startWorker(t, m, true, "GPUWARDEN_MEMORY_LIMIT=4Gi", older)
			out, _ := output(t, w.remote(t, simtest.Bin(t, "interposer/gw-remote"), "bandwidth", "24"))
			if !strings.Contains(out, "htod_mib_per_sec") || !strings.Contains(out, "dtoh_mib_per_sec") {
				t.Fatalf("gw-remote bandwidth printed no rates:\n%s", out)
			}
			if err := w.wait(t, 10*time.Second); err != nil {
				t.Fatalf("worker: %v; stderr:\n%s", err, w.errb)
			}
			got := chunks.FindStringSubmatch(w.errb.String())
			if got == nil || (got[3] == "") != frames {
				t.Fatalf("the session did not take the bulk ring, announcing %s: %s",
					map[bool]string{false: "in it", true: "by frames"}[frames], w.errb)
			}
			n, _ := strconv.Atoi(got[1])
			if n < 4*24*4 { // four copies of 24 MiB in 256 KiB slots
				t.Errorf("%d device-to-host chunks through the ring, want at least %d", n, 4*24*4)
			}
			if woke, _ := strconv.Atoi(got[3]); !frames && woke > n/4 {
				t.Errorf("%d of %d chunks announced by a frame too: the client slept in most waits", woke, n)
			}
		})
	}
}

// remoteOnlyChecks are cuda-check's checks whose result differs remotely,
// and why. Every other check must pass as it does locally.
var remoteOnlyChecks = map[string]string{
	// Managed memory is refused remotely (docs/remote.md): its attributes are 0
	// and cuMemAllocManaged is CUDA_ERROR_NOT_SUPPORTED.
	"device/attributes":              "managed memory",
	"context/destroy-returns-memory": "managed memory",
	"memory/out-of-memory":           "managed memory",
	"memory/fill-device":             "managed memory",
	"memory/managed":                 "managed memory",
	// The client library sends launches as they come: the worker's wait at
	// the device's queue, the program's only once the socket's buffers fill.
	"stream/queue-depth": "launches are not held at the device's queue depth",
}

// TestRemoteCUDAConformance runs cuda-check remotely against simgpu alone
// (no interposer: the suite checks simgpu's own memory figures) on each
// data path: the worker's own socket (the same node, with the bulk ring), a
// handed-over TLS connection (another node, TLS records in C), and the Go
// relays.
func TestRemoteCUDAConformance(t *testing.T) {
	for _, c := range []struct {
		name  string
		start func(*testing.T, *simtest.Machine, bool, ...string) *worker
	}{{"unix", startWorker}, {"tls", startHandedOver}, {"relayed", startRelayed}} {
		t.Run(c.name, func(t *testing.T) {
			m := simtest.NewMachine(t, 4, "8Gi") // what cuda-check expects
			w := c.start(t, m, false)
			testRemoteCUDAConformance(t, w)
			if err := w.wait(t, 10*time.Second); err != nil {
				t.Fatalf("worker: %v; stderr:\n%s", err, w.errb)
			}
			if want := map[string]string{"unix": ", bulk ring (", "tls": ", over TLS, records in ", "relayed": ", plain\n"}[c.name]; !strings.Contains(w.errb.String(), want) {
				t.Errorf("the worker's session was not %q: %s", want, w.errb)
			}
			if c.name == "tls" && os.Getenv("GPUWARDEN_REQUIRE_KERNEL_TLS") == "1" && !strings.Contains(w.errb.String(), "records in the kernel") {
				t.Errorf("GPUWARDEN_REQUIRE_KERNEL_TLS=1, but the worker's records were not the kernel's: %s", w.errb)
			}
		})
	}
}

func testRemoteCUDAConformance(t *testing.T, w *worker) {
	cmd := w.remote(t, simtest.Bin(t, "simgpu/cuda-check"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	results, plan, stray := parseCheck(stdout.String())
	if plan != len(results) || len(results) < 80 {
		t.Fatalf("cuda-check ran %d checks, plan %d (%v); stdout:\n%s\nstderr:\n%s", len(results), plan, runErr,
			stdout.String(), stderr.String())
	}
	for _, line := range stray {
		t.Errorf("cuda-check printed an unexpected line: %q", line)
	}
	differ := 0
	for _, r := range results {
		if why, ok := remoteOnlyChecks[r.name]; ok {
			if !r.ok {
				differ++
				t.Logf("%s differs remotely (%s): %s", r.name, why, r.detail)
			}
			continue
		}
		if !r.ok {
			t.Errorf("%s: %s", r.name, r.detail)
		}
	}
	t.Logf("%d of %d checks pass remotely; %d differ as listed", len(results)-differ, len(results), differ)
}

type checkResult struct {
	name, detail string
	ok           bool
}

var (
	checkLine = regexp.MustCompile(`^(ok|not ok) - ([^\s:]+)(?:: (.*))?$`)
	planLine  = regexp.MustCompile(`^1\.\.(\d+)$`)
)

func parseCheck(out string) (results []checkResult, plan int, stray []string) {
	plan = -1
	for _, line := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		if m := checkLine.FindStringSubmatch(line); m != nil {
			results = append(results, checkResult{name: m[2], ok: m[1] == "ok", detail: m[3]})
		} else if m := planLine.FindStringSubmatch(line); m != nil {
			plan, _ = strconv.Atoi(m[1])
		} else if line != "" {
			stray = append(stray, line)
		}
	}
	return results, plan, stray
}

// TestRemoteKernelParamBytes launches a kernel of nine parameters of
// different sizes and alignments that writes its parameter buffer to device
// memory: every byte must arrive, by kernelParams (packed by the client from
// the layout the worker's driver reports) and by a caller-packed `extra`.
func TestRemoteKernelParamBytes(t *testing.T) {
	m := simtest.NewMachine(t, 1, "8Gi")
	bin := simtest.Bin(t, "interposer/gw-remote")
	local, _ := output(t, m.Command(bin, "params"))
	w := startWorker(t, m, true, "GPUWARDEN_MEMORY_LIMIT=4Gi")
	remote, _ := output(t, w.remote(t, bin, "params"))
	want := "params ok 9 params 61 bytes\n"
	if local != want || remote != want {
		t.Errorf("local %q, remote %q, want %q", local, remote, want)
	}
}

// TestRemoteQuota: the worker's quota is what the remote program sees, by
// CUDA and by NVML, and an allocation over it is refused.
func TestRemoteQuota(t *testing.T) {
	m := simtest.NewMachine(t, 1, "8Gi")
	w := startWorker(t, m, true, "GPUWARDEN_MEMORY_LIMIT=2Gi")
	out, _ := output(t, w.remote(t, simtest.Bin(t, "interposer/gw-remote"), "quota", itoa(2<<30)))
	want := "total 2147483648\nalloc-over CUDA_ERROR_OUT_OF_MEMORY\nalloc-half CUDA_SUCCESS\nnvml-total 2147483648\n"
	if out != want {
		t.Errorf("got\n%swant\n%s", out, want)
	}
}

// TestRemoteAsyncError: a launch the driver refuses (its parameter buffer is
// too short for the kernel, which only the driver knows) is accepted at once
// and reported by the next synchronizing call, once.
func TestRemoteAsyncError(t *testing.T) {
	m := simtest.NewMachine(t, 1, "8Gi")
	bin := simtest.Bin(t, "interposer/gw-remote")
	local, _ := output(t, m.Command(bin, "async"))
	if want := "launch CUDA_ERROR_INVALID_VALUE\nsync CUDA_SUCCESS\nsync-again CUDA_SUCCESS\n"; local != want {
		t.Errorf("local: got\n%swant\n%s", local, want)
	}
	w := startWorker(t, m, true, "GPUWARDEN_MEMORY_LIMIT=2Gi")
	remote, _ := output(t, w.remote(t, bin, "async"))
	if want := "launch CUDA_SUCCESS\nsync CUDA_ERROR_INVALID_VALUE\nsync-again CUDA_SUCCESS\n"; remote != want {
		t.Errorf("remote: got\n%swant\n%s", remote, want)
	}
}

// TestRemoteFlush: queued work is sent without waiting for a synchronous
// call: a program that launches and then sleeps has its kernel run.
func TestRemoteFlush(t *testing.T) {
	m := simtest.NewMachine(t, 1, "8Gi")
	w := startWorker(t, m, true, "GPUWARDEN_MEMORY_LIMIT=2Gi")
	out, _ := output(t, w.remote(t, simtest.Bin(t, "interposer/gw-remote"), "flush"))
	if out != "query CUDA_SUCCESS\n" {
		t.Errorf("got %q: the 100 ms kernel had not run 500 ms after its launch", out)
	}
}

// TestRemoteWaitPolicy: a synchronize waits for its reply as the driver
// waits for the device: on a default context it polls, so a reply within
// 20 ms costs the waiting thread no sleep (in one of five tries at least:
// on a loaded machine a reply can come later); on a context created with
// CU_CTX_SCHED_BLOCKING_SYNC, or a primary context given that flag, it
// sleeps in every wait, as a blocking read does.
func TestRemoteWaitPolicy(t *testing.T) {
	m := simtest.NewMachine(t, 1, "8Gi")
	sleeps := func(args ...string) []int {
		w := startWorker(t, m, true, "GPUWARDEN_MEMORY_LIMIT=2Gi") // a worker serves one session
		out, _ := output(t, w.remote(t, simtest.Bin(t, "interposer/gw-remote"), append([]string{"wait"}, args...)...))
		var got []int
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			n, err := strconv.Atoi(strings.TrimPrefix(line, "sleeps "))
			if err != nil {
				t.Fatalf("gw-remote wait printed %q", out)
			}
			got = append(got, n)
		}
		if len(got) != 5 {
			t.Fatalf("gw-remote wait printed %q, want five waits", out)
		}
		return got
	}
	if auto := sleeps("0", "2"); !slices.Contains(auto, 0) {
		t.Errorf("default context: the thread slept in every wait for a 2 ms kernel %v: it did not poll", auto)
	}
	if blocking := sleeps("4", "10"); slices.Contains(blocking, 0) {
		t.Errorf("CU_CTX_SCHED_BLOCKING_SYNC: a wait for a 10 ms kernel without sleeping %v: it polled", blocking)
	}
	// The CUDA runtime's cudaSetDeviceFlags: the primary context's flags.
	if blocking := sleeps("4", "10", "primary"); slices.Contains(blocking, 0) {
		t.Errorf("primary context, CU_CTX_SCHED_BLOCKING_SYNC: a wait for a 10 ms kernel without sleeping %v: it polled",
			blocking)
	}
}

// TestRemoteThreads: threads of one client, each on its own stream, share
// the session; every reply reaches the thread that asked.
func TestRemoteThreads(t *testing.T) {
	m := simtest.NewMachine(t, 1, "8Gi")
	w := startWorker(t, m, true, "GPUWARDEN_MEMORY_LIMIT=2Gi")
	out, _ := output(t, w.remote(t, simtest.Bin(t, "interposer/gw-remote"), "threads", "8"))
	if out != "threads ok 8\n" {
		t.Errorf("got %q", out)
	}
}

// TestRemoteFork: a forked child opens a session of its own (here, with a
// second worker at the same socket path) and the parent's goes on.
func TestRemoteFork(t *testing.T) {
	m := simtest.NewMachine(t, 1, "8Gi")
	parent := startWorker(t, m, true, "GPUWARDEN_MEMORY_LIMIT=2Gi")
	cmd := parent.remote(t, simtest.Bin(t, "interposer/gw-remote"), "fork")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := simtest.Start(t, cmd)
	p.WaitLine(t, "ready", 20*time.Second)
	child := startWorkerAt(t, parent.sock, m, true, "GPUWARDEN_MEMORY_LIMIT=2Gi") // the first unlinked it on accept
	if _, err := in.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	out, err := p.Wait()
	if err != nil || !strings.Contains(out, "child ok\n") || !strings.Contains(out, "parent ok\n") {
		t.Errorf("gw-remote fork: %v\n%s%s", err, out, p.Stderr())
	}
	for _, w := range []*worker{parent, child} {
		if err := w.wait(t, 10*time.Second); err != nil || !strings.Contains(w.errb.String(), "session ended") {
			t.Errorf("worker: %v; stderr:\n%s", err, w.errb)
		}
	}
}

// TestRemoteWorkerKilled: when the worker dies, the client's calls fail with
// CUDA_ERROR_DEVICE_UNAVAILABLE at once, the waiting one included, and the
// program can go on to exit.
func TestRemoteWorkerKilled(t *testing.T) {
	m := simtest.NewMachine(t, 1, "8Gi")
	w := startWorker(t, m, true, "GPUWARDEN_MEMORY_LIMIT=2Gi")
	p := simtest.Start(t, w.remote(t, simtest.Bin(t, "interposer/gw-remote"), "hold"))
	p.WaitLine(t, "ready", 20*time.Second)
	killed := time.Now()
	if err := w.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	p.WaitLine(t, "failed CUDA_ERROR_DEVICE_UNAVAILABLE", 10*time.Second)
	p.WaitLine(t, "then CUDA_ERROR_DEVICE_UNAVAILABLE", 10*time.Second)
	if _, err := p.Wait(); err != nil {
		t.Errorf("client: %v; stderr:\n%s", err, p.Stderr())
	}
	if d := time.Since(killed); d > 10*time.Second {
		t.Errorf("the client took %v to notice", d)
	}
}

// TestRemoteWorkerKilledRingFull: a worker that dies while every slot of the
// bulk ring is full (it stopped emptying them) fails the client's copy; the
// client does not wait for slots no one will free.
func TestRemoteWorkerKilledRingFull(t *testing.T) {
	m := simtest.NewMachine(t, 1, "8Gi")
	w := startWorker(t, m, false)
	p := simtest.Start(t, w.remote(t, simtest.Bin(t, "interposer/gw-remote"), "bandwidth", "256"))
	p.WaitLine(t, "ready", 20*time.Second)
	if err := w.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // the client fills its buffer and then the ring
	killed := time.Now()
	if err := w.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	p.WaitLine(t, "fail cuMemcpyHtoD_v2(d, h, n): CUDA_ERROR_DEVICE_UNAVAILABLE", 10*time.Second)
	if d := time.Since(killed); d > 5*time.Second {
		t.Errorf("the client took %v to notice", d)
	}
}

// TestRemoteClientKilled: when the client dies, its worker ends the session
// and exits, and the memory it held is free again.
func TestRemoteClientKilled(t *testing.T) {
	m := simtest.NewMachine(t, 1, "8Gi")
	w := startWorker(t, m, true, "GPUWARDEN_MEMORY_LIMIT=2Gi")
	p := simtest.Start(t, w.remote(t, simtest.Bin(t, "interposer/gw-remote"), "hold"))
	p.WaitLine(t, "ready", 20*time.Second)
	st := openState(t, m.State)
	if st.used0() == 0 {
		t.Fatal("the held allocation is not on the device")
	}
	if err := p.Cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := w.wait(t, 5*time.Second); err != nil {
		t.Errorf("worker: %v; stderr:\n%s", err, w.errb)
	}
	// simgpu frees a dead process's memory when the next process starts
	if _, err := m.Command(simtest.Bin(t, "interposer/gw-remote"), "quota", itoa(1<<30)).Output(); err != nil {
		t.Fatal(err)
	}
	if u := st.used0(); u != 0 {
		t.Errorf("device 0 has %d bytes used after the session ended", u)
	}
}

// TestRemoteModuleCache: a module image crosses the link once per content
// hash; a second session finds it in GPUWARDEN_MODULE_CACHE, unless the file
// there is not what its name says.
func TestRemoteModuleCache(t *testing.T) {
	m := simtest.NewMachine(t, 1, "8Gi")
	cache := t.TempDir()
	bin := simtest.Bin(t, "interposer/gw-remote")
	run := func(want string) {
		t.Helper()
		w := startWorker(t, m, true, "GPUWARDEN_MEMORY_LIMIT=2Gi", "GPUWARDEN_MODULE_CACHE="+cache)
		out, _ := output(t, w.remote(t, bin, "module"))
		if !strings.HasPrefix(out, "module ok ") {
			t.Errorf("module: %q", out)
		}
		if err := w.wait(t, 10*time.Second); err != nil {
			t.Errorf("worker: %v", err)
		}
		if !strings.Contains(w.errb.String(), want) {
			t.Errorf("worker stderr %q, want %q", w.errb, want)
		}
	}
	run("1 images received, 0 images from cache")
	run("0 images received, 1 images from cache")
	files, _ := filepath.Glob(filepath.Join(cache, "*"))
	if len(files) != 1 {
		t.Fatalf("cache holds %q, want one image", files)
	}
	raw, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	raw[len(raw)/2] ^= 1
	if err := os.WriteFile(files[0], raw, 0o644); err != nil {
		t.Fatal(err)
	}
	run("1 images received, 0 images from cache") // the corrupt copy is not believed
}

// TestRemoteFactsAnsweredLocally: a framework asks for every attribute of
// a device, its handle and UUID and a module's function, often more than
// once; the client library asks the worker once and answers the rest
// itself, so fifty rounds of questions cost the worker no more frames than
// one (each answer the same as the first: gw-remote checks that).
func TestRemoteFactsAnsweredLocally(t *testing.T) {
	m := simtest.NewMachine(t, 1, "8Gi")
	bin := simtest.Bin(t, "interposer/gw-remote")
	frames := func(rounds int) int {
		t.Helper()
		w := startWorker(t, m, true, "GPUWARDEN_MEMORY_LIMIT=2Gi")
		want := "queries ok " + strconv.Itoa(rounds) + "\n"
		start := time.Now()
		if out, _ := output(t, w.remote(t, bin, "queries", strconv.Itoa(rounds))); out != want {
			t.Fatalf("queries %d: %q, want %q", rounds, out, want)
		}
		t.Logf("%d rounds of questions: %v", rounds, time.Since(start).Round(time.Microsecond))
		if err := w.wait(t, 10*time.Second); err != nil {
			t.Fatalf("worker: %v", err)
		}
		f := regexp.MustCompile(`session ended: (\d+) frames`).FindStringSubmatch(w.errb.String())
		if f == nil {
			t.Fatalf("the worker did not count its frames: %s", w.errb)
		}
		n, _ := strconv.Atoi(f[1])
		return n
	}
	one, fifty := frames(1), frames(50)
	// A missing kernel's NOT_FOUND is asked each round (the worker is the
	// one that knows an image's kernels): 49 more frames at most.
	if fifty > one+49 {
		t.Errorf("one round of questions took %d frames, fifty took %d: answers that do not change were asked again", one, fifty)
	}
	t.Logf("frames: %d for one round, %d for fifty", one, fifty)
}

// TestRemoteImageSizes: the client sends an ELF image's extent (from its
// section headers) and a fatbin's (from its header), not what follows them;
// the cache keeps exactly those bytes.
func TestRemoteImageSizes(t *testing.T) {
	m := simtest.NewMachine(t, 1, "8Gi")
	cache := t.TempDir()
	w := startWorker(t, m, false, "GPUWARDEN_MODULE_CACHE="+cache)
	out, _ := output(t, w.remote(t, simtest.Bin(t, "interposer/gw-remote"), "images"))
	if out != "images ok\n" {
		t.Fatalf("got %q", out)
	}
	files, _ := filepath.Glob(filepath.Join(cache, "*"))
	var sizes []int64
	for _, f := range files {
		st, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		sizes = append(sizes, st.Size())
	}
	slices.Sort(sizes)
	if want := []int64{1016, 4096}; !slices.Equal(sizes, want) {
		t.Errorf("cached image sizes %v, want %v", sizes, want)
	}
}

// TestRemoteBadEnv: a malformed GPUWARDEN_REMOTE fails cuInit with one line
// naming the variable.
func TestRemoteBadEnv(t *testing.T) {
	for _, v := range []string{"tcp:host:7070", "unix:", "/tmp/sock"} {
		cmd := exec.Command(simtest.Bin(t, "interposer/gw-remote"), "params")
		cmd.Env = append(cleanEnv(), "GPUWARDEN_REMOTE="+v,
			"LD_LIBRARY_PATH="+filepath.Dir(simtest.Bin(t, "remote/libcuda.so.1")))
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err == nil || !strings.Contains(string(out), "fail cuInit(0): CUDA_ERROR_NO_DEVICE") {
			t.Errorf("GPUWARDEN_REMOTE=%s: %v, stdout %q", v, err, out)
		}
		if lines := strings.Split(strings.TrimSpace(stderr.String()), "\n"); len(lines) != 1 ||
			!strings.Contains(lines[0], "GPUWARDEN_REMOTE") {
			t.Errorf("GPUWARDEN_REMOTE=%s: stderr %q, want one line naming the variable", v, stderr.String())
		}
	}
}

// TestRemoteWorkerFd serves a session as the agent does: it accepts the
// client's connection itself and hands the worker the connected socket.
func TestRemoteWorkerFd(t *testing.T) {
	m := simtest.NewMachine(t, 1, "8Gi")
	dir, err := os.MkdirTemp("", "gwr")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	l, err := net.Listen("unix", filepath.Join(dir, "s"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	w := &worker{sock: filepath.Join(dir, "s")}
	client := w.remote(t, simtest.Bin(t, "interposer/gw-remote"), "params")
	var out, stderr bytes.Buffer
	client.Stdout, client.Stderr = &out, &stderr
	if err := client.Start(); err != nil {
		t.Fatal(err)
	}
	c, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	f, err := c.(*net.UnixConn).File()
	c.Close()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(simtest.Bin(t, "gpuwarden-worker"), "--fd", "3")
	cmd.Env = append(append(cleanEnv(), m.Env()...), "LD_LIBRARY_PATH="+filepath.Dir(simtest.Bin(t, "simgpu/libcuda.so.1")))
	cmd.ExtraFiles = []*os.File{f}
	var werr bytes.Buffer
	cmd.Stderr = &werr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := client.Wait(); err != nil || out.String() != "params ok 9 params 61 bytes\n" {
		t.Errorf("client: %v, %q; stderr:\n%s", err, out.String(), stderr.String())
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("worker: %v; stderr:\n%s", err, werr.String())
	}
}

// TestRemoteMalformedFrame: a frame that breaks the protocol ends the
// worker with a stderr line and a non-zero status, not a crash.
func TestRemoteMalformedFrame(t *testing.T) {
	cases := map[string][]byte{
		"oversized": append([]byte{0xff, 0xff, 0xff, 0x7f, 1, 0}, make([]byte, 18)...),
		"bad hello": append([]byte{8, 0, 0, 0, 10, 0, 1, 0, 1}, make([]byte, 23)...),
	}
	for name, frame := range cases {
		t.Run(name, func(t *testing.T) {
			m := simtest.NewMachine(t, 1, "8Gi")
			w := startWorker(t, m, false)
			c, err := net.Dial("unix", w.sock)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := c.Write(frame); err != nil {
				t.Fatal(err)
			}
			err = w.wait(t, 10*time.Second)
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(w.errb.String(), "protocol error") {
				t.Errorf("worker: %v, stderr %q; want exit status 1 and a protocol error", err, w.errb)
			}
		})
	}
}
