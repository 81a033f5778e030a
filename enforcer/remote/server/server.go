// Package server is the GPU node's side of remote GPU sessions: a mutual
// TLS listener that answers list requests and serves each session with a
// worker process in a cgroup of its own, under the interposer with the
// session's quota, weight and priority, so the node's enforcer, probes and
// collector treat it as one more container.
package server

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpuwarden/gpuwarden/enforcer/connlimit"
	"github.com/gpuwarden/gpuwarden/enforcer/ratelog"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/admission"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/handover"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/link"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/pki"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/session"
	"github.com/gpuwarden/gpuwarden/enforcer/vocab"
)

// MaxSessions bounds the sessions (each a worker process) one server runs,
// whatever memory is left: a client must not fork the node to death with
// sessions of a MiB each.
const MaxSessions = 256

// HandshakeTimeout bounds a client's TLS handshake, whatever Timeout is:
// until it completes, anyone who reaches the port holds a connection.
const HandshakeTimeout = 5 * time.Second

// Config is what a server needs.
type Config struct {
	Listen  string
	TLS     *tls.Config // pki.ServerConfig
	Timeout time.Duration
	Node    string
	// Devices lists the node's GPUs (Granted and Sessions are filled in
	// by the server).
	Devices func() ([]session.Device, error)
	Worker  Worker
	Log     *slog.Logger
	// Admission caps each client's sessions and says who may run at
	// high priority.
	Admission admission.Rules
	// Limits caps the open connections, sessions and handshakes
	// together (zero: no cap).
	Limits connlimit.Limits
	// Relayed keeps every session's data on the relayed path
	// (remote.dataPath relayed): never handed to the worker.
	Relayed bool
	// LocalSocket, if set, is a unix socket served as the TCP listener
	// is (mutual TLS, the same admission) for clients on this node: a
	// direct session over it gets its worker's own socket.
	LocalSocket string
}

// Server serves remote sessions until Close.
type Server struct {
	cfg     Config
	lis     net.Listener
	local   net.Listener // on LocalSocket; nil: none
	limited *connlimit.Listener
	// refusedHandshakes logs failed handshakes, which anyone can cause.
	refusedHandshakes *ratelog.Logger
	acceptErrors      *ratelog.Logger

	mu       sync.Mutex
	sessions map[string]*active  // by cgroup path
	conns    map[net.Conn]func() // each connection's end: a handed-over one's ends its session
	closed   bool
	next     uint64
	wg       sync.WaitGroup
}

// active is one running session.
type active struct {
	id       pki.Identity
	uuid     string
	granted  uint64
	cgroup   string // path in the cgroup tree
	sessName string
	path     string     // session.PathDirect or PathRelayed, once welcomed
	tcp      controller // its TCP socket (the server's handle); nil on the same node
}

// controller runs a function on a socket: a syscall.RawConn, or a
// handed-over session's handover.Held.
type controller interface {
	Control(f func(fd uintptr)) error
}

// Traffic is one running session's bytes so far, as the kernel counts them
// on its TCP socket (TLS records and all; sent: acknowledged by the
// client's end). The server reads them whichever process carries the data,
// so a handed-over session is counted with no work on its data path.
type Traffic struct {
	Session        string
	ID             pki.Identity
	GPU            string // UUID
	Path           string // session.PathDirect or PathRelayed
	Sent, Received uint64
}

// Traffic lists the running sessions that have a TCP socket: one that came
// in on the local socket has none, and is not listed.
func (s *Server) Traffic() []Traffic {
	type counted struct {
		t   Traffic
		tcp controller
	}
	var all []counted
	s.mu.Lock()
	for _, a := range s.sessions {
		if a.tcp != nil {
			all = append(all, counted{Traffic{Session: a.sessName, ID: a.id, GPU: a.uuid, Path: a.path}, a.tcp})
		}
	}
	s.mu.Unlock()
	out := make([]Traffic, 0, len(all))
	for _, c := range all {
		var info *unix.TCPInfo
		var err error
		if cerr := c.tcp.Control(func(fd uintptr) { info, err = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) }); cerr != nil || err != nil {
			continue // the session is ending: its socket is closed
		}
		c.t.Sent, c.t.Received = info.Bytes_acked, info.Bytes_received
		out = append(out, c.t)
	}
	return out
}

// Start removes what sessions of a previous server left, listens, and
// serves.
func Start(cfg Config) (*Server, error) {
	if cfg.Timeout <= 0 {
		cfg.Timeout = link.DefaultTimeout
	}
	if err := cfg.Worker.check(); err != nil {
		return nil, err
	}
	if err := cfg.Worker.removeStale(); err != nil {
		return nil, err
	}
	limited, err := connlimit.Listen(cfg.Listen, cfg.Limits, cfg.Log.With("listener", "remote"))
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	s := &Server{cfg: cfg, lis: tls.NewListener(limited, cfg.TLS), limited: limited,
		refusedHandshakes: ratelog.New(cfg.Log, slog.LevelWarn, "remote: TLS handshake refused", time.Second),
		acceptErrors:      ratelog.New(cfg.Log, slog.LevelError, "remote: accept failed", time.Second),
		sessions:          map[string]*active{}, conns: map[net.Conn]func(){}, next: uint64(time.Now().UnixNano())}
	if cfg.LocalSocket != "" {
		local, err := listenLocal(cfg.LocalSocket)
		if err != nil {
			limited.Close()
			return nil, err
		}
		s.local = tls.NewListener(local, cfg.TLS)
		s.wg.Add(1)
		go s.serve(s.local)
	}
	s.wg.Add(1)
	go s.serve(s.lis)
	return s, nil
}

// listenLocal listens on path, a socket any local user may connect to:
// TLS decides who gets a session, as on the TCP port.
func listenLocal(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("local socket's directory: %w", err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove the old local socket: %w", err)
	}
	lis, err := net.Listen("unix", path)
	if err == nil {
		err = os.Chmod(path, 0o666)
	}
	if err != nil {
		if lis != nil {
			lis.Close()
		}
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	return lis, nil
}

// Addr is the listener's address.
func (s *Server) Addr() string { return s.lis.Addr().String() }

// Refused is how many connections were closed for being over Limits.
func (s *Server) Refused() uint64 { return s.limited.Refused() }

// Close stops listening and ends every session (their workers killed).
func (s *Server) Close() error {
	err := s.lis.Close()
	if s.local != nil {
		s.local.Close()
	}
	s.mu.Lock()
	s.closed = true
	for _, end := range s.conns {
		end()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}

// Label names the client of the session whose worker runs in cgroup path
// (as the collector's resolver writes paths).
func (s *Server) Label(cgroupPath string) (pki.Identity, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.sessions[path.Clean("/"+cgroupPath)]
	if !ok {
		return pki.Identity{}, false
	}
	return a.id, true
}

func (s *Server) serve(lis net.Listener) {
	defer s.wg.Done()
	pause := time.Duration(0)
	for {
		c, err := lis.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			// Out of descriptors, or a connection aborted before it was
			// taken: the listener is still good, and stopping here would
			// refuse every session until the agent restarts.
			pause = min(max(2*pause, 5*time.Millisecond), time.Second)
			s.acceptErrors.Log("err", err, "retry in", pause)
			time.Sleep(pause)
			continue
		}
		pause = 0
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[c] = func() { c.Close() }
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			tc := c.(*tls.Conn)
			link.Buffered(tc.NetConn()) // a unix socket's too: the worker's bulk frames stream through it
			s.handle(tc)
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
			c.Close()
		}()
	}
}

// handle authenticates the client, reads its first frame and answers it.
func (s *Server) handle(c *tls.Conn) {
	log := s.cfg.Log.With("peer", c.RemoteAddr().String())
	ctx, cancel := context.WithTimeout(context.Background(), min(s.cfg.Timeout, HandshakeTimeout))
	err := c.HandshakeContext(ctx)
	cancel()
	if err != nil {
		s.refusedHandshakes.Log("peer", c.RemoteAddr().String(), "err", err)
		return
	}
	peer, err := pki.PeerIdentity(c.ConnectionState())
	if err != nil {
		log.Warn("remote: client certificate names no container or node", "err", err)
		return
	}
	log = log.With("client", peer.String())
	l := link.New(c, s.cfg.Timeout)
	t, p, err := l.Recv()
	if err != nil {
		log.Warn("remote: no request", "err", err)
		return
	}
	switch t {
	case link.List:
		s.answer(l, link.GPUs, s.list())
	case link.Hello:
		var req session.Request
		if err := session.Decode(p, &req); err != nil {
			s.answer(l, link.Welcome, session.Welcome{Error: err.Error()})
			return
		}
		id, err := Identify(peer, req.For)
		if err != nil {
			log.Warn("remote: session refused", "err", err)
			s.answer(l, link.Welcome, session.Welcome{Error: err.Error()})
			return
		}
		if peer.Node != "" {
			log = log.With("pod", id.String()) // the client is the node that relays it
		}
		s.session(c, l, id, req, log)
	default:
		log.Warn("remote: unexpected first frame", "type", t.String())
	}
}

// Identify is the identity a session runs as. A node's certificate (its
// agent relays its pods) names the pod in the request; a workload's
// certificate is its identity, and a request naming another pod is
// refused, never believed.
func Identify(peer pki.Peer, asserted *session.Workload) (pki.Identity, error) {
	if peer.Node != "" {
		if asserted == nil {
			return pki.Identity{}, fmt.Errorf("node %s opens sessions only for a pod it names", peer.Node)
		}
		id := pki.Identity{Namespace: asserted.Namespace, Pod: asserted.Pod, Container: asserted.Container}
		if err := id.Validate(); err != nil {
			return pki.Identity{}, fmt.Errorf("the pod node %s names: %w", peer.Node, err)
		}
		return id, nil
	}
	if asserted != nil {
		if a := (pki.Identity{Namespace: asserted.Namespace, Pod: asserted.Pod, Container: asserted.Container}); a != peer.Identity {
			return pki.Identity{}, fmt.Errorf("certificate of %s cannot open a session for %s: only a node's certificate names other pods",
				peer.Identity, a)
		}
	}
	return peer.Identity, nil
}

func (s *Server) answer(l *link.Conn, t link.Type, v any) {
	b, _ := json.Marshal(v)
	_ = l.Send(t, b)
}

// devices is the node's GPUs with the sessions' grants on them.
func (s *Server) devices() ([]session.Device, error) {
	devs, err := s.cfg.Devices()
	if err != nil {
		return nil, fmt.Errorf("list GPUs: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.addGrantsLocked(devs)
	return devs, nil
}

// addGrantsLocked sets each device's grants and sessions from the running
// sessions.
func (s *Server) addGrantsLocked(devs []session.Device) {
	for i := range devs {
		devs[i].Granted, devs[i].Sessions = 0, 0
		for _, a := range s.sessions {
			if a.uuid == devs[i].UUID {
				devs[i].Granted += a.granted
				devs[i].Sessions++
			}
		}
	}
}

func (s *Server) list() session.GPUList {
	devs, err := s.devices()
	out := session.GPUList{Node: s.cfg.Node, GPUs: []session.GPU{}}
	if err != nil {
		out.Error = err.Error()
		return out
	}
	for _, d := range devs {
		out.GPUs = append(out.GPUs, session.GPU{Index: d.Index, UUID: d.UUID, Name: d.Name, TotalBytes: d.TotalBytes,
			UsedBytes: d.UsedBytes, FreeBytes: d.Free(), Sessions: d.Sessions})
	}
	return out
}

// session places the request, starts its worker, answers, and hands the
// connection to the worker or relays it, until the client or the worker
// goes.
func (s *Server) session(c *tls.Conn, l *link.Conn, id pki.Identity, req session.Request, log *slog.Logger) {
	refuse := func(err error) {
		log.Info("remote: session refused", "err", err)
		s.answer(l, link.Welcome, session.Welcome{Error: err.Error()})
	}
	v, err := req.Check()
	if err == nil {
		err = s.cfg.Admission.CheckPriority(id, v.High)
	}
	if err != nil {
		refuse(err)
		return
	}
	devs, err := s.cfg.Devices()
	if err != nil {
		refuse(fmt.Errorf("list GPUs: %w", err))
		return
	}
	// Place and record under one lock, so two requests cannot both take
	// the last free memory.
	s.mu.Lock()
	s.addGrantsLocked(devs)
	placed, err := session.Place(v, devs)
	switch {
	case s.closed:
		err = errors.New("the server is shutting down")
	case err == nil && len(s.sessions) >= MaxSessions:
		err = fmt.Errorf("the server runs %d sessions, its most", MaxSessions)
	case err == nil:
		err = s.cfg.Admission.CheckHeld(id, s.heldLocked(id))
	}
	if err != nil {
		s.mu.Unlock()
		refuse(err)
		return
	}
	s.next++
	name := fmt.Sprintf("s-%x", s.next)
	a := &active{id: id, uuid: placed.Device.UUID, granted: placed.MemoryBytes,
		cgroup: s.cfg.Worker.cgroupPath(name), sessName: name}
	s.sessions[a.cgroup] = a
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.sessions, a.cgroup)
		s.mu.Unlock()
	}()

	w := session.Welcome{Session: name, GPU: placed.Device.UUID, Name: placed.Device.Name,
		MemoryBytes: placed.MemoryBytes, Weight: v.Weight, Priority: vocab.PriorityName(v.High),
	}
	if _, local := c.NetConn().(*net.UnixConn); local {
		w.Local = req.Direct && !s.cfg.Relayed
	} else {
		w.Direct = req.Direct && !s.cfg.Relayed && handover.Supported() && c.ConnectionState().CipherSuite == handover.Suite
	}
	log = log.With("session", name, "gpu", w.GPU)
	if !w.Local {
		s.counted(a, c, w.Direct)
	}
	proc, err := s.cfg.Worker.start(name, w, log)
	if err != nil {
		refuse(fmt.Errorf("start the session's worker: %w", err))
		return
	}
	defer proc.stop(log)
	b, _ := json.Marshal(w)
	if err := l.Send(link.Welcome, b); err != nil {
		log.Info("remote: client gone before the session began", "err", err)
		return
	}
	log.Info("remote: session started", "memory", w.MemoryBytes, "weight", w.Weight, "priority", w.Priority,
		"cgroup", a.cgroup, "direct", w.Direct, "local", w.Local)
	start := time.Now()
	switch {
	case w.Direct:
		err = s.handOver(c, l, proc, a)
	case w.Local:
		err = s.handOverLocal(c, l, proc)
	default:
		err = l.Relay(proc.sock)
	}
	log.Info("remote: session ended", "after", time.Since(start).Round(time.Millisecond), "why", reason(err))
}

// counted records a's TCP socket for Traffic.
func (s *Server) counted(a *active, c *tls.Conn, direct bool) {
	sc, ok := c.NetConn().(syscall.Conn)
	if !ok {
		return
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return
	}
	s.mu.Lock()
	a.tcp, a.path = rc, session.PathRelayed
	if direct {
		a.path = session.PathDirect
	}
	s.mu.Unlock()
}

// handOver passes the session's socket and TLS state to its worker and
// waits for the worker to exit. The server keeps a copy of the socket, out
// of the runtime's poller (handover.Held), and the worker's own socket:
// closing the latter (the server closing, or the agent gone) makes the
// worker end the session. The connection's place under the listener's
// caps is given back when the session ends.
func (s *Server) handOver(c net.Conn, l *link.Conn, p *proc, a *active) error {
	tc, err := l.Detach()
	if err != nil {
		return err
	}
	st, f, err := handover.Take(tc, s.cfg.Timeout)
	if err == nil {
		err = handover.Send(p.sock.(*net.UnixConn), st, f)
		f.Close()
	}
	var held *handover.Held
	if err == nil {
		held, err = handover.Hold(tcpOf(tc.NetConn()))
	}
	if err != nil {
		handover.End(tc)
		return err
	}
	s.mu.Lock()
	a.tcp = held
	s.mu.Unlock()
	end := func() { held.End(); _ = tc.NetConn().Close() }
	if !s.keep(c, func() { end(); p.sock.Close() }) {
		end()
		return errors.New("the server is shutting down")
	}
	<-p.done
	end()
	return nil
}

// tcpOf is the TCP connection under an accepted one: itself, or the one a
// listener's admission record wraps (which keeps its place until closed).
func tcpOf(c net.Conn) *net.TCPConn {
	switch t := c.(type) {
	case *net.TCPConn:
		return t
	case *connlimit.Conn:
		return t.TCPConn
	}
	return nil
}

// handOverLocal gives a same-node client the worker's own socket, once it
// asks (after Welcome, so that nothing of it is read by TLS), and waits
// for the worker to exit. The server keeps no copy (the worker must see
// the client's end); it ends the session by killing the worker.
func (s *Server) handOverLocal(c net.Conn, l *link.Conn, p *proc) error {
	if _, err := l.Expect(link.Take); err != nil {
		return err
	}
	tc, err := l.Detach()
	if err != nil {
		return err
	}
	f, err := p.sock.(*net.UnixConn).File()
	if err == nil {
		err = handover.PassSocket(tc.NetConn().(*net.UnixConn), f)
		f.Close()
	}
	p.sock.Close()
	if err != nil {
		return err
	}
	end := func() { p.killed.Store(true); _ = p.cmd.Process.Kill() }
	if !s.keep(c, end) {
		end()
		return errors.New("the server is shutting down")
	}
	<-p.done
	return nil
}

// keep records how to end a handed-over session when the server closes;
// false: it is closing already.
func (s *Server) keep(c net.Conn, end func()) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns[c] = end
	return true
}

// heldLocked is how many sessions client id holds.
func (s *Server) heldLocked(id pki.Identity) int {
	n := 0
	for _, a := range s.sessions {
		if a.id == id {
			n++
		}
	}
	return n
}

func reason(err error) string {
	if err == nil {
		return "the worker closed it"
	}
	return strings.TrimSpace(err.Error())
}
