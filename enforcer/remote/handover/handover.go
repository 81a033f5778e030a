// Package handover takes an established TLS 1.3 connection's record layer
// out of Go's crypto/tls, so that the remote client library and worker can
// carry a session's data themselves once the agents have authenticated and
// admitted it: the socket goes to them, and with it the traffic secrets and
// sequence numbers they continue the connection from. The node's private
// key never leaves the agent; a traffic secret is good for this one
// connection only.
//
// crypto/tls has no API for this, so Export reads its unexported state by
// reflection and refuses anything it cannot vouch for (a suite the C record
// layer lacks, data Go has read but not handed out, a record Go has half
// written); its test proves the result against a Go peer record by record,
// so a Go release that moves these fields fails the test, never a session.
package handover

import (
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"reflect"
)

// State is one end's view of a connection's record layer: what it writes
// with and what it reads with.
type State struct {
	Suite                   uint16
	WriteSecret, ReadSecret []byte
	WriteSeq, ReadSeq       uint64
}

// Suite is the one cipher suite the C record layer speaks.
const Suite = tls.TLS_AES_128_GCM_SHA256

// secretLen is a SHA-256 traffic secret's length.
const secretLen = 32

// Export reads c's record-layer state. c must be a handshaken TLS 1.3
// connection that nobody reads or writes now, with nothing read but not
// yet handed out: afterwards c must not be used again (closing it closes
// the socket).
func Export(c *tls.Conn) (State, error) {
	st := c.ConnectionState()
	if !st.HandshakeComplete || st.Version != tls.VersionTLS13 {
		return State{}, errors.New("the connection is not an established TLS 1.3 one")
	}
	if st.CipherSuite != Suite {
		return State{}, fmt.Errorf("cipher suite %s: only %s is handed over", tls.CipherSuiteName(st.CipherSuite),
			tls.CipherSuiteName(Suite))
	}
	v := reflect.ValueOf(c).Elem()
	for _, name := range []string{"rawInput", "hand"} { // bytes.Buffer: buf[off:] unread
		b := field(v, name)
		if !b.IsValid() || !field(b, "buf").IsValid() || !field(b, "off").IsValid() {
			return State{}, fmt.Errorf("crypto/tls has no %s buffer where expected", name)
		}
		if n := field(b, "buf").Len() - int(field(b, "off").Int()); n != 0 {
			return State{}, fmt.Errorf("%d bytes read but not handed out (%s)", n, name)
		}
	}
	if in := field(v, "input"); !in.IsValid() || !field(in, "s").IsValid() ||
		int64(field(in, "s").Len()) != field(in, "i").Int() {
		return State{}, errors.New("application data read but not handed out")
	}
	if sb := field(v, "sendBuf"); !sb.IsValid() || sb.Len() != 0 {
		return State{}, errors.New("records written but not sent")
	}
	s := State{Suite: Suite}
	var err error
	if s.WriteSecret, s.WriteSeq, err = half(field(v, "out")); err != nil {
		return State{}, fmt.Errorf("write side: %w", err)
	}
	if s.ReadSecret, s.ReadSeq, err = half(field(v, "in")); err != nil {
		return State{}, fmt.Errorf("read side: %w", err)
	}
	return s, nil
}

// half reads a halfConn's traffic secret and next sequence number.
func half(h reflect.Value) ([]byte, uint64, error) {
	if !h.IsValid() {
		return nil, 0, errors.New("crypto/tls has no half connection where expected")
	}
	if e := field(h, "err"); !e.IsValid() || !e.IsNil() {
		return nil, 0, errors.New("the connection failed")
	}
	sec, seq := field(h, "trafficSecret"), field(h, "seq")
	if !sec.IsValid() || sec.Kind() != reflect.Slice || sec.Len() != secretLen || !seq.IsValid() ||
		seq.Kind() != reflect.Array || seq.Len() != 8 {
		return nil, 0, errors.New("crypto/tls keeps its traffic secret or sequence number elsewhere")
	}
	secret := make([]byte, secretLen)
	for i := range secret {
		secret[i] = byte(sec.Index(i).Uint())
	}
	var n [8]byte
	for i := range n {
		n[i] = byte(seq.Index(i).Uint())
	}
	return secret, binary.BigEndian.Uint64(n[:]), nil
}

// field is v's field name, or the zero Value if v is not a struct that has
// one.
func field(v reflect.Value, name string) reflect.Value {
	if !v.IsValid() || v.Kind() != reflect.Struct {
		return reflect.Value{}
	}
	return v.FieldByName(name)
}
