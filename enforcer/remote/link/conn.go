package link

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// DefaultTimeout is how long a link may stay silent before it counts as
// dead (GPUWARDEN_REMOTE_TIMEOUT).
const DefaultTimeout = 5 * time.Second

// Conn is one link: frames over a connection (a TLS one between nodes).
// Sends may come from several goroutines; receives from one.
type Conn struct {
	c       net.Conn
	r       *frameReader
	timeout time.Duration

	wmu  sync.Mutex
	wbuf []byte
}

// readBuffer holds what one read of the link may bring: a few TLS records
// (16 KiB each), or heartbeats and the driver's small frames.
const readBuffer = 64 << 10

// New frames c. timeout bounds each receive: a link on which nothing at
// all arrives for that long is dead.
func New(c net.Conn, timeout time.Duration) *Conn {
	return &Conn{c: c, r: newFrameReader(c, readBuffer), timeout: timeout}
}

// Send writes one frame with one write.
func (c *Conn) Send(t Type, payload []byte) error {
	if len(payload) > MaxPayload {
		return fmt.Errorf("frame %s of %d bytes: at most %d", t, len(payload), MaxPayload)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.wbuf = AppendFrame(c.wbuf[:0], t, payload)
	_, err := c.c.Write(c.wbuf)
	if cap(c.wbuf) > 4*MaxPayload {
		c.wbuf = nil
	}
	return err
}

// sendData writes frame[headerLen:] as a data frame, its header written
// into frame[:headerLen]: the relayed bytes are not copied again.
func (c *Conn) sendData(frame []byte) error {
	putHeader(frame, Data, len(frame)-headerLen)
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, err := c.c.Write(frame)
	return err
}

// Recv reads the next frame, waiting at most the link's timeout; the
// payload is valid until the next Recv.
func (c *Conn) Recv() (Type, []byte, error) {
	if err := c.c.SetReadDeadline(time.Now().Add(c.timeout)); err != nil {
		return 0, nil, err
	}
	t, p, err := c.r.next()
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return 0, nil, fmt.Errorf("link silent for %v: %w", c.timeout, ErrDead)
		}
		return 0, nil, err
	}
	return t, p, nil
}

// Expect receives one frame that must be of type want.
func (c *Conn) Expect(want Type) ([]byte, error) {
	t, p, err := c.Recv()
	if err != nil {
		return nil, err
	}
	if t != want {
		return nil, fmt.Errorf("got a %s frame, want %s", t, want)
	}
	return p, nil
}

// Close closes the underlying connection.
func (c *Conn) Close() error { return c.c.Close() }

// SendData sends relayed bytes read before the link began relaying (the
// client library's hello).
func (c *Conn) SendData(p []byte) error { return c.Send(Data, p) }

// Detach gives up the link's TLS connection, for the endpoints to carry
// the session themselves: nothing may be buffered past the last frame
// read, or it would be lost.
func (c *Conn) Detach() (*tls.Conn, error) {
	tc, ok := c.c.(*tls.Conn)
	if !ok {
		return nil, errors.New("the link is not a TLS connection")
	}
	if c.r.w != c.r.r {
		return nil, fmt.Errorf("%d bytes arrived past the last frame", c.r.w-c.r.r)
	}
	return tc, nil
}

// SocketBuffer is the kernel buffer each relayed socket asks for, each
// way: bulk copies move megabytes, and a relay that wakes for every 200
// KiB spends its time in system calls.
const SocketBuffer = 4 << 20

// Buffered asks for SocketBuffer on a TCP or unix socket; the kernel caps
// it (net.core.rmem_max, wmem_max).
func Buffered(c net.Conn) {
	type buffers interface {
		SetReadBuffer(int) error
		SetWriteBuffer(int) error
	}
	if b, ok := c.(buffers); ok {
		_ = b.SetReadBuffer(SocketBuffer)
		_ = b.SetWriteBuffer(SocketBuffer)
	}
}

// ErrDead is a link whose peer stopped answering.
var ErrDead = errors.New("remote peer stopped answering")

// relayChunk is the most local bytes one data frame carries: a bulk
// chunk of the driver protocol (1 MiB and its fields) in two frames.
const relayChunk = 512 << 10

// Relay joins the link to a local stream socket until either ends: bytes
// from local go out as data frames, data frames come in to local, and
// pings go out every quarter of the timeout. When the link dies (nothing
// arrived within the timeout, or it broke) local is closed, so the driver
// side fails its calls at once; when local ends, the link is closed. Both
// are closed on return. The error says why the link ended; nil: local
// closed.
func (c *Conn) Relay(local net.Conn) error {
	done := make(chan struct{})
	var once sync.Once
	stop := func() {
		once.Do(func() {
			close(done)
			local.Close()
			c.c.Close()
		})
	}
	errs := make(chan error, 2)
	pong := make(chan struct{}, 1)
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { // local -> link
		defer wg.Done()
		buf := make([]byte, headerLen+relayChunk)
		for {
			n, err := local.Read(buf[headerLen:])
			if n > 0 {
				if werr := c.sendData(buf[:headerLen+n]); werr != nil {
					errs <- fmt.Errorf("send: %w", werr)
					stop()
					return
				}
			}
			if err != nil {
				if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
					errs <- fmt.Errorf("local socket: %w", err)
				}
				stop()
				return
			}
		}
	}()
	go func() { // link -> local
		defer wg.Done()
		for {
			t, p, err := c.Recv()
			if err != nil {
				select {
				case <-done:
				default:
					if errors.Is(err, io.EOF) {
						err = fmt.Errorf("remote closed the link: %w", err)
					}
					errs <- err
				}
				stop()
				return
			}
			switch t {
			case Data:
				if _, err := local.Write(p); err != nil {
					stop()
					return
				}
			case Ping:
				select {
				case pong <- struct{}{}:
				default:
				}
			case Pong:
			default:
				errs <- fmt.Errorf("unexpected %s frame in a session", t)
				stop()
				return
			}
		}
	}()
	go func() { // heartbeat: pings, and pongs off the receive path
		defer wg.Done()
		tick := time.NewTicker(c.timeout / 4)
		defer tick.Stop()
		for {
			var t Type
			select {
			case <-done:
				return
			case <-tick.C:
				t = Ping
			case <-pong:
				t = Pong
			}
			if err := c.Send(t, nil); err != nil {
				stop()
				return
			}
		}
	}()
	wg.Wait()
	close(errs)
	return <-errs
}
