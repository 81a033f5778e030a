package handover

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"io"
	"math/big"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// pair is a handshaken TLS 1.3 connection over loopback TCP.
func pair(t *testing.T) (client, server *tls.Conn) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "h"}, DNSNames: []string{"h"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	cert := tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	done := make(chan *tls.Conn, 1)
	go func() {
		c, err := lis.Accept()
		if err != nil {
			done <- nil
			return
		}
		s := tls.Server(c, &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}})
		if s.Handshake() != nil {
			s = nil
		}
		done <- s
	}()
	c, err := tls.Dial("tcp", lis.Addr().String(), &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: pool, ServerName: "h"})
	if err != nil {
		t.Fatal(err)
	}
	server = <-done
	if server == nil {
		t.Fatal("server handshake failed")
	}
	t.Cleanup(func() { c.Close(); server.Close() })
	return c, server
}

// aead is a direction's AES-128-GCM as RFC 8446 §7.3 derives it.
func aead(t *testing.T, secret []byte) (cipher.AEAD, []byte) {
	t.Helper()
	label := func(l string, n int) []byte {
		info := []byte{0, byte(n), byte(len("tls13 " + l))}
		info = append(append(info, "tls13 "+l...), 0)
		b, err := hkdf.Expand(sha256.New, secret, string(info), n)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	block, err := aes.NewCipher(label("key", 16))
	if err != nil {
		t.Fatal(err)
	}
	g, err := cipher.NewGCM(block)
	if err != nil {
		t.Fatal(err)
	}
	return g, label("iv", 12)
}

func nonce(iv []byte, seq uint64) []byte {
	n := bytes.Clone(iv)
	var s [8]byte
	binary.BigEndian.PutUint64(s[:], seq)
	for i := range s {
		n[4+i] ^= s[i]
	}
	return n
}

// The exported state continues the connection: records sealed with it are
// read by the Go peer, and the peer's records open with it, in sequence.
func TestExportContinuesTheConnection(t *testing.T) {
	c, s := pair(t)
	// Application data both ways first, so no sequence number is 0.
	for i := 0; i < 3; i++ {
		if _, err := c.Write([]byte("hello")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 5)
		if _, err := io.ReadFull(s, buf); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Write([]byte("welcome!")); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, make([]byte, 8)); err != nil {
			t.Fatal(err)
		}
	}
	st, err := Export(c)
	if err != nil {
		t.Fatal(err)
	}
	if st.WriteSeq < 3 || st.ReadSeq < 3 {
		t.Fatalf("sequence numbers %d/%d after three records each way", st.WriteSeq, st.ReadSeq)
	}
	raw := c.NetConn()
	w, wiv := aead(t, st.WriteSecret)
	for i := 0; i < 4; i++ {
		msg := bytes.Repeat([]byte{byte('a' + i)}, 100*(i+1))
		inner := append(bytes.Clone(msg), 23)
		hdr := []byte{23, 3, 3, 0, 0}
		binary.BigEndian.PutUint16(hdr[3:], uint16(len(inner)+16))
		rec := w.Seal(bytes.Clone(hdr), nonce(wiv, st.WriteSeq), inner, hdr)
		st.WriteSeq++
		if _, err := raw.Write(rec); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(s, got); err != nil || !bytes.Equal(got, msg) {
			t.Fatalf("record %d: the peer read %q, %v", i, got, err)
		}
	}
	r, riv := aead(t, st.ReadSecret)
	for i := 0; i < 4; i++ {
		msg := bytes.Repeat([]byte{byte('A' + i)}, 50*(i+1))
		if _, err := s.Write(msg); err != nil {
			t.Fatal(err)
		}
		hdr := make([]byte, 5)
		if _, err := io.ReadFull(raw, hdr); err != nil {
			t.Fatal(err)
		}
		body := make([]byte, binary.BigEndian.Uint16(hdr[3:]))
		if _, err := io.ReadFull(raw, body); err != nil {
			t.Fatal(err)
		}
		inner, err := r.Open(nil, nonce(riv, st.ReadSeq), body, hdr)
		st.ReadSeq++
		if err != nil || !bytes.Equal(inner, append(bytes.Clone(msg), 23)) {
			t.Fatalf("record %d from the peer: %q, %v", i, inner, err)
		}
	}
}

// Data Go has read but not handed out cannot be exported: it would be lost.
func TestExportRefusesUnreadData(t *testing.T) {
	c, s := pair(t)
	if _, err := s.Write([]byte("0123456789")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, make([]byte, 4)); err != nil {
		t.Fatal(err)
	}
	if _, err := Export(c); err == nil {
		t.Fatal("exported a connection with 6 bytes unread")
	}
	if _, err := io.ReadFull(c, make([]byte, 6)); err != nil {
		t.Fatal(err)
	}
	if _, err := Export(c); err != nil {
		t.Fatalf("once read: %v", err)
	}
}

// The agent's held copy of a handed-over socket leaves the session to its
// other holder (the worker: here a duplicate), answers the kernel's
// counters, and ends the session for every holder once.
func TestHeldSocket(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	peer, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	accepted, err := lis.Accept()
	if err != nil {
		t.Fatal(err)
	}
	worker, err := accepted.(*net.TCPConn).File() // the worker's copy
	if err != nil {
		t.Fatal(err)
	}
	defer worker.Close()
	held, err := Hold(accepted.(*net.TCPConn))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := accepted.Write([]byte("x")); err == nil {
		t.Fatal("the agent's own connection still writes after Hold")
	}
	if _, err := peer.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 5)
	if _, err := io.ReadFull(worker, b); err != nil || string(b) != "hello" {
		t.Fatalf("the worker read %q, %v: the session did not go on after Hold", b, err)
	}
	var received uint64
	if err := held.Control(func(fd uintptr) {
		info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
		if err == nil {
			received = info.Bytes_received
		}
	}); err != nil || received != 5 {
		t.Fatalf("the held socket's counters: %d bytes received, %v; want 5", received, err)
	}
	held.End()
	held.End()
	held.Close()
	_ = peer.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := peer.Read(b); err != io.EOF {
		t.Fatalf("the peer read %d bytes, %v after End; want end of file", n, err)
	}
	if err := held.Control(func(uintptr) {}); err == nil {
		t.Fatal("Control ran on an ended session's socket")
	}
}
