package interposer_test

import (
	"bytes"
	"context"
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
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/remote/handover"
	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

// tlsRecTimeout bounds each exchange: the machines are loaded, and a hang
// must fail rather than stall the suite.
const tlsRecTimeout = 3 * time.Minute

// flipper passes a Go end's records to the socket, and flips a byte in
// the middle of the one it is armed for (crypto/tls writes each record
// after the handshake with one Write).
type flipper struct {
	net.Conn
	mu    sync.Mutex
	armed int // flip the armed-th write from now; 0: none
}

func (f *flipper) Write(p []byte) (int, error) {
	f.mu.Lock()
	if f.armed > 0 {
		if f.armed--; f.armed == 0 {
			p = bytes.Clone(p)
			p[len(p)/2] ^= 0x40
		}
	}
	f.mu.Unlock()
	return f.Conn.Write(p)
}

func (f *flipper) arm(n int) {
	f.mu.Lock()
	f.armed = n
	f.mu.Unlock()
}

// tlsRec is gw-tlsrec on one end of a TLS 1.3 connection.
type tlsRec struct {
	state          handover.State // its end's state at the handover
	cmd            *exec.Cmd
	stdout, stderr bytes.Buffer
	done           chan error
}

// tlsConn is a TLS 1.3 connection between two Go ends, one of them to be
// handed to gw-tlsrec.
type tlsConn struct {
	goEnd, cEnd *tls.Conn
	flip        *flipper // under goEnd
	goRaw, cRaw net.Conn
}

// tlsPair handshakes mutual TLS 1.3 over loopback TCP, with the C end the
// client (cClient) or the server, and exchanges a few records through Go
// both ways, so the sequence numbers handed over are not 0.
func tlsPair(t *testing.T, cClient bool) *tlsConn {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "gw"}, DNSNames: []string{"gw"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	certs := []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := lis.Accept()
		accepted <- c
	}()
	dialed, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	served := <-accepted
	if served == nil {
		t.Fatal("accept failed")
	}
	p := &tlsConn{goRaw: dialed, cRaw: served}
	if cClient {
		p.goRaw, p.cRaw = served, dialed
	}
	t.Cleanup(func() { p.goRaw.Close(); p.cRaw.Close() })
	p.flip = &flipper{Conn: p.goRaw}
	wrap := func(c net.Conn, client bool) *tls.Conn {
		if client {
			return tls.Client(c, &tls.Config{MinVersion: tls.VersionTLS13, Certificates: certs, RootCAs: pool, ServerName: "gw"})
		}
		return tls.Server(c, &tls.Config{MinVersion: tls.VersionTLS13, Certificates: certs, ClientCAs: pool,
			ClientAuth: tls.RequireAndVerifyClientCert, SessionTicketsDisabled: true})
	}
	p.goEnd, p.cEnd = wrap(p.flip, !cClient), wrap(p.cRaw, cClient)
	for _, c := range []net.Conn{p.goRaw, p.cRaw} {
		if err := c.SetDeadline(time.Now().Add(tlsRecTimeout)); err != nil {
			t.Fatal(err)
		}
	}
	hs := make(chan error, 1)
	go func() { hs <- p.goEnd.Handshake() }()
	if err := p.cEnd.Handshake(); err != nil {
		t.Fatal(err)
	}
	if err := <-hs; err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		ping, pong := fmt.Sprintf("ping %d", i), fmt.Sprintf("pong %d!", i)
		if _, err := p.goEnd.Write([]byte(ping)); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(p.cEnd, make([]byte, len(ping))); err != nil {
			t.Fatal(err)
		}
		if _, err := p.cEnd.Write([]byte(pong)); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(p.goEnd, make([]byte, len(pong))); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// handOver exports c's state and hands its socket raw to gw-tlsrec with
// args; kernel: its records must be the kernel's (gw-tlsrec --kernel).
func handOver(t *testing.T, kernel bool, c *tls.Conn, raw net.Conn, args ...string) *tlsRec {
	t.Helper()
	bin := simtest.Bin(t, "interposer/gw-tlsrec")
	st, err := handover.Export(c)
	if err != nil {
		t.Fatal(err)
	}
	if st.WriteSeq < 3 || st.ReadSeq < 3 {
		t.Fatalf("handed over sequence numbers %d/%d after three records each way", st.WriteSeq, st.ReadSeq)
	}
	f, err := raw.(*net.TCPConn).File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r := &tlsRec{state: st, done: make(chan error, 1)}
	ctx, cancel := context.WithTimeout(context.Background(), tlsRecTimeout)
	args = append([]string{"--fd", "3"}, args...)
	if kernel {
		args = append([]string{"--kernel"}, args...)
	}
	r.cmd = exec.CommandContext(ctx, bin, args...)
	r.cmd.ExtraFiles = []*os.File{f}
	r.cmd.Stdin = strings.NewReader(fmt.Sprintf("%04x %x %x %d %d\n", st.Suite, st.WriteSecret, st.ReadSecret,
		st.WriteSeq, st.ReadSeq))
	r.cmd.Stdout, r.cmd.Stderr = &r.stdout, &r.stderr
	if err := r.cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	go func() { r.done <- r.cmd.Wait(); cancel() }()
	t.Cleanup(func() { _ = r.cmd.Process.Kill(); r.wait(t) })
	raw.Close() // the socket is gw-tlsrec's now; Go's descriptor goes without a word on the wire
	return r
}

// startTLSRec hands the C end of a new connection to gw-tlsrec with args.
func startTLSRec(t *testing.T, kernel, cClient bool, args ...string) (*tlsConn, *tlsRec) {
	t.Helper()
	p := tlsPair(t, cClient)
	return p, handOver(t, kernel, p.cEnd, p.cRaw, args...)
}

// kernelTLSOrSkip skips t, with what the kernel refused, unless the kernel
// takes both directions of a handed-over connection (under
// GPUWARDEN_REQUIRE_KERNEL_TLS=1, set where tests/uml.sh boots a kernel
// that has it, it fails instead); where it does, a message goes through it
// and back.
func kernelTLSOrSkip(t *testing.T) {
	t.Helper()
	p, r := startTLSRec(t, true, true, "echo")
	msg := []byte("through the kernel")
	if _, err := p.goEnd.Write(msg); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(p.goEnd, make([]byte, len(msg))); err != nil {
		if r.wait(t) == 3 {
			if os.Getenv("GPUWARDEN_REQUIRE_KERNEL_TLS") == "1" {
				t.Fatalf("GPUWARDEN_REQUIRE_KERNEL_TLS=1: %s", r.stderr.String())
			}
			t.Skipf("the kernel here does not take the records: %s",
				strings.TrimPrefix(strings.TrimSpace(r.stderr.String()), "gw-tlsrec: "))
		}
		t.Fatalf("echo through kernel TLS: %v (gw-tlsrec: %s)", err, r.stderr.String())
	}
	if err := p.goEnd.Close(); err != nil {
		t.Fatal(err)
	}
	r.wantExit(t, len(msg), nil)
}

// wait returns gw-tlsrec's exit code.
func (r *tlsRec) wait(t *testing.T) int {
	t.Helper()
	err := <-r.done
	r.done <- err // for later waits
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		t.Fatalf("gw-tlsrec: %v", err)
	}
	return 0
}

// wantExit checks gw-tlsrec ended with 0 and "read n", or with 1 and
// want's reason (strerror's words are Go's, capitalized); errEnded: with 1
// and any reason a read gave, or with 0 and "read n".
func (r *tlsRec) wantExit(t *testing.T, n int, want error) {
	t.Helper()
	code := r.wait(t)
	out, stderr := strings.TrimSpace(r.stdout.String()), strings.TrimSpace(r.stderr.String())
	if want == errEnded {
		if (code != 1 || !strings.HasPrefix(stderr, "gw-tlsrec: read: ")) && (code != 0 || out != fmt.Sprintf("read %d", n)) {
			t.Fatalf("gw-tlsrec: exit %d, stdout %q, stderr %q; want the session ended", code, out, stderr)
		}
		return
	}
	if want == nil {
		if code != 0 || out != fmt.Sprintf("read %d", n) {
			t.Fatalf("gw-tlsrec: exit %d, stdout %q, stderr %q; want 0 and read %d", code, out, stderr, n)
		}
		return
	}
	if code != 1 || !strings.HasPrefix(stderr, "gw-tlsrec: ") || !strings.Contains(strings.ToLower(stderr), want.Error()) {
		t.Fatalf("gw-tlsrec: exit %d, stderr %q; want 1 and %q", code, stderr, want.Error())
	}
}

// errEnded is what the kernel's record layer is held to where it, not
// gw-tlsrec, judges a record: the session ends, whatever errno says.
var errEnded = errors.New("the session ended")

// pattern is byte i of what either end sends in the duplex case.
func pattern(at, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte((at + i) % 251)
	}
	return b
}

// sizes returns a generator of write sizes from 0 to max, reproducibly.
func sizes(max int) func() int {
	x := uint64(7)
	return func() int {
		x = x*6364136223846793005 + 1442695040888963407
		return int(x>>33) % (max + 1)
	}
}

// rawHalf is one direction of a connection taken out of crypto/tls, for
// the records Go's own tls.Conn never sends.
type rawHalf struct {
	secret []byte
	seq    uint64
	aead   cipher.AEAD
	iv     []byte
}

func expandLabel(t *testing.T, secret []byte, label string, n int) []byte {
	t.Helper()
	info := append([]byte{0, byte(n), byte(len("tls13 " + label))}, "tls13 "+label...)
	b, err := hkdf.Expand(sha256.New, secret, string(append(info, 0)), n)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func newRawHalf(t *testing.T, secret []byte, seq uint64) *rawHalf {
	t.Helper()
	block, err := aes.NewCipher(expandLabel(t, secret, "key", 16))
	if err != nil {
		t.Fatal(err)
	}
	g, err := cipher.NewGCM(block)
	if err != nil {
		t.Fatal(err)
	}
	return &rawHalf{secret: secret, seq: seq, aead: g, iv: expandLabel(t, secret, "iv", 12)}
}

func (h *rawHalf) nonce() []byte {
	n := bytes.Clone(h.iv)
	for i := range 8 {
		n[11-i] ^= byte(h.seq >> (8 * i))
	}
	h.seq++
	return n
}

func (h *rawHalf) next(t *testing.T) *rawHalf {
	return newRawHalf(t, expandLabel(t, h.secret, "traffic upd", 32), 0)
}

// rawEnd is the Go end's connection after its state was exported.
type rawEnd struct {
	c    net.Conn
	w, r *rawHalf
}

func exportRaw(t *testing.T, p *tlsConn) *rawEnd {
	t.Helper()
	st, err := handover.Export(p.goEnd)
	if err != nil {
		t.Fatal(err)
	}
	return &rawEnd{c: p.goRaw, w: newRawHalf(t, st.WriteSecret, st.WriteSeq), r: newRawHalf(t, st.ReadSecret, st.ReadSeq)}
}

// send writes a record of content of type typ, with pad zeros of padding.
func (e *rawEnd) send(t *testing.T, typ byte, content []byte, pad int) {
	t.Helper()
	inner := append(append(bytes.Clone(content), typ), make([]byte, pad)...)
	hdr := []byte{23, 3, 3, 0, 0}
	binary.BigEndian.PutUint16(hdr[3:], uint16(len(inner)+16))
	if _, err := e.c.Write(e.w.aead.Seal(hdr, e.w.nonce(), inner, hdr)); err != nil {
		t.Fatal(err)
	}
}

// recv reads a record: its type and content.
func (e *rawEnd) recv(t *testing.T) (byte, []byte) {
	t.Helper()
	hdr := make([]byte, 5)
	if _, err := io.ReadFull(e.c, hdr); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, binary.BigEndian.Uint16(hdr[3:]))
	if _, err := io.ReadFull(e.c, body); err != nil {
		t.Fatal(err)
	}
	inner, err := e.r.aead.Open(nil, e.r.nonce(), body, hdr)
	if err != nil {
		t.Fatalf("a record from gw-tlsrec: %v", err)
	}
	inner = bytes.TrimRight(inner, "\x00")
	if len(inner) == 0 {
		t.Fatal("a record from gw-tlsrec of padding only")
	}
	return inner[len(inner)-1], inner[:len(inner)-1]
}

// TestTLSRecordLayer: the C record layer continues a TLS 1.3 connection
// that Go's crypto/tls handshook, in step with Go at the other end (or
// with itself), as client and as server: bulk data both ways at once in
// records of every size with KeyUpdates on the way, KeyUpdates either end
// asks for, padding, empty records and close_notify; and it ends a
// connection on a tampered record (EBADMSG), on a record that may not come
// (EPROTO) and on an error alert (ECONNRESET). All of it with the records
// in user space, and again with the kernel's (kernel TLS), where the
// kernel has it.
func TestTLSRecordLayer(t *testing.T) {
	t.Run("user", func(t *testing.T) { tlsRecordLayer(t, false) })
	t.Run("kernel", func(t *testing.T) {
		kernelTLSOrSkip(t)
		tlsRecordLayer(t, true)
	})
}

func tlsRecordLayer(t *testing.T, kernel bool) {
	for _, cClient := range []bool{true, false} {
		role := map[bool]string{true: "c-client", false: "c-server"}[cClient]
		t.Run("duplex/"+role, func(t *testing.T) { tlsDuplex(t, kernel, cClient) })
		t.Run("echo-keyupdate/"+role, func(t *testing.T) { tlsEchoKeyUpdate(t, kernel, cClient) })
	}
	t.Run("duplex/c-both", func(t *testing.T) { tlsDuplexC(t, kernel) })
	t.Run("tampered", func(t *testing.T) {
		p, r := startTLSRec(t, kernel, true, "echo")
		msg := []byte("checked")
		p.flip.arm(3)
		for i := range 3 {
			if _, err := p.goEnd.Write(msg); err != nil {
				t.Fatal(err)
			}
			if i == 2 {
				break // the third record was flipped: no echo
			}
			if _, err := io.ReadFull(p.goEnd, make([]byte, len(msg))); err != nil {
				t.Fatalf("echo %d: %v", i, err)
			}
		}
		r.wantExit(t, 0, syscall.EBADMSG)
	})
	// kernelJudges: the kernel refuses these records itself, with errors
	// of its own; the rest it passes up for the record layer to judge.
	unexpected := []struct {
		name         string
		want         error
		kernelJudges bool
		send         func(t *testing.T, p *tlsConn)
	}{
		{"plaintext-handshake", syscall.EPROTO, true, func(t *testing.T, p *tlsConn) {
			rawWrite(t, p, []byte{22, 3, 3, 0, 5, 24, 0, 0, 1, 0})
		}},
		{"too-long", syscall.EPROTO, true, func(t *testing.T, p *tlsConn) {
			rawWrite(t, p, []byte{23, 3, 3, 0x41, 0x01}) // 2^14 + 257 bytes to follow
		}},
		{"eof-inside-record", syscall.EPROTO, true, func(t *testing.T, p *tlsConn) {
			rawWrite(t, p, append([]byte{23, 3, 3, 0, 100}, make([]byte, 50)...))
			if err := p.goRaw.(*net.TCPConn).CloseWrite(); err != nil {
				t.Fatal(err)
			}
		}},
		{"session-ticket", syscall.EPROTO, false, func(t *testing.T, p *tlsConn) {
			exportRaw(t, p).send(t, 22, []byte{4, 0, 0, 4, 0, 0, 0, 0}, 0)
		}},
		{"key-update-bad", syscall.EPROTO, false, func(t *testing.T, p *tlsConn) {
			exportRaw(t, p).send(t, 22, []byte{24, 0, 0, 1, 2}, 0)
		}},
		{"padding-only", syscall.EPROTO, true, func(t *testing.T, p *tlsConn) {
			e := exportRaw(t, p)
			inner := make([]byte, 20)
			hdr := []byte{23, 3, 3, 0, byte(len(inner) + 16)}
			if _, err := e.c.Write(e.w.aead.Seal(hdr, e.w.nonce(), inner, hdr)); err != nil {
				t.Fatal(err)
			}
		}},
		{"change-cipher-spec", syscall.EPROTO, false, func(t *testing.T, p *tlsConn) {
			exportRaw(t, p).send(t, 20, []byte{1}, 0)
		}},
		{"error-alert", syscall.ECONNRESET, false, func(t *testing.T, p *tlsConn) {
			exportRaw(t, p).send(t, 21, []byte{2, 40}, 0)
		}},
	}
	for _, u := range unexpected {
		t.Run("unexpected/"+u.name, func(t *testing.T) {
			p, r := startTLSRec(t, kernel, false, "echo")
			// One message through first: the record layer holds the
			// connection (the kernel cannot take one the peer has begun
			// to close) and works, before what follows ends it.
			msg := []byte("before")
			if _, err := p.goEnd.Write(msg); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(p.goEnd, make([]byte, len(msg))); err != nil {
				t.Fatalf("echo: %v (gw-tlsrec: %s)", err, r.stderr.String())
			}
			u.send(t, p)
			if kernel && u.kernelJudges {
				r.wantExit(t, len(msg), errEnded)
				return
			}
			r.wantExit(t, len(msg), u.want)
		})
	}
}

// TestTLSRecordPaths: the record layer's two bulk paths (VAES on 512-bit
// registers, AES-NI on 128-bit ones) seal every record length alike and
// open each other's records. TestTLSRecordLayer checks the path this CPU
// takes against Go's TLS; this carries that to the other.
func TestTLSRecordPaths(t *testing.T) {
	out, err := exec.Command(simtest.Bin(t, "interposer/gw-tlsrec"), "agree").CombinedOutput()
	if err != nil {
		t.Fatalf("gw-tlsrec agree: %v\n%s", err, out)
	}
	var lengths, wide int
	if _, err := fmt.Sscanf(string(out), "agree %d wide %d", &lengths, &wide); err != nil || lengths != 4100 {
		t.Fatalf("gw-tlsrec agree printed %q, want 4100 lengths", out)
	}
	if wide == 0 {
		t.Skip("this CPU has no VAES and VPCLMULQDQ on 512-bit registers: only the AES-NI path runs here")
	}
}

// rawWrite writes bytes to the Go end's socket, under its records.
func rawWrite(t *testing.T, p *tlsConn, b []byte) {
	t.Helper()
	if _, err := p.goRaw.Write(b); err != nil {
		t.Fatal(err)
	}
}

// tlsDuplex: Go and gw-tlsrec each send several MiB in writes of varied
// sizes at once; gw-tlsrec asks for a KeyUpdate on the way, which Go
// answers while both write. gw-tlsrec's close_notify ends Go's reading,
// and then Go's ends gw-tlsrec's (Go does not close first: a KeyUpdate
// crypto/tls cannot answer, it does not take either).
func tlsDuplex(t *testing.T, kernel, cClient bool) {
	const toC, fromC = 5 << 20, 6 << 20
	p, r := startTLSRec(t, kernel, cClient, "duplex", fmt.Sprint(fromC), fmt.Sprint(2<<20))
	werr := make(chan error, 1)
	go func() {
		next := sizes(40000)
		for at := 0; at < toC; {
			n := min(next(), toC-at)
			if _, err := p.goEnd.Write(pattern(at, n)); err != nil {
				werr <- err
				return
			}
			at += n
		}
		werr <- nil
	}()
	buf := make([]byte, 64<<10)
	got := 0
	for {
		n, err := p.goEnd.Read(buf)
		if !bytes.Equal(buf[:n], pattern(got, n)) {
			t.Fatalf("bytes %d-%d from gw-tlsrec differ from the pattern", got, got+n)
		}
		got += n
		if err == io.EOF {
			break
		}
		if err != nil {
			r.wait(t)
			t.Fatalf("after %d bytes: %v (gw-tlsrec: %v, %s)", got, err, r.cmd.ProcessState, r.stderr.String())
		}
	}
	if got != fromC {
		t.Fatalf("read %d bytes from gw-tlsrec, want %d", got, fromC)
	}
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	if err := p.goEnd.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	r.wantExit(t, toC, nil)
}

// tlsDuplexC: gw-tlsrec at both ends, each asking the other for a
// KeyUpdate while both write: the answers go out from the reading thread
// between the writing thread's records.
func tlsDuplexC(t *testing.T, kernel bool) {
	p := tlsPair(t, true)
	a := handOver(t, kernel, p.goEnd, p.goRaw, "duplex", fmt.Sprint(7<<20), fmt.Sprint(1<<20))
	b := handOver(t, kernel, p.cEnd, p.cRaw, "duplex", fmt.Sprint(5<<20), fmt.Sprint(3<<20))
	a.wantExit(t, 5<<20, nil)
	b.wantExit(t, 7<<20, nil)
}

// tlsEchoKeyUpdate: gw-tlsrec echoes rounds of messages and asks for a
// KeyUpdate half way, which Go answers; each side's secret then moved
// exactly one step, and the records after that are read by both. Then the
// Go end's state is taken out of crypto/tls to send what it does not: an
// empty record, a padded one, a KeyUpdate asking gw-tlsrec for one, and
// close_notify, all in step with gw-tlsrec's sequence numbers.
func tlsEchoKeyUpdate(t *testing.T, kernel, cClient bool) {
	p, r := startTLSRec(t, kernel, cClient, "echo", fmt.Sprint(1<<20))
	next := sizes(64 << 10)
	total := 0
	for round := 0; total < 2<<20; round++ {
		msg := pattern(round, next())
		werr := make(chan error, 1)
		go func() { _, err := p.goEnd.Write(msg); werr <- err }()
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(p.goEnd, got); err != nil || !bytes.Equal(got, msg) {
			t.Fatalf("round %d: echo of %d bytes: %v (gw-tlsrec: %s)", round, len(msg), err, r.stderr.String())
		}
		if err := <-werr; err != nil {
			t.Fatal(err)
		}
		total += len(msg)
	}
	e := exportRaw(t, p)
	if want := expandLabel(t, r.state.WriteSecret, "traffic upd", 32); !bytes.Equal(e.r.secret, want) {
		t.Fatal("Go's read secret is not the C end's next write secret: no KeyUpdate, or more than one")
	}
	if want := expandLabel(t, r.state.ReadSecret, "traffic upd", 32); !bytes.Equal(e.w.secret, want) {
		t.Fatal("Go did not answer the KeyUpdate gw-tlsrec asked for")
	}
	e.send(t, 23, nil, 0)
	e.send(t, 23, []byte("hello"), 300)
	if typ, got := e.recv(t); typ != 23 || string(got) != "hello" {
		t.Fatalf("echo of a padded record: type %d %q", typ, got)
	}
	e.send(t, 22, []byte{24, 0, 0, 1, 1}, 0)
	e.w = e.w.next(t)
	if typ, got := e.recv(t); typ != 22 || !bytes.Equal(got, []byte{24, 0, 0, 1, 0}) {
		t.Fatalf("answer to a KeyUpdate request: type %d %x", typ, got)
	}
	e.r = e.r.next(t)
	e.send(t, 23, []byte("again"), 0)
	if typ, got := e.recv(t); typ != 23 || string(got) != "again" {
		t.Fatalf("echo after the KeyUpdate: type %d %q", typ, got)
	}
	e.send(t, 21, []byte{1, 0}, 0)
	if typ, got := e.recv(t); typ != 21 || !bytes.Equal(got, []byte{1, 0}) {
		t.Fatalf("answer to close_notify: type %d %x", typ, got)
	}
	if n, err := e.c.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("after close_notify: %d bytes, %v; want EOF", n, err)
	}
	r.wantExit(t, total+len("hello")+len("again"), nil)
}
