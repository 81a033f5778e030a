// Package link is the connection between a remote GPU client and the GPU
// node, inside mutual TLS: typed frames, so heartbeats run beside the
// relayed driver calls (data frames carry the interposer's protocol bytes
// unparsed), and the relay that joins a link to a local socket.
package link

import (
	"bufio"
	"encoding/binary"
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
)

// MaxPayload bounds a frame: a relay never buffers more than this.
const MaxPayload = 1 << 20

// headerLen is a frame's header: type (1 byte), payload length (4 bytes,
// big-endian).
const headerLen = 5

func (t Type) valid() bool {
	switch t {
	case Hello, Welcome, List, GPUs, Data, Ping, Pong:
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
	b = append(b, byte(t), 0, 0, 0, 0)
	binary.BigEndian.PutUint32(b[len(b)-4:], uint32(len(payload)))
	return append(b, payload...)
}

// ReadFrame reads one frame; its payload is in buf (grown to the payload's
// size, at most MaxPayload) and valid until the next read. An unknown type
// or an oversized length is an error: the peer is not speaking this
// protocol.
func ReadFrame(r *bufio.Reader, buf []byte) (Type, []byte, error) {
	var h [headerLen]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	t := Type(h[0])
	n := binary.BigEndian.Uint32(h[1:])
	if !t.valid() {
		return 0, nil, fmt.Errorf("frame of unknown type %s", t)
	}
	if n > MaxPayload {
		return 0, nil, fmt.Errorf("frame %s of %d bytes: at most %d", t, n, MaxPayload)
	}
	if cap(buf) < int(n) {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(r, buf); err != nil {
		return 0, nil, fmt.Errorf("frame %s: %w", t, io.ErrUnexpectedEOF)
	}
	return t, buf, nil
}
