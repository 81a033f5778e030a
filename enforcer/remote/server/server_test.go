package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/hostcgroup"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/admission"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/client"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/link"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/pki"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/session"
	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

// testServer runs a server whose worker is a script that records its
// environment and cgroup, then echoes its socket (fd 3) back.
func testServer(t *testing.T, creds string) (*Server, Worker, string) {
	return testServerWith(t, creds, "exec cat <&3 >&3")
}

// testServerWith runs a server whose worker script ends with body.
func testServerWith(t *testing.T, creds, body string) (*Server, Worker, string) {
	t.Helper()
	return testServerRules(t, creds, body, admission.Rules{HighPriority: []string{"team-a/train-0/main"}},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
}

// testServerRules runs a server with admission rules and a log.
func testServerRules(t *testing.T, creds, body string, rules admission.Rules, log *slog.Logger) (*Server, Worker, string) {
	t.Helper()
	simtest.RequirePrivileged(t, "cgroups")
	mnt, err := hostcgroup.Mount("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	script := filepath.Join(dir, "worker")
	os.WriteFile(script, []byte("#!/bin/sh\nenv > "+dir+"/env.$$\ncat /proc/self/cgroup > "+dir+"/cgroup.$$\n"+body+"\n"), 0o755)
	interposer := filepath.Join(dir, "libgpuwarden.so")
	os.WriteFile(interposer, nil, 0o644)
	tlsConf, err := pki.ServerConfig(files(creds, "server"))
	if err != nil {
		t.Fatal(err)
	}
	w := Worker{Path: script, Interposer: interposer, ControlDir: filepath.Join(dir, "control"), CgroupFS: mnt,
		CgroupParent: fmt.Sprintf("gpuwarden-test/remote-%d-%d", os.Getpid(), time.Now().UnixNano()),
		Env:          []string{"PATH=" + os.Getenv("PATH"), "GPUWARDEN_MEMORY_LIMIT=0", "LD_PRELOAD=/evil.so"}}
	t.Cleanup(func() { os.Remove(w.parentDir()) })
	s, err := Start(Config{Listen: "127.0.0.1:0", TLS: tlsConf, Timeout: time.Second, Node: "gpu-node", Worker: w,
		Log: log, Admission: rules,
		Devices: func() ([]session.Device, error) {
			return []session.Device{{Index: 0, UUID: "GPU-test-0", Name: "Sim", TotalBytes: 16 << 30, UsedBytes: 0}}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, w, dir
}

func files(dir, name string) pki.Files {
	return pki.Files{Cert: filepath.Join(dir, name+".crt"), Key: filepath.Join(dir, name+".key"), CA: filepath.Join(dir, "ca.crt")}
}

func credentials(t *testing.T, id pki.Identity) string {
	dir := t.TempDir()
	if err := pki.CreateCA(dir, "test", time.Hour); err != nil {
		t.Fatal(err)
	}
	for _, r := range []pki.Request{{Name: "server", Hosts: []string{"127.0.0.1"}, Validity: time.Hour},
		{Name: "client", Client: &id, Validity: time.Hour}} {
		if err := pki.Issue(dir, dir, r); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func dialer(t *testing.T, s *Server, creds string) *client.Dialer {
	d, err := client.NewDialer(s.Addr(), files(creds, "client"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestSessionLifecycle: a session gets its slice, a worker in a cgroup of
// its own with a local container's environment, and its client's labels;
// its bytes pass unchanged; its memory is no longer free for others; and
// when the client goes, the worker and its cgroup go within seconds.
func TestSessionLifecycle(t *testing.T) {
	id := pki.Identity{Namespace: "team-a", Pod: "train-0", Container: "main"}
	creds := credentials(t, id)
	s, w, dir := testServer(t, creds)
	d := dialer(t, s, creds)
	ctx := context.Background()

	l, err := d.List(ctx)
	if err != nil || len(l.GPUs) != 1 || l.GPUs[0].FreeBytes != 16<<30 || l.Node != "gpu-node" {
		t.Fatalf("list: %+v %v", l, err)
	}
	conn, wel, err := d.Open(ctx, session.Request{MemoryFraction: 0.5, Weight: 2, Priority: "high"})
	if err != nil {
		t.Fatal(err)
	}
	if wel.GPU != "GPU-test-0" || wel.MemoryBytes != 8<<30 || wel.Weight != 2 || wel.Priority != "high" {
		t.Fatalf("welcome %+v", wel)
	}
	if err := conn.Send(link.Data, []byte("driver bytes")); err != nil {
		t.Fatal(err)
	}
	if p, err := conn.Expect(link.Data); err != nil || string(p) != "driver bytes" {
		t.Fatalf("echo: %q %v", p, err)
	}
	cg := w.cgroupPath(wel.Session)
	if got, ok := s.Label(cg); !ok || got != id {
		t.Fatalf("label of %s: %+v %v", cg, got, ok)
	}
	envs, _ := filepath.Glob(filepath.Join(dir, "env.*"))
	if len(envs) != 1 {
		t.Fatalf("worker environments: %v", envs)
	}
	env, _ := os.ReadFile(envs[0])
	for _, want := range []string{"GPUWARDEN_MEMORY_LIMIT=8Gi\n", "GPUWARDEN_COMPUTE_WEIGHT=2\n", "GPUWARDEN_PRIORITY=high\n",
		"CUDA_VISIBLE_DEVICES=GPU-test-0\n", "LD_PRELOAD=" + w.Interposer + "\n", "GPUWARDEN_CONTROL_DIR=" + w.ControlDir + "\n"} {
		if !strings.Contains(string(env), want) {
			t.Errorf("worker environment lacks %q:\n%s", want, env)
		}
	}
	if strings.Contains(string(env), "evil") || strings.Contains(string(env), "GPUWARDEN_MEMORY_LIMIT=0") {
		t.Errorf("the agent's own GPUWARDEN_*/LD_PRELOAD reached the worker:\n%s", env)
	}
	cgf, _ := filepath.Glob(filepath.Join(dir, "cgroup.*"))
	if b, _ := os.ReadFile(cgf[0]); !strings.Contains(string(b), "0::"+cg+"\n") {
		t.Errorf("worker's cgroup %q, want %s", b, cg)
	}

	// Another session cannot take the memory granted to this one.
	if _, _, err := d.Open(ctx, session.Request{MemoryFraction: 0.75}); err == nil || !strings.Contains(err.Error(), "not enough free memory") {
		t.Fatalf("second session: %v", err)
	}
	if l, _ := d.List(ctx); l.GPUs[0].FreeBytes != 8<<30 || l.GPUs[0].Sessions != 1 {
		t.Fatalf("list with a session: %+v", l.GPUs)
	}

	// The client goes: the worker exits and the cgroup is removed.
	conn.Close()
	simtest.Eventually(t, 5*time.Second, func() error {
		if _, err := os.Stat(filepath.Join(w.CgroupFS, cg)); !os.IsNotExist(err) {
			return fmt.Errorf("cgroup %s still there (%v)", cg, err)
		}
		if _, ok := s.Label(cg); ok {
			return fmt.Errorf("session still labelled")
		}
		return nil
	})
	if l, _ := d.List(ctx); l.GPUs[0].FreeBytes != 16<<30 || l.GPUs[0].Sessions != 0 {
		t.Fatalf("list after the session: %+v", l.GPUs)
	}
}

// TestSessionRefusals: bad requests get a clear error; foreign
// certificates get no session.
func TestSessionRefusals(t *testing.T) {
	creds := credentials(t, pki.Identity{Namespace: "a", Pod: "b", Container: "c"})
	s, _, _ := testServer(t, creds)
	d := dialer(t, s, creds)
	ctx := context.Background()
	for _, c := range []struct {
		req  session.Request
		want string
	}{
		{session.Request{MemoryFraction: 0.5, GPU: "GPU-nope"}, "no GPU GPU-nope"},
		{session.Request{MemoryBytes: 64 << 30}, "not enough free memory"},
	} {
		if _, _, err := d.Open(ctx, c.req); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.req, err, c.want)
		}
	}
	other := credentials(t, pki.Identity{Namespace: "x", Pod: "y", Container: "z"})
	f := files(other, "client")
	f.CA = filepath.Join(creds, "ca.crt") // trusts the server, but its own cert is foreign
	fd, err := client.NewDialer(s.Addr(), f, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := fd.Open(ctx, session.Request{MemoryFraction: 0.5}); err == nil {
		t.Error("a client certificate of another CA got a session")
	}
	if _, err := fd.List(ctx); err == nil {
		t.Error("a client certificate of another CA got the list")
	}
}

// TestStuckWorkerIsKilled: a worker that does not exit when its session
// ends (it ignores its socket) is killed with its cgroup within seconds.
func TestStuckWorkerIsKilled(t *testing.T) {
	creds := credentials(t, pki.Identity{Namespace: "a", Pod: "b", Container: "c"})
	s, w, _ := testServerWith(t, creds, "trap '' TERM INT HUP; exec 3>&-; (sleep 600) & sleep 600")
	d := dialer(t, s, creds)
	conn, wel, err := d.Open(context.Background(), session.Request{MemoryBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	cg := filepath.Join(w.CgroupFS, w.cgroupPath(wel.Session))
	if b, _ := os.ReadFile(filepath.Join(cg, "cgroup.procs")); len(strings.Fields(string(b))) == 0 {
		t.Fatalf("no process in the session's cgroup %s", cg)
	}
	conn.Close()
	start := time.Now()
	simtest.Eventually(t, 10*time.Second, func() error {
		if _, err := os.Stat(cg); !os.IsNotExist(err) {
			return fmt.Errorf("cgroup %s still there", cg)
		}
		return nil
	})
	if d := time.Since(start); d < stopGrace/2 || d > 8*time.Second {
		t.Errorf("the stuck worker went after %v, want about %v", d, stopGrace)
	}
}

// TestIdentify: a node's certificate names the pod of its session; a
// workload's certificate is its own identity and cannot assert another's.
func TestIdentify(t *testing.T) {
	pod := &session.Workload{Namespace: "ml", Pod: "train-0", Container: "main"}
	self := pki.Identity{Namespace: "ml", Pod: "train-0", Container: "main"}
	other := pki.Identity{Namespace: "ml", Pod: "evil", Container: "main"}
	for _, c := range []struct {
		peer    pki.Peer
		claim   *session.Workload
		want    pki.Identity
		wantErr string
	}{
		{pki.Peer{Node: "node-a"}, pod, self, ""},
		{pki.Peer{Node: "node-a"}, nil, pki.Identity{}, "only for a pod it names"},
		{pki.Peer{Node: "node-a"}, &session.Workload{Namespace: "ML", Pod: "x", Container: "y"}, pki.Identity{}, "namespace"},
		{pki.Peer{Identity: self}, nil, self, ""},
		{pki.Peer{Identity: self}, pod, self, ""},
		{pki.Peer{Identity: other}, pod, pki.Identity{}, "cannot open a session for ml/train-0/main"},
	} {
		got, err := Identify(c.peer, c.claim)
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("%v claiming %+v: %v, want %q", c.peer, c.claim, err, c.wantErr)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%v claiming %+v: %v %v, want %v", c.peer, c.claim, got, err, c.want)
		}
	}
}

// TestNodeSessionLabelled: over real TLS, a node's certificate opens a
// session labelled with the pod it names; a workload's certificate naming
// another pod is refused.
func TestNodeSessionLabelled(t *testing.T) {
	id := pki.Identity{Namespace: "team-a", Pod: "train-0", Container: "main"}
	creds := credentials(t, id)
	if err := pki.Issue(creds, creds, pki.Request{Name: "node", Node: "node-a", Validity: time.Hour}); err != nil {
		t.Fatal(err)
	}
	s, _, _ := testServer(t, creds)
	nd, err := client.NewDialer(s.Addr(), files(creds, "node"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	pod := &session.Workload{Namespace: "team-b", Pod: "infer-1", Container: "srv"}
	conn, wel, err := nd.Open(context.Background(), session.Request{MemoryBytes: 1 << 30, For: pod})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if got, ok := s.Label(s.cfg.Worker.cgroupPath(wel.Session)); !ok || got != (pki.Identity{Namespace: "team-b", Pod: "infer-1", Container: "srv"}) {
		t.Fatalf("session labelled %v %v", got, ok)
	}
	if _, _, err := nd.Open(context.Background(), session.Request{MemoryBytes: 1 << 30}); err == nil || !strings.Contains(err.Error(), "names") {
		t.Fatalf("a node's session for no pod: %v", err)
	}
	if _, _, err := dialer(t, s, creds).Open(context.Background(), session.Request{MemoryBytes: 1 << 30, For: pod}); err == nil ||
		!strings.Contains(err.Error(), "cannot open a session for team-b/infer-1/srv") {
		t.Fatalf("a workload asserting another pod: %v", err)
	}
}

// TestAdmission: one client cannot hold more than its share of sessions,
// whether it connects with its own certificate or through its node's
// relay, while other clients still get theirs; priority high goes only to
// the clients the rules name, and every refusal is answered and logged.
func TestAdmission(t *testing.T) {
	hog := pki.Identity{Namespace: "evil", Pod: "hog", Container: "main"}
	creds := credentials(t, hog)
	for _, r := range []pki.Request{{Name: "node", Node: "node-a", Validity: time.Hour},
		{Name: "other", Client: &pki.Identity{Namespace: "team-b", Pod: "infer-0", Container: "main"}, Validity: time.Hour}} {
		if err := pki.Issue(creds, creds, r); err != nil {
			t.Fatal(err)
		}
	}
	var logged simtest.LockedBuffer
	s, _, _ := testServerRules(t, creds, "exec cat <&3 >&3", admission.Rules{SessionsPerClient: 2, HighPriority: []string{"team-a"}},
		slog.New(slog.NewTextHandler(&logged, nil)))
	ctx := context.Background()
	dial := func(name string) *client.Dialer {
		d, err := client.NewDialer(s.Addr(), files(creds, name), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	hogs, other, node := dial("client"), dial("other"), dial("node")
	var first *link.Conn
	open := func(d *client.Dialer, req session.Request) (session.Welcome, error) {
		l, w, err := d.Open(ctx, req)
		if err == nil {
			t.Cleanup(func() { l.Close() })
			if first == nil {
				first = l
			}
		}
		return w, err
	}

	for i := 0; i < 2; i++ {
		if _, err := open(hogs, session.Request{MemoryBytes: 1 << 30}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := open(hogs, session.Request{MemoryBytes: 1 << 30}); err == nil || !strings.Contains(err.Error(), "evil/hog/main holds 2 sessions") {
		t.Fatalf("a third session of evil/hog/main: %v, want refused", err)
	}
	asHog := &session.Workload{Namespace: hog.Namespace, Pod: hog.Pod, Container: hog.Container}
	if _, err := open(node, session.Request{MemoryBytes: 1 << 30, For: asHog}); err == nil || !strings.Contains(err.Error(), "holds 2 sessions") {
		t.Fatalf("a third session of evil/hog/main through its node: %v, want refused", err)
	}
	if _, err := open(other, session.Request{MemoryBytes: 1 << 30}); err != nil {
		t.Fatalf("another client's session while evil/hog/main holds its most: %v", err)
	}
	if _, err := open(node, session.Request{MemoryBytes: 1 << 30, For: &session.Workload{Namespace: "team-c", Pod: "p", Container: "c"}}); err != nil {
		t.Fatalf("another pod's session through the same node: %v", err)
	}
	if l := logged.String(); !strings.Contains(l, "remote: session refused") || !strings.Contains(l, "holds 2 sessions") {
		t.Errorf("the refusals are not logged:\n%s", l)
	}

	for _, c := range []struct {
		d   *client.Dialer
		pod *session.Workload
	}{{other, nil}, {node, &session.Workload{Namespace: "team-c", Pod: "p", Container: "c"}}} {
		if _, err := open(c.d, session.Request{MemoryBytes: 1 << 30, Priority: "high", For: c.pod}); err == nil ||
			!strings.Contains(err.Error(), "priority high is not granted") {
			t.Errorf("priority high for a client the rules do not name: %v, want refused", err)
		}
	}
	w, err := open(node, session.Request{MemoryBytes: 1 << 30, Priority: "high", For: &session.Workload{Namespace: "team-a", Pod: "p", Container: "c"}})
	if err != nil || w.Priority != "high" {
		t.Errorf("priority high for team-a/p/c, which the rules name: %+v %v", w, err)
	}

	// A session of evil/hog/main ends: it may open another.
	first.Close()
	simtest.Eventually(t, 10*time.Second, func() error {
		_, err := open(hogs, session.Request{MemoryBytes: 1 << 30})
		return err
	})
}

// Out of file descriptors, the server fails to accept for a while; once
// descriptors are free again it takes sessions as before, instead of
// having stopped listening for good.
func TestAcceptSurvivesDescriptorExhaustion(t *testing.T) {
	id := pki.Identity{Namespace: "team-a", Pod: "train-0", Container: "main"}
	creds := credentials(t, id)
	s, _, _ := testServer(t, creds)
	d := dialer(t, s, creds)

	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	low := old
	low.Cur = uint64(len(fds) + 16)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	var held []net.Conn
	for range 64 { // until this process has no descriptor left for either end
		c, err := net.DialTimeout("tcp", s.Addr(), time.Second)
		if err != nil {
			break
		}
		held = append(held, c)
	}
	time.Sleep(200 * time.Millisecond) // the server's accepts fail meanwhile
	for _, c := range held {
		c.Close()
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	if len(held) == 64 {
		t.Fatalf("64 connections with %d descriptors allowed: the limit did not bite", low.Cur)
	}
	simtest.Eventually(t, 20*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		conn, _, err := d.Open(ctx, session.Request{MemoryFraction: 0.25})
		if err != nil {
			return err
		}
		conn.Close()
		return nil
	})
}
