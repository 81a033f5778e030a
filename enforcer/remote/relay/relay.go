// Package relay is the node side of remote GPUs for pods: on a node
// without GPUs the agent serves, for each allocation of remote GPU slots, a
// unix socket in the allocation's control directory (mounted into its
// container), and relays each connection over mutual TLS with the node's
// certificate, naming the pod. Who connected is read from the kernel (the
// peer's cgroup, through SO_PEERCRED) and the kubelet, never from the peer;
// what the session may use comes from the allocation's grant.
package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpuwarden/gpuwarden/enforcer/remote/client"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/link"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/session"
)

// Config is what a relay needs.
type Config struct {
	ControlDir string // allocations' directories: <ControlDir>/<allocation.DirName>
	ProcRoot   string // /proc, where a peer's cgroup is read
	// Identify names the container of allocation dir whose process runs in
	// cgroupPath (as /proc/<pid>/cgroup reads it); an error refuses the
	// connection.
	Identify func(ctx context.Context, dir, cgroupPath string) (session.Workload, error)
	// Dialer is the dialer of a configured server.
	Dialer func(server string) (*client.Dialer, bool)
	// Relayed keeps every session relayed (remote.dataPath relayed).
	Relayed bool
	// Local is the local socket of server when it is this node's own
	// agent, else "": its sessions then skip TLS and the network.
	Local func(server string) string
	Log   *slog.Logger
}

// Relay serves the allocations' sockets until Close.
type Relay struct {
	cfg Config

	mu     sync.Mutex
	lis    map[string]net.Listener // by allocation directory
	conns  map[net.Conn]bool
	closed bool
	wg     sync.WaitGroup
}

// New is a relay serving nothing yet.
func New(cfg Config) *Relay {
	return &Relay{cfg: cfg, lis: map[string]net.Listener{}, conns: map[net.Conn]bool{}}
}

// Socket is an allocation's relay socket on the node.
func (r *Relay) Socket(dir string) string {
	return filepath.Join(r.cfg.ControlDir, dir, session.RelayDir, session.RelaySocket)
}

// Listen serves allocation dir's socket (made anew if it is not served
// already). Any user may connect: who connected is decided per connection.
func (r *Relay) Listen(dir string) error {
	if dir == "" || filepath.Base(dir) != dir || dir[0] == '.' {
		return fmt.Errorf("allocation directory %q: want one plain name", dir)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return errors.New("the relay is closed")
	}
	if _, ok := r.lis[dir]; ok {
		return nil
	}
	sock := r.Socket(dir)
	if err := os.MkdirAll(filepath.Dir(sock), 0o755); err != nil {
		return fmt.Errorf("relay directory: %w", err)
	}
	if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove the old relay socket: %w", err)
	}
	lis, err := listenIn(filepath.Dir(sock), session.RelaySocket)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", sock, err)
	}
	if err := os.Chmod(sock, 0o666); err != nil { // a container's user need not be root
		lis.Close()
		return fmt.Errorf("relay socket: %w", err)
	}
	r.lis[dir] = lis
	r.wg.Add(1)
	go r.serve(dir, lis)
	return nil
}

// listenIn listens on a unix socket named name in dir, however long dir's
// path (a socket's address holds 107 bytes): it binds through the
// directory's descriptor.
func listenIn(dir, name string) (net.Listener, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	lis, err := net.Listen("unix", fmt.Sprintf("/proc/self/fd/%d/%s", fd, name))
	if err != nil {
		return nil, err
	}
	// The address names a descriptor that is closed now: never unlink by it.
	lis.(*net.UnixListener).SetUnlinkOnClose(false)
	return lis, nil
}

// Restore serves the socket of every allocation with a remote grant in
// the control directory (those a previous agent served).
func (r *Relay) Restore() error {
	ents, err := os.ReadDir(r.cfg.ControlDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("read the control directory: %w", err)
	}
	var errs []error
	for _, e := range ents {
		if _, err := os.Stat(filepath.Join(r.cfg.ControlDir, e.Name(), session.GrantFile)); err == nil {
			errs = append(errs, r.Listen(e.Name()))
		}
	}
	return errors.Join(errs...)
}

// Release stops serving allocation dir's socket and removes it and its
// directory (the allocation is gone); sessions it relays run on until
// their program goes.
func (r *Relay) Release(dir string) error {
	r.mu.Lock()
	if l, ok := r.lis[dir]; ok {
		l.Close()
		delete(r.lis, dir)
	}
	r.mu.Unlock()
	if filepath.Base(dir) != dir || dir == "" || dir[0] == '.' {
		return fmt.Errorf("allocation directory %q: want one plain name", dir)
	}
	if err := os.Remove(r.Socket(dir)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove the relay socket: %w", err)
	}
	if err := os.Remove(filepath.Dir(r.Socket(dir))); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove the relay directory: %w", err)
	}
	return nil
}

// Close stops serving and ends every relayed session.
func (r *Relay) Close() error {
	r.mu.Lock()
	r.closed = true
	for _, l := range r.lis {
		l.Close()
	}
	for c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
	return nil
}

func (r *Relay) serve(dir string, lis net.Listener) {
	defer r.wg.Done()
	for {
		c, err := lis.Accept()
		if err != nil {
			return
		}
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			c.Close()
			return
		}
		r.conns[c] = true
		r.wg.Add(1)
		r.mu.Unlock()
		go func() {
			defer r.wg.Done()
			r.handle(dir, c.(*net.UnixConn))
			r.mu.Lock()
			delete(r.conns, c)
			r.mu.Unlock()
			c.Close()
		}()
	}
}

func (r *Relay) local(server string) string {
	if r.cfg.Local == nil {
		return ""
	}
	return r.cfg.Local(server)
}

// handle identifies the peer, opens its session with the allocation's
// grant and relays until either end goes. A refused connection is closed:
// the client library's calls then fail at once.
func (r *Relay) handle(dir string, c *net.UnixConn) {
	log := r.cfg.Log.With("allocation", dir)
	pid, cg, err := peerCgroup(r.cfg.ProcRoot, c)
	if err != nil {
		log.Warn("remote relay: peer unknown", "pid", pid, "err", err)
		return
	}
	log = log.With("pid", pid)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	who, err := r.cfg.Identify(ctx, dir, cg)
	cancel()
	if err != nil {
		log.Warn("remote relay: connection refused", "cgroup", cg, "err", err)
		return
	}
	log = log.With("pod", who.Namespace+"/"+who.Pod+"/"+who.Container)
	g, err := session.ReadGrant(filepath.Join(r.cfg.ControlDir, dir, session.GrantFile))
	if err != nil {
		log.Warn("remote relay: no grant", "err", err)
		return
	}
	d, ok := r.cfg.Dialer(g.Server)
	if !ok {
		log.Warn("remote relay: the grant's server is not configured", "server", g.Server)
		return
	}
	if local := r.local(g.Server); (r.cfg.Relayed && !d.Relayed) || local != "" {
		own := *d
		own.Relayed = own.Relayed || r.cfg.Relayed
		own.Local = local
		d = &own
	}
	link.Buffered(c)
	a, err := d.Attach(context.Background(), c, session.Request{MemoryBytes: g.MemoryBytes,
		Weight: int(g.Weight), Priority: g.Priority, GPU: g.GPU, For: &who})
	if err != nil {
		log.Warn("remote relay: session refused", "server", g.Server, "err", err)
		return
	}
	w := a.Welcome
	log.Info("remote relay: session started", "server", g.Server, "session", w.Session, "gpu", w.GPU, "memory", w.MemoryBytes,
		"weight", w.Weight, "path", a.Path())
	err = a.Wait()
	log.Info("remote relay: session ended", "session", w.Session, "why", fmt.Sprint(err))
}
