// Package connlimit caps a TCP listener's open connections, in all and
// from each source address, so peers that open connections and hold them
// (idle, or sending slowly) cost the process a bounded number of file
// descriptors and buffers. A connection over a cap is closed at once,
// before anything is read from it, and counted; refusals are logged at
// most once a second.
package connlimit

import (
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/ratelog"
)

// Limits are the caps; 0 is no cap.
type Limits struct {
	Total     int // open connections at most
	PerSource int // open connections from one IP address at most
}

// Listener is a TCP listener under Limits. Its connections are *Conn.
type Listener struct {
	*net.TCPListener
	limits  Limits
	log     *ratelog.Logger
	refused atomic.Uint64

	mu       sync.Mutex
	open     int
	bySource map[netip.Addr]int
}

// Listen listens on a TCP address under limits; log gets the refusals.
func Listen(address string, limits Limits, log *slog.Logger) (*Listener, error) {
	l, err := net.Listen("tcp", address)
	if err != nil {
		return nil, err
	}
	return &Listener{TCPListener: l.(*net.TCPListener), limits: limits,
		log:      ratelog.New(log, slog.LevelWarn, "connection refused: over the cap", time.Second),
		bySource: map[netip.Addr]int{}}, nil
}

// Accept returns the next connection within the caps, closing those over
// them.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.AcceptTCP()
		if err != nil {
			return nil, err
		}
		src := c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
		if over := l.take(src); over != "" {
			// A reset, not a FIN: no TIME_WAIT left behind per refusal.
			_ = c.SetLinger(0)
			c.Close()
			n := l.refused.Add(1)
			l.log.Log("source", src.String(), "cap", over, "refused", n)
			continue
		}
		return &Conn{TCPConn: c, release: func() { l.give(src) }}, nil
	}
}

// take counts a connection from src in, or names the cap it is over.
func (l *Listener) take(src netip.Addr) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.limits.Total > 0 && l.open >= l.limits.Total {
		return "total"
	}
	if l.limits.PerSource > 0 && l.bySource[src] >= l.limits.PerSource {
		return "per source"
	}
	l.open++
	l.bySource[src]++
	return ""
}

func (l *Listener) give(src netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open--
	if l.bySource[src]--; l.bySource[src] == 0 {
		delete(l.bySource, src)
	}
}

// Refused is how many connections were closed for being over a cap.
func (l *Listener) Refused() uint64 { return l.refused.Load() }

// Conn is an admitted connection; closing it gives its place back.
type Conn struct {
	*net.TCPConn
	once    sync.Once
	release func()
}

// Close closes the connection and, the first time, gives its place back.
func (c *Conn) Close() error {
	err := c.TCPConn.Close()
	c.once.Do(c.release)
	return err
}
