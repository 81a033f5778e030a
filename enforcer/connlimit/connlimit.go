// Package connlimit caps a TCP listener's open connections, in all and
// from each source address, so peers that open connections and hold them
// (idle, or sending slowly) cost the process a bounded number of file
// descriptors and buffers. A connection over a cap is closed at once,
// before anything is read from it, and counted; refusals are logged at
// most once a second. A full listener makes room for a source holding
// fewer connections than another by closing that other's oldest idle
// connection (one its server marked waiting for its peer's next request),
// so idle connections from many addresses cannot keep out a newcomer (a
// scraper), while the flood's own sources, evenly spread, do not churn.
package connlimit

import (
	"container/list"
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
	evicted atomic.Uint64

	mu       sync.Mutex
	open     int
	bySource map[netip.Addr]int
	conns    list.List // of *Conn, oldest first
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
		conn := &Conn{TCPConn: c, l: l, src: src}
		over, evicted := l.take(conn)
		// Counted before the close, so a peer that sees it sees the count.
		if evicted != nil {
			l.evicted.Add(1)
			_ = evicted.SetLinger(0)
			evicted.TCPConn.Close() // its place is the new one's; its server sees the close
		}
		if over != "" {
			n := l.refused.Add(1)
			// A reset, not a FIN: no TIME_WAIT left behind per refusal.
			_ = c.SetLinger(0)
			c.Close()
			l.log.Log("source", src.String(), "cap", over, "refused", n)
			continue
		}
		return conn, nil
	}
}

// take counts c in, making room in a full listener by taking the place of
// the oldest idle connection of a source holding more (returned, to
// close), or names the cap c is over.
func (l *Listener) take(c *Conn) (over string, evicted *Conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.limits.PerSource > 0 && l.bySource[c.src] >= l.limits.PerSource {
		return "per source", nil
	}
	if l.limits.Total > 0 && l.open >= l.limits.Total {
		if evicted = l.oldestIdleLocked(l.bySource[c.src] + 1); evicted == nil {
			return "total", nil
		}
		l.giveLocked(evicted)
	}
	l.open++
	l.bySource[c.src]++
	c.elem = l.conns.PushBack(c)
	return "", evicted
}

// oldestIdleLocked is the oldest idle connection of a source holding more
// than held: the newcomer's source would then hold no more than it.
func (l *Listener) oldestIdleLocked(held int) *Conn {
	for e := l.conns.Front(); e != nil; e = e.Next() {
		if c := e.Value.(*Conn); c.idle.Load() && l.bySource[c.src] > held {
			return c
		}
	}
	return nil
}

// giveLocked gives c's place back, once.
func (l *Listener) giveLocked(c *Conn) {
	if c.elem == nil {
		return
	}
	l.conns.Remove(c.elem)
	c.elem = nil
	l.open--
	if l.bySource[c.src]--; l.bySource[c.src] == 0 {
		delete(l.bySource, c.src)
	}
}

// Refused is how many connections were closed for being over a cap.
func (l *Listener) Refused() uint64 { return l.refused.Load() }

// Evicted is how many idle connections were closed to admit new ones.
func (l *Listener) Evicted() uint64 { return l.evicted.Load() }

// Conn is an admitted connection; closing it gives its place back.
type Conn struct {
	*net.TCPConn
	l    *Listener
	src  netip.Addr
	elem *list.Element // its place in l.conns; nil once given back
	idle atomic.Bool
}

// SetIdle says whether the connection waits for its peer to send a request
// (an HTTP server's new or kept-alive connection between requests): a full
// listener may close it to admit another.
func (c *Conn) SetIdle(idle bool) { c.idle.Store(idle) }

// Close closes the connection and, the first time, gives its place back.
func (c *Conn) Close() error {
	err := c.TCPConn.Close()
	c.l.mu.Lock()
	c.l.giveLocked(c)
	c.l.mu.Unlock()
	return err
}
