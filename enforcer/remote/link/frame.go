// Package link is the connection between a remote GPU client and the GPU
// node, inside mutual TLS: typed frames, so heartbeats run beside the
// relayed driver calls (data frames carry the interposer's protocol bytes
// unparsed), and the relay that joins a link to a local socket.
package link

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Type is a frame's type.
type Type byte

// Frame types. A session starts with the client's Hello and the server's
// Welcome; then Data, Ping and Pong flow both ways. A List is answered
// with a GPUs frame and the link closes.
const (
	Hello   Type = 'H' // client: a session request (JSON)
	Welcome Type = 'W' // server: the granted slice or why not (JSON)
	List    Type = 'L' // client: list the server's GPUs (empty)
	GPUs    Type = 'G' // server: the GPUs (JSON)
	Data    Type = 'D' // the driver protocol's bytes
	Ping    Type = 'P' // liveness; answered with Pong
	Pong    Type = 'O'
	// Take: the client takes a same-node session's worker socket, which
	// the server then sends outside TLS (after Welcome's Local).
	Take Type = 'T'
)

// MaxPayload bounds a frame: a relay never buffers more than this.
const MaxPayload = 1 << 20

// headerLen is a frame's header: type (1 byte), payload length (4 bytes,
// big-endian).
const headerLen = 5

func (t Type) valid() bool {
	switch t {
	case Hello, Welcome, List, GPUs, Data, Ping, Pong, Take:
		return true
	}
	return false
}

func (t Type) String() string {
	if t.valid() {
		return string(rune(t))
	}
	return fmt.Sprintf("0x%02x", byte(t))
}

// AppendFrame appends one frame to b.
func AppendFrame(b []byte, t Type, payload []byte) []byte {
	b = append(b, make([]byte, headerLen)...)
	putHeader(b[len(b)-headerLen:], t, len(payload))
	return append(b, payload...)
}

// putHeader writes the header of a frame of type t with n payload bytes
// into h.
func putHeader(h []byte, t Type, n int) {
	h[0] = byte(t)
	binary.BigEndian.PutUint32(h[1:headerLen], uint32(n))
}

// frameReader reads frames through a buffer of its own: a frame that arrived
// whole is handed out where it lies, a larger one is read straight into
// its payload's buffer, so relayed bytes are copied once at most.
type frameReader struct {
	src     io.Reader
	buf     []byte // buf[r:w] is read and not yet handed out
	r, w    int
	payload []byte // frames larger than buf
}

// newFrameReader reads frames from src through a buffer of size bytes.
func newFrameReader(src io.Reader, size int) *frameReader {
	return &frameReader{src: src, buf: make([]byte, max(size, headerLen))}
}

// next reads one frame; its payload is valid until the next call. An
// unknown type or an oversized length is an error: the peer is not
// speaking this protocol. io.EOF: the stream ended between frames;
// io.ErrUnexpectedEOF: inside one. A read's own error (a timeout) is
// passed on.
func (fr *frameReader) next() (Type, []byte, error) {
	if err := fr.fill(headerLen); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) && fr.w == fr.r {
			err = io.EOF
		}
		return 0, nil, err
	}
	h := fr.buf[fr.r : fr.r+headerLen]
	t := Type(h[0])
	n := int(binary.BigEndian.Uint32(h[1:]))
	if !t.valid() {
		return 0, nil, fmt.Errorf("frame of unknown type %s", t)
	}
	if n > MaxPayload {
		return 0, nil, fmt.Errorf("frame %s of %d bytes: at most %d", t, n, MaxPayload)
	}
	fr.r += headerLen
	if n <= len(fr.buf) {
		if err := fr.fill(n); err != nil {
			return 0, nil, fmt.Errorf("frame %s: %w", t, err)
		}
		p := fr.buf[fr.r : fr.r+n]
		fr.r += n
		return t, p, nil
	}
	if cap(fr.payload) < n {
		fr.payload = make([]byte, n)
	}
	p := fr.payload[:n]
	k := copy(p, fr.buf[fr.r:fr.w])
	fr.r += k
	if _, err := io.ReadFull(fr.src, p[k:]); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, fmt.Errorf("frame %s: %w", t, err)
	}
	return t, p, nil
}

// fill reads until n bytes are buffered (n at most len(buf)), moving
// what is buffered to the front first if the rest would not fit.
func (fr *frameReader) fill(n int) error {
	if fr.w-fr.r >= n {
		return nil
	}
	if len(fr.buf)-fr.r < n {
		fr.w = copy(fr.buf, fr.buf[fr.r:fr.w])
		fr.r = 0
	}
	for fr.w-fr.r < n {
		m, err := fr.src.Read(fr.buf[fr.w:])
		fr.w += m
		if fr.w-fr.r >= n {
			return nil
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return nil
}
