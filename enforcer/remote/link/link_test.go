package link

import (
	"bytes"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

func TestFrameRoundTrip(t *testing.T) {
	var b []byte
	b = AppendFrame(b, Data, []byte("abc"))
	b = AppendFrame(b, Ping, nil)
	big := bytes.Repeat([]byte("xyz"), 100) // more than the reader's buffer
	b = AppendFrame(b, Data, big)
	b = AppendFrame(b, Pong, []byte("after"))
	r := newFrameReader(iotest.OneByteReader(bytes.NewReader(b)), 64)
	typ, p, err := r.next()
	if err != nil || typ != Data || string(p) != "abc" {
		t.Fatalf("first frame: %v %q %v", typ, p, err)
	}
	typ, p, err = r.next()
	if err != nil || typ != Ping || len(p) != 0 {
		t.Fatalf("second frame: %v %q %v", typ, p, err)
	}
	typ, p, err = r.next()
	if err != nil || typ != Data || !bytes.Equal(p, big) {
		t.Fatalf("third frame: %v of %d bytes, %v", typ, len(p), err)
	}
	typ, p, err = r.next()
	if err != nil || typ != Pong || string(p) != "after" {
		t.Fatalf("fourth frame: %v %q %v", typ, p, err)
	}
	if _, _, err := r.next(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the last frame: %v, want EOF", err)
	}
}

func TestFrameRefusesBadInput(t *testing.T) {
	for name, b := range map[string][]byte{
		"unknown type": {'Z', 0, 0, 0, 0},
		"oversized":    {'D', 0x7f, 0xff, 0xff, 0xff},
		"short":        {'D', 0, 0, 0, 9, 'a'},
		"short header": {'D', 0, 0},
		"short large":  append([]byte{'D', 0, 0, 1, 0}, make([]byte, 100)...),
	} {
		if _, _, err := newFrameReader(bytes.NewReader(b), 64).next(); err == nil || errors.Is(err, io.EOF) {
			t.Errorf("%s: err %v, want a protocol error", name, err)
		}
	}
}

func FuzzReadFrame(f *testing.F) {
	f.Add(AppendFrame(nil, Data, []byte("hello")))
	f.Add(AppendFrame(AppendFrame(nil, Ping, nil), Pong, nil))
	f.Add([]byte{'D', 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{'H', 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		r := newFrameReader(bytes.NewReader(b), 64)
		for {
			typ, p, err := r.next()
			if err != nil {
				return
			}
			if !typ.valid() || len(p) > MaxPayload {
				t.Fatalf("accepted %v of %d bytes", typ, len(p))
			}
			// What was read re-encodes to the bytes it came from.
			if got := AppendFrame(nil, typ, p); !bytes.Contains(b, got) {
				t.Fatalf("frame %v %q not in the input", typ, p)
			}
		}
	})
}

// pair is two links joined by a loopback TCP connection.
func pair(t *testing.T, timeout time.Duration) (*Conn, *Conn, net.Conn) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	c1, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c2, err := lis.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c1.Close(); c2.Close() })
	return New(c1, timeout), New(c2, timeout), c2
}

// TestRelayCarriesBytesBothWays: two relays joined by a link carry a
// stream between their local sockets, unchanged and in order.
func TestRelayCarriesBytesBothWays(t *testing.T) {
	a, b, _ := pair(t, time.Second)
	appA, relayA := net.Pipe()
	appB, relayB := net.Pipe()
	go a.Relay(relayA)
	go b.Relay(relayB)
	msg := bytes.Repeat([]byte("0123456789abcdef"), 100000) // 1.6 MB, several frames
	go func() { appA.Write(msg); appA.Write([]byte("END")) }()
	got := make([]byte, len(msg)+3)
	if _, err := io.ReadFull(appB, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[:len(msg)], msg) || string(got[len(msg):]) != "END" {
		t.Fatal("bytes changed on the way")
	}
	go appB.Write([]byte("back"))
	back := make([]byte, 4)
	if _, err := io.ReadFull(appA, back); err != nil || string(back) != "back" {
		t.Fatalf("reply: %q %v", back, err)
	}
	// One side closing ends the other's local socket.
	appA.Close()
	appB.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := appB.Read(back); err == nil {
		t.Fatal("the far side's socket stayed open after the near side closed")
	}
}

// TestRelayIdleStaysUp: heartbeats keep an idle link alive past its timeout.
func TestRelayIdleStaysUp(t *testing.T) {
	a, b, _ := pair(t, 400*time.Millisecond)
	appA, relayA := net.Pipe()
	appB, relayB := net.Pipe()
	ended := make(chan error, 2)
	go func() { ended <- a.Relay(relayA) }()
	go func() { ended <- b.Relay(relayB) }()
	select {
	case err := <-ended:
		t.Fatalf("an idle link ended: %v", err)
	case <-time.After(1500 * time.Millisecond):
	}
	go appA.Write([]byte("x"))
	x := make([]byte, 1)
	if _, err := io.ReadFull(appB, x); err != nil {
		t.Fatal(err)
	}
}

// TestRelayDeadPeer: a peer that stops answering (its process stopped,
// the network gone) ends the relay within the timeout and closes the
// local socket.
func TestRelayDeadPeer(t *testing.T) {
	a, _, raw := pair(t, 300*time.Millisecond)
	_ = raw // the far end is connected but nobody reads or writes it
	app, relay := net.Pipe()
	start := time.Now()
	ended := make(chan error, 1)
	go func() { ended <- a.Relay(relay) }()
	app.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := app.Read(make([]byte, 1)); err == nil || strings.Contains(err.Error(), "timeout") {
		t.Fatalf("local socket: %v, want closed", err)
	}
	err := <-ended
	if !errors.Is(err, ErrDead) {
		t.Fatalf("relay ended with %v, want ErrDead", err)
	}
	if d := time.Since(start); d < 250*time.Millisecond || d > 3*time.Second {
		t.Fatalf("dead link noticed after %v, want about the 300ms timeout", d)
	}
}

// TestRecvSilentInsideAFrame: a peer that stops in the middle of a frame
// is as dead as one that stops between frames.
func TestRecvSilentInsideAFrame(t *testing.T) {
	for name, partial := range map[string][]byte{
		"small frame": AppendFrame(nil, Data, make([]byte, 100))[:50],
		"large frame": AppendFrame(nil, Data, make([]byte, 200<<10))[:100<<10],
	} {
		t.Run(name, func(t *testing.T) {
			a, _, raw := pair(t, 300*time.Millisecond) // raw: the socket a reads from, at its far end
			go raw.Write(partial)
			if _, _, err := a.Recv(); !errors.Is(err, ErrDead) {
				t.Fatalf("receive: %v, want ErrDead", err)
			}
		})
	}
}
