package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/agentapi"
	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

// The network attacks: anything that reaches the agent's ports opens
// connections and holds them, idle or sending slowly, from several
// addresses. The agent must keep its memory and its log bounded, and
// serve again as soon as the flood stops.

// floodRSSBound is the agent's resident memory the floods must stay under
// (the Helm chart's limit is 256Mi; the agent idles at about 40).
const floodRSSBound = 100 << 20

// flood holds connections open to one address, from loopback sources
// (every 127/8 address is the machine's own): each connection sends
// start once connected and round each round after; one the server closed
// is opened again the next round, as an attacker would.
type flood struct {
	addr  string
	start func(c net.Conn, i int) // what connection i sends first
	round func(c net.Conn, i int) // what it sends each round (nil: nothing)
	// within runs a source's loop where its sockets must be made (a
	// network namespace); nil: here.
	within func(func() error) error

	// Connections made, those the server closed (some before connect
	// returned), and connects that failed otherwise (a full backlog).
	opened, closedByServer, failed atomic.Int64
}

// floodRound is how often each connection is looked at: a refused one is
// opened again a round later, so the server sees a refusal per
// connection per round, not a busy loop.
const floodRound = 2 * time.Second

// run holds perSource connections from each source until ctx ends, then
// closes them.
func (f *flood) run(ctx context.Context, sources []string, perSource int) {
	var wg sync.WaitGroup
	for _, src := range sources {
		wg.Go(func() {
			loop := func() error { f.source(ctx, src, perSource); return nil }
			if f.within != nil {
				_ = f.within(loop)
			} else {
				_ = loop()
			}
		})
	}
	wg.Wait()
}

func (f *flood) source(ctx context.Context, src string, n int) {
	conns := make([]net.Conn, n)
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	}()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 2 * time.Second}
	buf := make([]byte, 4096)
	for ctx.Err() == nil {
		began := time.Now()
		for i := range conns {
			if ctx.Err() != nil {
				return
			}
			if c := conns[i]; c != nil && gone(c, buf) {
				c.Close()
				conns[i] = nil
				f.closedByServer.Add(1)
			}
			if conns[i] == nil {
				c, err := d.DialContext(ctx, "tcp", f.addr)
				switch {
				case errors.Is(err, syscall.ECONNRESET):
					f.opened.Add(1)
					f.closedByServer.Add(1)
					continue
				case err != nil:
					f.failed.Add(1)
					continue
				}
				f.opened.Add(1)
				f.start(c, i)
				conns[i] = c
			} else if f.round != nil {
				f.round(conns[i], i)
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(floodRound - time.Since(began)):
		}
	}
}

// gone says whether the server closed c, reading (and dropping) what it
// sent meanwhile.
func gone(c net.Conn, buf []byte) bool {
	_ = c.SetReadDeadline(time.Now().Add(time.Millisecond))
	_, err := c.Read(buf)
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

// loopbackSources are n loopback addresses other than 127.0.0.1, which
// the test's own requests come from.
func loopbackSources(n int) []string {
	var out []string
	for i := 1; i <= n; i++ {
		out = append(out, fmt.Sprintf("127.0.%d.%d", 10+i/200, 1+i%200))
	}
	return out
}

// raiseFileLimit lets the test hold a flood's n connections, within the
// hard limit (raising that needs CAP_SYS_RESOURCE, which a container's
// root may lack).
func raiseFileLimit(t *testing.T, n uint64) {
	t.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Max < n {
		t.Fatalf("RLIMIT_NOFILE's hard limit is %d: the flood needs %d open files", lim.Max, n)
	}
	if lim.Cur < n {
		old := lim
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			t.Fatalf("raise RLIMIT_NOFILE to %d: %v", lim.Max, err)
		}
		t.Cleanup(func() { _ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old) })
	}
}

// procUsage samples a process's resident memory and open files.
type procUsage struct {
	mu            sync.Mutex
	maxRSS, rss   int64
	maxFDs, fds   int
	samples, errs int
}

func (u *procUsage) sample(pid int) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	ents, ferr := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	u.mu.Lock()
	defer u.mu.Unlock()
	if err != nil || ferr != nil {
		u.errs++
		return
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			u.rss = kb << 10
		}
	}
	u.fds = len(ents)
	u.maxRSS, u.maxFDs = max(u.maxRSS, u.rss), max(u.maxFDs, u.fds)
	u.samples++
}

// watch samples pid every 200ms until ctx ends.
func (u *procUsage) watch(ctx context.Context, pid int) {
	for {
		u.sample(pid)
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (u *procUsage) String() string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return fmt.Sprintf("peak RSS %.1f MiB, peak open files %d (%d samples)", float64(u.maxRSS)/(1<<20), u.maxFDs, u.samples)
}

// scrapeWithin fetches /metrics with a deadline; it says how long it took.
func scrapeWithin(c *http.Client, addr string, limit time.Duration) (time.Duration, error) {
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	return time.Since(began), nil
}

// TestAttackConnectionFlood: 14,000 idle kept-alive connections and 2,000
// that send a request's headers and then its body a byte a round, from
// 16 addresses, for 25 s. The agent holds at most its caps (512 in all, 64
// per address) and closes the rest at once, so its memory and open files
// stay bounded and its log gets a line a second; scrapes from another
// address are served during the flood, and within a second after it.
func TestAttackConnectionFlood(t *testing.T) {
	simtest.RequirePrivileged(t, "cgroups")
	const (
		sources   = 16
		perSource = 1000 // 875 idle and 125 slow bodies from each
		slowFrom  = 875
		duration  = 25 * time.Second
	)
	raiseFileLimit(t, sources*perSource+1024)
	m := simtest.NewMachine(t, 1, "8Gi")
	agent := simtest.StartAgent(t, m, noEBPF)
	pid := agent.Proc.Cmd.Process.Pid
	var before procUsage
	before.sample(pid)
	linesBefore := strings.Count(agent.Log(), "\n")

	// Idle: one request, its answer, then nothing on a kept-alive
	// connection. Slow: a change's headers, then a byte of its body a round.
	f := &flood{addr: agent.Addr,
		start: func(c net.Conn, i int) {
			if i < slowFrom {
				fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: %s\r\n\r\n", agent.Addr)
			} else {
				fmt.Fprintf(c, "POST /api/v1/containers/x HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{", agent.Addr)
			}
		},
		round: func(c net.Conn, i int) {
			if i >= slowFrom {
				_, _ = c.Write([]byte(" "))
			}
		}}
	ctx, stop := context.WithTimeout(context.Background(), duration)
	defer stop()
	var during procUsage
	watched := make(chan struct{})
	go func() { during.watch(ctx, pid); close(watched) }()
	// A scrape now and then during the flood, from an address of its own:
	// a full listener takes the place of an idle connection of a source
	// holding more for it.
	var answered, tried atomic.Int64
	go func() {
		c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
		for ctx.Err() == nil {
			time.Sleep(2 * time.Second)
			tried.Add(1)
			if _, err := scrapeWithin(c, agent.Addr, time.Second); err == nil {
				answered.Add(1)
			}
		}
	}()
	f.run(ctx, loopbackSources(sources), perSource)
	<-watched
	t.Logf("flood: %d connections opened, %d closed by the agent, %d dials failed; agent %s (before: %s); scrapes answered during it: %d of %d",
		f.opened.Load(), f.closedByServer.Load(), f.failed.Load(), &during, &before, answered.Load(), tried.Load())
	if f.opened.Load() < sources*perSource {
		t.Fatalf("the flood opened only %d connections, want %d at least", f.opened.Load(), sources*perSource)
	}
	if 2*answered.Load() < tried.Load() {
		t.Errorf("%d of %d scrapes answered during the flood, want half at least", answered.Load(), tried.Load())
	}
	if during.maxRSS > floodRSSBound {
		t.Errorf("under the flood the agent's RSS reached %.1f MiB, want under %d MiB",
			float64(during.maxRSS)/(1<<20), floodRSSBound>>20)
	}

	// The flood is over: a scrape is answered within a second.
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	simtest.Eventually(t, 10*time.Second, func() error {
		took, err := scrapeWithin(c, agent.Addr, time.Second)
		if err == nil {
			t.Logf("after the flood a scrape took %v", took)
		}
		return err
	})
	fams := agent.Scrape(t)
	if s, ok := simtest.Find(fams, "gpuwarden_agent_connections_refused_total", map[string]string{"listener": "http"}); !ok || s.Value == 0 {
		t.Errorf("gpuwarden_agent_connections_refused_total{listener=\"http\"} = %+v (found %v), want the refusals counted", s, ok)
	}
	var after procUsage
	after.sample(pid)
	if after.rss > floodRSSBound {
		t.Errorf("after the flood the agent's RSS is %.1f MiB, want under %d MiB", float64(after.rss)/(1<<20), floodRSSBound>>20)
	}
	lines := strings.Count(agent.Log(), "\n") - linesBefore
	t.Logf("after: %s; the agent logged %d lines during the flood", &after, lines)
	if lines > 300 {
		t.Errorf("the agent logged %d lines during the flood, want a few a second at most", lines)
	}
}

// TestAttackRemoteHandshakeFlood: 15,000 connections to the remote port
// from 15 addresses that never finish a TLS handshake (half send nothing,
// half send garbage), each opened again when the agent closes it. The
// agent holds at most its caps, ends each handshake within its timeout,
// logs refusals a line a second, and a client with a certificate opens a
// session once the flood is over.
func TestAttackRemoteHandshakeFlood(t *testing.T) {
	const (
		sources   = 15
		perSource = 1000
		duration  = 15 * time.Second
	)
	r := newRemoteRig(t, false)
	raiseFileLimit(t, sources*perSource+1024)
	// Listening on every address of the GPU node's namespace, loopback too.
	r.agent.Stop(t)
	r.agentEnv = append(r.agentEnv, "GPUWARDEN_REMOTE_LISTEN=:7070")
	r.restart(t)
	pid := r.agent.Proc.Cmd.Process.Pid
	linesBefore := strings.Count(r.agent.Log(), "\n")

	f := &flood{addr: "127.0.0.1:7070", within: r.server.Do,
		start: func(c net.Conn, i int) {
			if i%2 == 1 {
				_, _ = c.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
			}
		}}
	ctx, stop := context.WithTimeout(context.Background(), duration)
	defer stop()
	var during procUsage
	watched := make(chan struct{})
	go func() { during.watch(ctx, pid); close(watched) }()
	f.run(ctx, loopbackSources(sources), perSource)
	<-watched
	lines := strings.Count(r.agent.Log(), "\n") - linesBefore
	t.Logf("flood: %d connections opened, %d closed by the agent, %d dials failed; agent %s; %d log lines",
		f.opened.Load(), f.closedByServer.Load(), f.failed.Load(), &during, lines)
	if f.opened.Load() < sources*perSource {
		t.Fatalf("the flood opened only %d connections, want %d at least", f.opened.Load(), sources*perSource)
	}
	if during.maxRSS > floodRSSBound {
		t.Errorf("under the flood the agent's RSS reached %.1f MiB, want under %d MiB",
			float64(during.maxRSS)/(1<<20), floodRSSBound>>20)
	}
	if lines > 300 {
		t.Errorf("the agent logged %d lines during the flood, want a few a second at most; the last:\n%s",
			lines, agentapi.LogEnd(r.agent.Log()))
	}
	if !strings.Contains(r.agent.Log(), "TLS handshake refused") || !strings.Contains(r.agent.Log(), "suppressed=") {
		t.Errorf("the agent's log does not report the refused handshakes with a count of those held back")
	}

	// The flood is over: a client with a certificate runs a session, once
	// what the flood left has ended (within the handshake timeout,
	// remote.timeout here).
	time.Sleep(2 * time.Second)
	p := r.run(t, "a", []string{"--memory", "0.5"}, "workload", "--alloc", "256Mi", "--seconds", "1",
		"--kernels", "8", "--kernel-ns", "200000")
	if out, err := p.Wait(); err != nil || !strings.Contains(out, "BENCH workload_steps_per_sec") {
		t.Fatalf("a remote session after the flood: %v\nstdout:\n%s\nstderr:\n%s", err, out, p.Stderr())
	}
	fams := r.agent.Scrape(t)
	if s, ok := simtest.Find(fams, "gpuwarden_agent_connections_refused_total", map[string]string{"listener": "remote"}); !ok || s.Value == 0 {
		t.Errorf("gpuwarden_agent_connections_refused_total{listener=\"remote\"} = %+v (found %v), want the refusals counted", s, ok)
	}
}

// TestAttackPprof: profiles are served only when http.pprof turns them
// on, and then a profile or trace runs 30 seconds at most.
func TestAttackPprof(t *testing.T) {
	simtest.RequirePrivileged(t, "cgroups")
	m := simtest.NewMachine(t, 1, "8Gi")
	agent := simtest.StartAgent(t, m, noEBPF, "GPUWARDEN_HTTP_PPROF=true")
	if code, _ := agent.Get(t, "/debug/pprof/"); code != http.StatusOK {
		t.Errorf("/debug/pprof/ with http.pprof on = %d, want 200", code)
	}
	for _, p := range []string{"/debug/pprof/trace?seconds=100000", "/debug/pprof/profile?seconds=31",
		"/debug/pprof/heap?seconds=86400", "/debug/pprof/trace?seconds=NaN", "/debug/pprof/profile?seconds=1e9"} {
		if code, b := agent.Get(t, p); code != http.StatusBadRequest {
			t.Errorf("GET %s = %d %q, want 400", p, code, b)
		}
	}
	if code, b := agent.Get(t, "/debug/pprof/trace?seconds=0.1"); code != http.StatusOK || len(b) == 0 {
		t.Errorf("a short trace = %d (%d bytes), want 200 and the trace", code, len(b))
	}
}
