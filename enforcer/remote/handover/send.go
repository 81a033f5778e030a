package handover

import (
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/cpu"
	"golang.org/x/sys/unix"
)

// Supported says whether this node's C record layer can take a session:
// it runs AES-GCM on AES-NI and PCLMULQDQ, and the session stays relayed
// where they are missing.
func Supported() bool {
	return runtime.GOARCH == "amd64" && cpu.X86.HasAES && cpu.X86.HasPCLMULQDQ
}

// The remote protocol's frame (enforcer/interposer/remote/proto.h): a
// 24-byte little-endian header {u32 len, u16 op, u16 flags, u32 seq, u32 0,
// u64 ctx} and the payload.
const (
	frameHeader = 24
	opHello     = 1
	opHandover  = 4
	// FlagHandover on the client library's hello: it takes a handed-over
	// connection.
	FlagHandover = 0x2
	// HelloLen is the client library's hello frame: a header and {magic,
	// version}.
	HelloLen = frameHeader + 8
)

// Hello reads the client library's hello frame: whether it takes a
// handed-over connection. An error: the bytes are not a hello.
func Hello(b []byte) (takes bool, err error) {
	if len(b) != HelloLen || binary.LittleEndian.Uint32(b) != 8 || binary.LittleEndian.Uint16(b[4:]) != opHello {
		return false, errors.New("the program's first frame is not the remote protocol's hello")
	}
	return binary.LittleEndian.Uint16(b[6:])&FlagHandover != 0, nil
}

// tcpSocket is a TCP connection, or one that wraps it (a listener's
// admission record).
type tcpSocket interface {
	SetKeepAliveConfig(net.KeepAliveConfig) error
	SyscallConn() (syscall.RawConn, error)
	File() (*os.File, error)
}

// Take exports c's state for handing over, and makes its socket notice a
// dead peer by itself within timeout (keepalive probes and TCP's user
// timeout), since no heartbeats run once the agent is off the data path.
// The file is a duplicate of the socket, to pass on; c stays the agent's
// handle (End ends the session for every holder).
func Take(c *tls.Conn, timeout time.Duration) (State, *os.File, error) {
	st, err := Export(c)
	if err != nil {
		return State{}, nil, err
	}
	tcp, ok := c.NetConn().(tcpSocket)
	if !ok {
		return State{}, nil, errors.New("the connection is not over TCP")
	}
	probe := max(timeout/4, time.Second) // keepalive counts in whole seconds
	if err := tcp.SetKeepAliveConfig(net.KeepAliveConfig{Enable: true, Idle: probe, Interval: probe, Count: 4}); err != nil {
		return State{}, nil, fmt.Errorf("keepalive: %w", err)
	}
	rc, err := tcp.SyscallConn()
	if err != nil {
		return State{}, nil, err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(timeout.Milliseconds()))
	}); err != nil || serr != nil {
		return State{}, nil, fmt.Errorf("TCP user timeout: %w", errors.Join(err, serr))
	}
	f, err := tcp.File()
	if err != nil {
		return State{}, nil, fmt.Errorf("duplicate the socket: %w", err)
	}
	return st, f, nil
}

// End ends a handed-over session for every process that holds its socket
// (their reads return end of file) and closes the agent's copy, without a
// TLS alert: the agent's record state is stale once handed over.
func End(c *tls.Conn) {
	if tcp, ok := c.NetConn().(tcpSocket); ok {
		if rc, err := tcp.SyscallConn(); err == nil {
			_ = rc.Control(func(fd uintptr) { _ = unix.Shutdown(int(fd), unix.SHUT_RDWR) })
		}
	}
	_ = c.NetConn().Close()
}

// Send passes the socket f and its state to the process at the other end
// of u (the client library or the worker): one handover frame, {u32 suite,
// u64 write seq, u64 read seq, write secret, read secret}, with f attached.
// A zero State hands over a plain socket (a same-node worker's own: frames
// without TLS).
func Send(u *net.UnixConn, st State, f *os.File) error {
	payload := make([]byte, 0, 4+8+8+2*secretLen)
	payload = binary.LittleEndian.AppendUint32(payload, uint32(st.Suite))
	payload = binary.LittleEndian.AppendUint64(payload, st.WriteSeq)
	payload = binary.LittleEndian.AppendUint64(payload, st.ReadSeq)
	var secrets [2 * secretLen]byte
	copy(secrets[:secretLen], st.WriteSecret)
	copy(secrets[secretLen:], st.ReadSecret)
	payload = append(payload, secrets[:]...)
	frame := make([]byte, frameHeader, frameHeader+len(payload))
	binary.LittleEndian.PutUint32(frame, uint32(len(payload)))
	binary.LittleEndian.PutUint16(frame[4:], opHandover)
	frame = append(frame, payload...)
	n, oobn, err := u.WriteMsgUnix(frame, unix.UnixRights(int(f.Fd())), nil)
	if err == nil && (n != len(frame) || oobn == 0) {
		err = errors.New("short write")
	}
	if err != nil {
		return fmt.Errorf("hand the session over: %w", err)
	}
	return nil
}

// PassSocket sends f over u outside any protocol: one byte carrying it.
func PassSocket(u *net.UnixConn, f *os.File) error {
	n, oobn, err := u.WriteMsgUnix([]byte{0}, unix.UnixRights(int(f.Fd())), nil)
	if err == nil && (n != 1 || oobn == 0) {
		err = errors.New("short write")
	}
	if err != nil {
		return fmt.Errorf("pass the worker's socket: %w", err)
	}
	return nil
}

// ReceiveSocket reads the one byte PassSocket sends and the socket it
// carries, within timeout.
func ReceiveSocket(u *net.UnixConn, timeout time.Duration) (*os.File, error) {
	_ = u.SetReadDeadline(time.Now().Add(timeout))
	defer u.SetReadDeadline(time.Time{})
	b, oob := make([]byte, 1), make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := u.ReadMsgUnix(b, oob)
	if err != nil {
		return nil, fmt.Errorf("receive the worker's socket: %w", err)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || n != 1 || len(msgs) != 1 {
		return nil, errors.New("receive the worker's socket: the server sent none")
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, errors.New("receive the worker's socket: not one socket")
	}
	unix.CloseOnExec(fds[0])
	return os.NewFile(uintptr(fds[0]), "worker"), nil
}

// Held is the agent's own copy of a handed-over session's socket, kept out
// of the Go runtime's poller. Registered there, the socket woke the agent
// for every segment the worker was sent and every acknowledgement that
// freed room to send (the poller's epoll reports each edge), though the
// agent reads nothing: 4-6% of a bulk copy's CPU. It serves the session's
// end and the kernel's counters.
type Held struct {
	mu sync.Mutex
	fd int // -1 once ended
}

// Hold keeps a duplicate of tcp's socket and closes tcp, taking it out of
// the poller; the session goes on, its socket held by the worker and here.
func Hold(tcp *net.TCPConn) (*Held, error) {
	if tcp == nil {
		return nil, errors.New("the connection is not over TCP")
	}
	rc, err := tcp.SyscallConn()
	if err != nil {
		return nil, err
	}
	fd, derr := -1, error(nil)
	if err := rc.Control(func(s uintptr) { fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); err != nil || derr != nil {
		return nil, fmt.Errorf("duplicate the socket: %w", errors.Join(err, derr))
	}
	_ = tcp.Close()
	return &Held{fd: fd}, nil
}

// Control runs f on the socket, unless the session has ended.
func (h *Held) Control(f func(fd uintptr)) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.fd < 0 {
		return net.ErrClosed
	}
	f(uintptr(h.fd))
	return nil
}

// End ends the session for every process that holds its socket (their
// reads return end of file) and closes the agent's copy. Again: nothing.
func (h *Held) End() { h.close(true) }

// Close closes the agent's copy only: the session ends with the last
// process that holds it.
func (h *Held) Close() { h.close(false) }

func (h *Held) close(shutdown bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.fd < 0 {
		return
	}
	if shutdown {
		_ = unix.Shutdown(h.fd, unix.SHUT_RDWR)
	}
	_ = unix.Close(h.fd)
	h.fd = -1
}
