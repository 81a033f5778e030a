package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/agentapi"
	"github.com/gpuwarden/gpuwarden/enforcer/hostcgroup"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/handover"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/pki"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/session"
	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

// The remote tests run a GPU node and a client node as two network
// namespaces joined by a veth pair: the agent (remote part on, simgpu) in
// one, `gpuwarden run --remote` and its programs in the other, with no
// libcuda but the remote client library.
const (
	serverAddr = "10.231.0.1"
	clientAddr = "10.231.0.2"
)

type remoteRig struct {
	m          *simtest.Machine
	server     *simtest.NetNS
	client     *simtest.NetNS
	agent      *simtest.Agent
	creds      string
	clientBin  string // the client node's programs: copies, with no libcuda beside them
	agentEnv   []string
	cgroupRoot string
	dataPath   string // gpuwarden run --data-path; "": the default (direct)
	sameNode   bool   // run on the GPU node, through its agent's local socket
}

// dataPaths are both ways a session's bytes go; tests of the remote path
// run on each.
var dataPaths = []string{session.PathDirect, session.PathRelayed}

// wantPath checks that `gpuwarden run` reported its sessions on path.
func wantPath(t *testing.T, p *simtest.Proc, path string) {
	t.Helper()
	if !strings.Contains(p.Stderr(), ", "+path+"\n") {
		t.Errorf("the session did not report the %s data path:\n%s", path, p.Stderr())
	}
}

var rigIdentities = map[string]pki.Identity{
	"a": {Namespace: "team-a", Pod: "train-a", Container: "main"},
	"b": {Namespace: "team-b", Pod: "train-b", Container: "main"},
}

// newRemoteRig starts the two nodes. observe turns the agent's eBPF
// observation on: on a machine shared with other tests the agent then
// attaches to every copy of libcuda their processes map, which can take
// it many seconds to start and to stop.
func newRemoteRig(t *testing.T, observe bool) *remoteRig {
	simtest.RequirePrivileged(t, "network namespaces, cgroups and eBPF")
	r := &remoteRig{m: simtest.NewMachine(t, 1, "16Gi"), creds: t.TempDir(), clientBin: t.TempDir()}
	r.server, r.client = simtest.NewNetNS(t), simtest.NewNetNS(t)
	simtest.Veth(t, r.server, r.client, serverAddr+"/24", clientAddr+"/24")
	if err := pki.CreateCA(r.creds, "test CA", time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := pki.Issue(r.creds, r.creds, pki.Request{Name: "server", Hosts: []string{serverAddr}, Validity: time.Hour}); err != nil {
		t.Fatal(err)
	}
	for name, id := range rigIdentities {
		if err := pki.Issue(r.creds, r.creds, pki.Request{Name: name, Client: &id, Validity: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{"simgpu/workload"} {
		b, err := os.ReadFile(simtest.Bin(t, p))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(r.clientBin, filepath.Base(p)), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	simtest.Bin(t, "gpuwarden-worker")
	simtest.Bin(t, "remote/libcuda.so.1")
	parent := fmt.Sprintf("gpuwarden-test/remote-%d-%d", os.Getpid(), time.Now().UnixNano())
	t.Cleanup(func() { // after the agent stops: it leaves the sessions' parent cgroup
		mnt, err := hostcgroup.Mount("/proc/self/mountinfo")
		if err == nil {
			_ = os.Remove(filepath.Join(mnt, parent))
		}
	})
	r.agentEnv = []string{
		"GPUWARDEN_REMOTE_ENABLED=true",
		"GPUWARDEN_REMOTE_LISTEN=" + serverAddr + ":7070",
		"GPUWARDEN_REMOTE_CERT=" + filepath.Join(r.creds, "server.crt"),
		"GPUWARDEN_REMOTE_KEY=" + filepath.Join(r.creds, "server.key"),
		"GPUWARDEN_REMOTE_CA=" + filepath.Join(r.creds, "ca.crt"),
		"GPUWARDEN_REMOTE_TIMEOUT=2s",
		"GPUWARDEN_REMOTE_CGROUP_PARENT=" + parent,
		// The client library runs on this host too, as it would on no real
		// GPU node: the probes stay on the node's driver alone.
		"GPUWARDEN_EBPF_SCAN_INTERVAL=0",
		// The worker links libcuda.so.1 by name: the node's driver is simgpu's.
		"LD_LIBRARY_PATH=" + filepath.Dir(simtest.Bin(t, "simgpu/libcuda.so.1")),
		fmt.Sprintf("GPUWARDEN_EBPF_ENABLED=%v", observe),
	}
	r.agent = simtest.StartAgentIn(t, r.m, r.server, r.agentEnv...)
	return r
}

// restart starts the agent again on the same control directory.
func (r *remoteRig) restart(t *testing.T) {
	env := append([]string{"GPUWARDEN_CONTROL_DIR=" + r.agent.ControlDir,
		"GPUWARDEN_ENFORCEMENT_STATE_FILE=" + r.agent.StateFile}, r.agentEnv...)
	r.agent = simtest.StartAgentIn(t, r.m, r.server, env...)
}

// run starts `gpuwarden run --remote` on the client node as identity who,
// running the client node's copy of prog. Its environment has no simgpu
// and no library path.
func (r *remoteRig) run(t *testing.T, who string, flags []string, prog string, args ...string) *simtest.Proc {
	t.Helper()
	p := simtest.Start(t, r.runCmd(t, who, flags, prog, args...))
	// The program too, not only `gpuwarden run`: it holds the output the
	// test reads until it exits.
	t.Cleanup(func() { _ = syscall.Kill(-p.Cmd.Process.Pid, syscall.SIGKILL) })
	return p
}

// runCmd is the command run starts, in a process group of its own.
func (r *remoteRig) runCmd(t *testing.T, who string, flags []string, prog string, args ...string) *exec.Cmd {
	all := append([]string{"run", "--remote", serverAddr, "--cert", filepath.Join(r.creds, who+".crt"),
		"--key", filepath.Join(r.creds, who+".key"), "--ca", filepath.Join(r.creds, "ca.crt")}, flags...)
	if r.dataPath != "" {
		all = append(all, "--data-path", r.dataPath)
	}
	node := r.client
	if r.sameNode {
		node = r.server
		all = append(all, "--local-socket", filepath.Join(r.agent.ControlDir, session.LocalSocket))
	}
	all = append(append(all, "--", filepath.Join(r.clientBin, prog)), args...)
	cmd := node.Command(simtest.Bin(t, "gpuwarden"), all...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "GPUWARDEN_REMOTE_TIMEOUT=2s"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd
}

// remoteEntries are the API's entries of the remote sessions, by namespace.
func remoteEntries(t *testing.T, agent *simtest.Agent) map[string]agentapi.ContainerDevice {
	var resp agentapi.ContainersResponse
	agent.GetJSON(t, "/api/v1/containers", &resp)
	out := map[string]agentapi.ContainerDevice{}
	for _, c := range resp.Containers {
		if c.Namespace != "" && c.GPU == 0 {
			out[c.Namespace] = c
		}
	}
	return out
}

// TestRemoteWorkloadRuns: simgpu's workload on the client node runs on the
// server's GPU: it allocates, launches and reports its rate; the agent
// lists the session under its client's identity; its exit status comes
// back through `gpuwarden run`.
func TestRemoteWorkloadRuns(t *testing.T) {
	r := newRemoteRig(t, false)
	for _, path := range dataPaths {
		t.Run(path, func(t *testing.T) {
			r.dataPath = path
			testRemoteWorkloadRuns(t, r, path)
			if path == session.PathDirect {
				wantRecordsWhereKernelSays(t, r)
			}
		})
	}
	// On the GPU node itself: the worker's own socket, no TLS.
	t.Run("same_node", func(t *testing.T) {
		r.dataPath, r.sameNode = "", true
		defer func() { r.sameNode = false }()
		testRemoteWorkloadRuns(t, r, session.PathDirect+" on the same node")
		simtest.Eventually(t, 10*time.Second, func() error { // the worker's last line comes as it exits
			if l := r.agent.Log(); !strings.Contains(l, "local=true") || !strings.Contains(l, ", bulk ring") {
				return fmt.Errorf("the server did not hand the session's worker socket over, or its copies took no ring:\n%s", l)
			}
			return nil
		})
	})
}

// wantRecordsWhereKernelSays: the agent said at start whether this kernel
// carries TLS records, and a handed-over session's worker sealed its
// records where it said.
func wantRecordsWhereKernelSays(t *testing.T, r *remoteRig) {
	t.Helper()
	said, records := "remote: kernel TLS unavailable", ", over TLS, records in user space (kernel TLS: "
	if handover.KernelTLS() == nil {
		said, records = "remote: kernel TLS available", ", over TLS, records in the kernel"
	}
	simtest.Eventually(t, 10*time.Second, func() error { // the worker's last line comes as it exits
		if l := r.agent.Log(); !strings.Contains(l, said) || !strings.Contains(l, records) {
			return fmt.Errorf("the agent's log lacks %q or the worker's %q:\n%s", said, records, l)
		}
		return nil
	})
}

func testRemoteWorkloadRuns(t *testing.T, r *remoteRig, path string) {
	p := r.run(t, "a", []string{"--memory", "0.5"}, "workload", "--alloc", "1Gi", "--seconds", "2",
		"--kernels", "8", "--kernel-ns", "200000")
	p.WaitLine(t, "ready", 20*time.Second)
	simtest.Eventually(t, 10*time.Second, func() error {
		e, ok := remoteEntries(t, r.agent)["team-a"]
		if !ok {
			return fmt.Errorf("no entry of team-a")
		}
		if e.Pod != "train-a" || e.Container != "main" || !e.Enforced || e.MemoryLimitBytes != 8<<30 {
			return fmt.Errorf("entry %+v", e)
		}
		if e.MemoryUsedBytes < 1<<30 {
			return fmt.Errorf("team-a uses %d bytes, want its 1Gi", e.MemoryUsedBytes)
		}
		return nil
	})
	wantTraffic(t, r, path)
	out, err := p.Wait()
	if err != nil {
		t.Fatalf("remote workload: %v\nstdout:\n%s\nstderr:\n%s", err, out, p.Stderr())
	}
	if !strings.Contains(out, "BENCH workload_steps_per_sec") {
		t.Fatalf("remote workload printed no rate:\n%s", out)
	}
	wantPath(t, p, path)
	// Exit statuses come back.
	cmd := r.runCmd(t, "a", []string{"--memory", "1Gi"}, "workload", "--no-such-option")
	if err := cmd.Run(); err == nil {
		t.Fatal("a failing remote program exited 0")
	}
}

// wantTraffic checks the server counts team-a's session's bytes both ways
// on the network paths, and has no counters for a same-node session.
func wantTraffic(t *testing.T, r *remoteRig, path string) {
	t.Helper()
	simtest.Eventually(t, 10*time.Second, func() error {
		fams := r.agent.Scrape(t)
		for _, dir := range []string{"sent", "received"} {
			want := map[string]string{"namespace": "team-a", "pod": "train-a", "container": "main", "direction": dir}
			s, ok := simtest.Find(fams, "gpuwarden_remote_session_bytes_total", want)
			switch {
			case r.sameNode && ok:
				return fmt.Errorf("a same-node session has byte counters: %+v", s)
			case r.sameNode:
			case !ok:
				return fmt.Errorf("no gpuwarden_remote_session_bytes_total with %v", want)
			case s.Labels["path"] != path:
				return fmt.Errorf("the session's bytes are labelled path=%q, want %q", s.Labels["path"], path)
			case s.Value < 1000: // the hello, the allocation, launches: far more than a kilobyte each way
				return fmt.Errorf("%s %.0f bytes", dir, s.Value)
			}
		}
		return nil
	})
}

// TestRemoteSharing: two remote clients and a local container share one
// GPU under the same policy: the remote ones get their memory quotas and
// their 1:2 weights, all three appear in the metrics with their labels.
func TestRemoteSharing(t *testing.T) {
	r := newRemoteRig(t, false)
	for _, path := range dataPaths {
		t.Run(path, func(t *testing.T) {
			r.dataPath = path
			testRemoteSharing(t, r)
		})
	}
}

func testRemoteSharing(t *testing.T, r *remoteRig) {
	prog := []string{"--alloc", "1Gi", "--seconds", "60", "--kernels", "8", "--kernel-ns", "2000000"}
	a := r.run(t, "a", []string{"--memory", "4Gi", "--weight", "1"}, "workload", prog...)
	b := r.run(t, "b", []string{"--memory", "0.25", "--weight", "2"}, "workload", prog...)
	a.WaitLine(t, "ready", 20*time.Second)
	b.WaitLine(t, "ready", 20*time.Second)
	wantPath(t, a, r.dataPath)
	local := startEnforced(t, r.m, r.agent, "local", "GPUWARDEN_COMPUTE_WEIGHT=1", "GPUWARDEN_MEMORY_LIMIT=4Gi")

	// Targets: weights 1, 2 and 1 on one GPU.
	simtest.Eventually(t, 15*time.Second, func() error {
		rem := remoteEntries(t, r.agent)
		l, ok := entry(t, r.agent, local)
		if !ok || len(rem) != 2 {
			return fmt.Errorf("entries: local %v, remote %d", ok, len(rem))
		}
		for _, c := range []struct {
			got, want float64
			who       string
		}{{rem["team-a"].ComputeLimit, 0.25, "team-a"}, {rem["team-b"].ComputeLimit, 0.5, "team-b"}, {l.ComputeLimit, 0.25, "local"}} {
			if c.got < c.want-0.01 || c.got > c.want+0.01 {
				return fmt.Errorf("%s target %.3f, want %.3f", c.who, c.got, c.want)
			}
		}
		if rem["team-a"].MemoryLimitBytes != 4<<30 || rem["team-b"].MemoryLimitBytes != 4<<30 {
			return fmt.Errorf("quotas %d %d, want 4Gi each", rem["team-a"].MemoryLimitBytes, rem["team-b"].MemoryLimitBytes)
		}
		return nil
	})
	// The heavier remote client gets about twice the lighter one's share,
	// averaged over six one-second views (wide bounds for a loaded machine).
	simtest.Eventually(t, 60*time.Second, func() error {
		var sa, sb float64
		const samples = 6
		for i := range samples {
			if i > 0 {
				time.Sleep(1100 * time.Millisecond) // NVML's next one-second window
			}
			rem := remoteEntries(t, r.agent)
			sa += rem["team-a"].ComputeShare / samples
			sb += rem["team-b"].ComputeShare / samples
		}
		if sa == 0 || sb/sa < 1.4 || sb/sa > 2.8 {
			return fmt.Errorf("shares a %.2f b %.2f: b/a %.2f, want 2 (1.4-2.8)", sa, sb, sb/sa)
		}
		t.Logf("measured shares: team-a %.2f, team-b %.2f (b/a %.2f)", sa, sb, sb/sa)
		return nil
	})
	// Metrics: all three, with their labels.
	fams := r.agent.Scrape(t)
	for _, want := range []map[string]string{
		{"namespace": "team-a", "pod": "train-a", "container": "main"},
		{"namespace": "team-b", "pod": "train-b", "container": "main"},
		{"container": local.Rel},
	} {
		if _, ok := simtest.Find(fams, "gpuwarden_container_gpu_memory_limit_bytes", want); !ok {
			t.Errorf("no gpuwarden_container_gpu_memory_limit_bytes series with %v", want)
		}
		if _, ok := simtest.Find(fams, "gpuwarden_container_compute_limit_ratio", want); !ok {
			t.Errorf("no gpuwarden_container_compute_limit_ratio series with %v", want)
		}
	}
	// smi on the GPU node names the remote clients.
	out, err := r.server.Command(simtest.Bin(t, "gpuwarden"), "smi", "--agent", r.agent.Addr).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "team-a") || !strings.Contains(string(out), "train-b") {
		t.Errorf("smi on the GPU node: %v:\n%s", err, out)
	}
	// A quota holds remotely: beyond 4Gi an allocation fails.
	q := r.runCmd(t, "a", []string{"--memory", "2Gi"}, "workload", "--alloc", "1Gi", "--try-alloc", "2Gi", "--steps", "1")
	out, _ = q.CombinedOutput()
	if !strings.Contains(string(out), "try-alloc CUDA_ERROR_OUT_OF_MEMORY") {
		t.Errorf("an allocation beyond a remote quota: %s", out)
	}
}

// TestRemoteFaults: the client goes (its session ends and its memory is
// freed within seconds); the server goes (the client's calls fail within
// the timeout and it exits); the server comes back (a new session starts
// at once).
func TestRemoteFaults(t *testing.T) {
	for _, path := range dataPaths {
		t.Run(path, func(t *testing.T) {
			r := newRemoteRig(t, false)
			r.dataPath = path
			testRemoteFaults(t, r)
		})
	}
}

func testRemoteFaults(t *testing.T, r *remoteRig) {
	p := r.run(t, "a", []string{"--memory", "0.5"}, "workload", "--alloc", "2Gi", "--seconds", "60",
		"--kernels", "8", "--kernel-ns", "200000")
	p.WaitLine(t, "ready", 20*time.Second)
	simtest.Eventually(t, 10*time.Second, func() error {
		if e, ok := remoteEntries(t, r.agent)["team-a"]; !ok || e.MemoryUsedBytes < 2<<30 {
			return fmt.Errorf("team-a not seen with its 2Gi")
		}
		return nil
	})

	// The client is killed (the whole `gpuwarden run` and its program).
	_ = syscall.Kill(-p.Cmd.Process.Pid, syscall.SIGKILL)
	_ = p.Cmd.Process.Kill()
	killed := time.Now()
	simtest.Eventually(t, 8*time.Second, func() error {
		if _, ok := remoteEntries(t, r.agent)["team-a"]; ok {
			return fmt.Errorf("team-a's session still listed")
		}
		var resp agentapi.DevicesResponse
		r.agent.GetJSON(t, "/api/v1/devices", &resp)
		if len(resp.Devices) != 1 || resp.Devices[0].MemoryUsedBytes >= 1<<30 {
			return fmt.Errorf("device memory still used: %+v", resp.Devices)
		}
		return nil
	})
	t.Logf("the killed client's session ended and its memory was freed after %v", time.Since(killed))

	// The network breaks: both ends notice within the timeout (2s).
	p = r.run(t, "a", []string{"--memory", "0.5"}, "workload", "--alloc", "1Gi", "--seconds", "60",
		"--kernels", "8", "--kernel-ns", "200000")
	p.WaitLine(t, "ready", 20*time.Second)
	r.server.Run(t, "ip", "link", "set", "gw0", "down")
	broke := time.Now()
	exited := make(chan error, 1)
	go func() { _, err := p.Wait(); exited <- err }()
	select {
	case err := <-exited:
		if err == nil {
			t.Error("the client exited 0 although its link broke")
		}
		t.Logf("the client exited %v after the link broke (%v)", time.Since(broke), err)
	case <-time.After(15 * time.Second):
		t.Fatalf("the client still runs 15s after its link broke; stderr:\n%s", p.Stderr())
	}
	simtest.Eventually(t, 10*time.Second, func() error {
		if _, ok := remoteEntries(t, r.agent)["team-a"]; ok {
			return fmt.Errorf("team-a's session still listed after the link broke")
		}
		return nil
	})
	t.Logf("the server ended the cut-off session %v after the link broke", time.Since(broke))
	r.server.Run(t, "ip", "link", "set", "gw0", "up")
	// The link carries traffic again once the veth's carrier is back and
	// the neighbour entry the cut left failed is resolved anew.
	simtest.Eventually(t, 10*time.Second, func() error {
		c, err := r.client.Dial(context.Background(), "tcp", serverAddr+":7070")
		if err != nil {
			return err
		}
		return c.Close()
	})

	// The server is killed while a client runs.
	p = r.run(t, "a", []string{"--memory", "0.5"}, "workload", "--alloc", "1Gi", "--seconds", "60",
		"--kernels", "8", "--kernel-ns", "200000")
	p.WaitLine(t, "ready", 20*time.Second)
	_ = r.agent.Proc.Cmd.Process.Kill()
	down := time.Now()
	go func() { _ = r.agent.Proc.Cmd.Wait() }() // reaped here: its exit (probes detached) may be slow on a loaded machine
	done := make(chan error, 1)
	go func() { _, err := p.Wait(); done <- err }()
	select {
	case err := <-done:
		if err == nil {
			t.Error("the client exited 0 although its server died")
		}
		t.Logf("the client exited %v after the server died (%v)", time.Since(down), err)
	case <-time.After(15 * time.Second):
		t.Fatalf("the client still runs 15s after its server died; stderr:\n%s", p.Stderr())
	}

	// The server restarts: a new session starts at once.
	r.restart(t)
	start := time.Now()
	q := r.run(t, "a", []string{"--memory", "0.5"}, "workload", "--alloc", "1Gi", "--steps", "10",
		"--kernels", "2", "--kernel-ns", "100000")
	q.WaitLine(t, "ready", 20*time.Second)
	if _, err := q.Wait(); err != nil {
		t.Fatalf("the session after the restart: %v: %s", err, q.Stderr())
	}
	t.Logf("a session ran %v after the server restarted", time.Since(start))
}

// TestRemoteRefusesStrangers: a client certificate of another CA, and no
// client certificate at all, get nothing from the server.
func TestRemoteRefusesStrangers(t *testing.T) {
	r := newRemoteRig(t, false)
	other := t.TempDir()
	if err := pki.CreateCA(other, "other CA", time.Hour); err != nil {
		t.Fatal(err)
	}
	id := rigIdentities["a"]
	if err := pki.Issue(other, other, pki.Request{Name: "a", Client: &id, Validity: time.Hour}); err != nil {
		t.Fatal(err)
	}
	smi := func(cert, key string) (string, error) {
		cmd := r.client.Command(simtest.Bin(t, "gpuwarden"), "smi", "--remote", serverAddr, "--cert", cert, "--key", key,
			"--ca", filepath.Join(r.creds, "ca.crt"))
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := smi(filepath.Join(r.creds, "a.crt"), filepath.Join(r.creds, "a.key")); err != nil ||
		!strings.Contains(out, "GPU-") {
		t.Fatalf("smi --remote with good credentials: %v: %s", err, out)
	}
	if out, err := smi(filepath.Join(other, "a.crt"), filepath.Join(other, "a.key")); err == nil {
		t.Fatalf("smi --remote with another CA's certificate answered: %s", out)
	}
	cmd := r.runCmd(t, "a", []string{"--memory", "0.5"}, "workload", "--steps", "1")
	cmd.Args = replaceArg(cmd.Args, filepath.Join(r.creds, "a.crt"), filepath.Join(other, "a.crt"))
	cmd.Args = replaceArg(cmd.Args, filepath.Join(r.creds, "a.key"), filepath.Join(other, "a.key"))
	if out, err := cmd.CombinedOutput(); err == nil {
		t.Fatalf("gpuwarden run with another CA's certificate ran: %s", out)
	}

	// No client certificate: the handshake fails on the server's side.
	pool := x509.NewCertPool()
	b, _ := os.ReadFile(filepath.Join(r.creds, "ca.crt"))
	pool.AppendCertsFromPEM(b)
	raw, err := r.client.Dial(context.Background(), "tcp", serverAddr+":7070")
	if err != nil {
		t.Fatal(err)
	}
	c := tls.Client(raw, &tls.Config{RootCAs: pool, ServerName: serverAddr, MinVersion: tls.VersionTLS13})
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if err := c.Handshake(); err == nil {
		_, _ = c.Write([]byte{'L', 0, 0, 0, 0})
		if _, err := io.ReadAll(c); err == nil || !strings.Contains(err.Error(), "certificate") {
			t.Fatalf("a client without a certificate: %v, want the server's refusal", err)
		}
	}
	if !strings.Contains(r.agent.Log(), "TLS handshake refused") {
		t.Errorf("the agent did not log the refused handshakes:\n%s", r.agent.Log())
	}
}

func replaceArg(args []string, old, new string) []string {
	for i, a := range args {
		if a == old {
			args[i] = new
		}
	}
	return args
}

// TestRemoteObservedByEBPF: the probes see a session's worker as they see
// any container: its memory is eBPF's figure, and it is not in breach.
func TestRemoteObservedByEBPF(t *testing.T) {
	r := newRemoteRig(t, true)
	p := r.run(t, "b", []string{"--memory", "4Gi"}, "workload", "--alloc", "1Gi", "--seconds", "60",
		"--kernels", "8", "--kernel-ns", "200000")
	p.WaitLine(t, "ready", 30*time.Second)
	simtest.Eventually(t, 20*time.Second, func() error {
		e, ok := remoteEntries(t, r.agent)["team-b"]
		if !ok || e.MemorySource != "ebpf" || e.MemoryUsedBytes < 1<<30 {
			return fmt.Errorf("team-b: %+v (listed %v), want 1Gi seen by eBPF", e, ok)
		}
		if e.Unenforced || len(e.Breaches) > 0 {
			return fmt.Errorf("team-b in breach: %+v", e.Breaches)
		}
		return nil
	})
}
