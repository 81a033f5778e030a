package connlimit

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// server accepts on a limited listener and keeps what it admits.
type server struct {
	l        *Listener
	log      *bytes.Buffer
	admitted chan net.Conn
}

func start(t *testing.T, limits Limits) *server {
	t.Helper()
	s := &server{log: &bytes.Buffer{}, admitted: make(chan net.Conn, 64)}
	l, err := Listen("127.0.0.1:0", limits, slog.New(slog.NewTextHandler(&lockedWriter{w: s.log}, nil)))
	if err != nil {
		t.Fatal(err)
	}
	s.l = l
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s.admitted <- c
		}
	}()
	t.Cleanup(func() { l.Close(); <-done })
	return s
}

// dial connects from a loopback source address (any 127/8 address is the
// machine's own). A refusal can come before connect returns: err is then
// the reset.
func (s *server) dial(t *testing.T, from string) (net.Conn, error) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", s.l.Addr().String())
	if err == nil {
		t.Cleanup(func() { c.Close() })
	}
	return c, err
}

// open connects from a source and waits for the server to admit it.
func (s *server) open(t *testing.T, from string) net.Conn {
	t.Helper()
	c, err := s.dial(t, from)
	if err != nil {
		t.Fatal(err)
	}
	s.admit(t)
	return c
}

// admit waits for the server to admit the next connection.
func (s *server) admit(t *testing.T) net.Conn {
	t.Helper()
	select {
	case c := <-s.admitted:
		t.Cleanup(func() { c.Close() })
		return c
	case <-time.After(5 * time.Second):
		t.Fatal("no connection admitted within 5s")
		return nil
	}
}

// refused says whether a connection from a source is closed at once,
// without a word.
func (s *server) refused(t *testing.T, from string) bool {
	t.Helper()
	c, err := s.dial(t, from)
	if err != nil {
		return isReset(err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = c.Read(make([]byte, 1))
	return err == io.EOF || isReset(err)
}

func isReset(err error) bool { return errors.Is(err, syscall.ECONNRESET) }

func TestPerSourceCap(t *testing.T) {
	s := start(t, Limits{Total: 10, PerSource: 2})
	s.open(t, "127.0.0.2")
	s.open(t, "127.0.0.2")
	if !s.refused(t, "127.0.0.2") {
		t.Fatal("a third connection from 127.0.0.2 was not closed at once")
	}
	if n := s.l.Refused(); n != 1 {
		t.Errorf("Refused() = %d, want 1", n)
	}
	// Another source has its own share.
	s.open(t, "127.0.0.3")
	// The refusal is logged, naming the source and the cap.
	waitLog(t, s, `source=127.0.0.2 cap="per source" refused=1`)
}

func TestTotalCap(t *testing.T) {
	s := start(t, Limits{Total: 3, PerSource: 2})
	for _, from := range []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"} {
		s.open(t, from)
	}
	if !s.refused(t, "127.0.0.5") {
		t.Fatal("a connection over the total was not closed at once")
	}
	if n := s.l.Refused(); n != 1 {
		t.Errorf("Refused() = %d, want 1", n)
	}
}

// TestCloseGivesBack: a connection's place is free again once the server
// closes it, and closing it twice gives back one place.
func TestCloseGivesBack(t *testing.T) {
	s := start(t, Limits{Total: 2, PerSource: 1})
	c, err := s.dial(t, "127.0.0.2")
	if err != nil {
		t.Fatal(err)
	}
	admitted := s.admit(t)
	if !s.refused(t, "127.0.0.2") {
		t.Fatal("a second connection from 127.0.0.2 was not closed at once")
	}
	c.Close()
	admitted.Close()
	admitted.Close()
	s.open(t, "127.0.0.2")
	s.open(t, "127.0.0.3")
	if !s.refused(t, "127.0.0.4") {
		t.Fatal("a double Close gave back two places")
	}
}

// TestFullListenerEvictsIdle: a full listener admits a newcomer from a
// source holding fewer connections in place of the oldest idle connection
// of a source holding more, never of a busy one, and refuses it when there
// is none.
func TestFullListenerEvictsIdle(t *testing.T) {
	s := start(t, Limits{Total: 4, PerSource: 3})
	var server []*Conn
	var client []net.Conn
	for _, from := range []string{"127.0.0.2", "127.0.0.3", "127.0.0.3", "127.0.0.4"} {
		c, err := s.dial(t, from)
		if err != nil {
			t.Fatal(err)
		}
		client = append(client, c)
		server = append(server, s.admit(t).(*Conn))
		server[len(server)-1].SetIdle(true)
	}
	server[1].SetIdle(false) // in the middle of a request
	if !s.refused(t, "127.0.0.2") {
		t.Fatal("a source holding one admitted a second in place of one of a source holding two")
	}
	s.open(t, "127.0.0.5")
	if n := s.l.Evicted(); n != 1 {
		t.Fatalf("Evicted() = %d, want 1", n)
	}
	for i, want := range []bool{false, false, true, false} { // 127.0.0.3's idle one
		_ = client[i].SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		_, err := client[i].Read(make([]byte, 1))
		if closed := !errors.Is(err, os.ErrDeadlineExceeded); closed != want {
			t.Errorf("connection %d closed %v (%v), want %v", i, closed, err, want)
		}
	}
	if !s.refused(t, "127.0.0.6") { // every source holds one now
		t.Fatal("a full listener admitted another with no source holding more")
	}
	server[2].Close() // the evicted one, closed by its server at last: no place given twice
	if !s.refused(t, "127.0.0.6") {
		t.Fatal("closing an evicted connection gave its place back twice")
	}
}

// TestRefusalsLoggedAtMostOnceASecond: a burst of refusals writes one line
// at once and one line standing for the rest, not a line each.
func TestRefusalsLoggedAtMostOnceASecond(t *testing.T) {
	s := start(t, Limits{Total: 1, PerSource: 1})
	s.open(t, "127.0.0.2")
	const burst = 200
	for range burst {
		if !s.refused(t, "127.0.0.2") {
			t.Fatal("a connection over the cap was not closed at once")
		}
	}
	if n := s.l.Refused(); n != burst {
		t.Fatalf("Refused() = %d, want %d", n, burst)
	}
	waitLog(t, s, "refused=200 suppressed=")
	if lines := strings.Count(s.logText(), "\n"); lines > 4 {
		t.Errorf("%d refusals wrote %d lines, want a few:\n%s", burst, lines, s.logText())
	}
}

func waitLog(t *testing.T, s *server, want string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(s.logText(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("the log lacks %q:\n%s", want, s.logText())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var logMu sync.Mutex

func (s *server) logText() string {
	logMu.Lock()
	defer logMu.Unlock()
	return s.log.String()
}

type lockedWriter struct{ w io.Writer }

func (l *lockedWriter) Write(b []byte) (int, error) {
	logMu.Lock()
	defer logMu.Unlock()
	return l.w.Write(b)
}
