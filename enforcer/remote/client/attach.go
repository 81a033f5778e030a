package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/remote/handover"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/link"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/session"
)

// Attached is a session opened for one client library connection.
type Attached struct {
	Welcome session.Welcome
	// Direct: the session's socket was handed to the client library,
	// which talks to the worker with no relay in between; Local: that
	// socket is the worker's own (the same node: no TLS, no network).
	Direct, Local bool
	wait          func() error
}

// Wait carries the session until it ends: it relays, or, when the
// session was handed over, waits for the program to hang up (its process
// exited) and then closes the agent's copy of the socket. The error says
// why a relayed link ended; nil: the program closed it.
func (a *Attached) Wait() error { return a.wait() }

// Attach opens a session for the client library connected on c, with the
// library's hello read first: a library that takes a handed-over
// connection gets the session's socket and TLS state once the server
// agrees (and the dialer does not force relaying); any other is relayed.
// On an error c is left to the caller to close: the library's calls then
// fail at once.
func (d *Dialer) Attach(ctx context.Context, c *net.UnixConn, req session.Request) (*Attached, error) {
	hello := make([]byte, handover.HelloLen)
	_ = c.SetReadDeadline(time.Now().Add(d.Timeout))
	_, err := io.ReadFull(c, hello)
	_ = c.SetReadDeadline(time.Time{})
	if err != nil {
		return nil, fmt.Errorf("the program's hello: %w", err)
	}
	takes, err := handover.Hello(hello)
	if err != nil {
		return nil, err
	}
	// A same-node session needs no cipher; a network one, the record layer's.
	req.Direct = takes && !d.Relayed && (d.Local != "" || handover.Supported())
	l, w, err := d.Open(ctx, req)
	if err != nil {
		return nil, err
	}
	if w.Local {
		if err := takeLocal(l, c, d.Timeout); err != nil {
			return nil, err
		}
		return &Attached{Welcome: w, Direct: true, Local: true, wait: func() error {
			_, _ = io.Copy(io.Discard, c)
			return nil
		}}, nil
	}
	if !w.Direct {
		if err := l.SendData(hello); err != nil {
			l.Close()
			return nil, fmt.Errorf("relay the hello: %w", err)
		}
		return &Attached{Welcome: w, wait: func() error { return l.Relay(c) }}, nil
	}
	held, err := d.handOver(l, c)
	if err != nil {
		return nil, err
	}
	return &Attached{Welcome: w, Direct: true, wait: func() error {
		_, _ = io.Copy(io.Discard, c) // the library never writes here: this is its exit
		held.Close()
		return nil
	}}, nil
}

// handOver passes the link's socket and state to the client library; the
// agent keeps a copy of the socket, outside the runtime's poller
// (handover.Held), until the program hangs up. Any failure ends the
// session: the server already handed its end to the worker.
func (d *Dialer) handOver(l *link.Conn, c *net.UnixConn) (*handover.Held, error) {
	tc, err := l.Detach()
	if err != nil {
		l.Close()
		return nil, err
	}
	st, f, err := handover.Take(tc, d.Timeout)
	if err == nil {
		err = handover.Send(c, st, f)
		f.Close()
	}
	var held *handover.Held
	if err == nil {
		tcp, _ := tc.NetConn().(*net.TCPConn)
		held, err = handover.Hold(tcp)
	}
	if err != nil {
		handover.End(tc)
		return nil, err
	}
	return held, nil
}

// Path names the session's data path as remote.dataPath does.
func (a *Attached) Path() string {
	switch {
	case a.Local:
		return session.PathDirect + " on the same node"
	case a.Direct:
		return session.PathDirect
	}
	return session.PathRelayed
}

// takeLocal asks the server for the session's worker socket (a same-node
// session) and passes it to the client library, which then talks to the
// worker with nothing between. The link is done with.
func takeLocal(l *link.Conn, c *net.UnixConn, timeout time.Duration) error {
	defer l.Close()
	if err := l.Send(link.Take, nil); err != nil {
		return fmt.Errorf("take the session: %w", err)
	}
	tc, err := l.Detach()
	if err != nil {
		return err
	}
	u, ok := tc.NetConn().(*net.UnixConn)
	if !ok {
		return errors.New("a same-node session over a socket that is not a unix one")
	}
	f, err := handover.ReceiveSocket(u, timeout)
	if err != nil {
		return err
	}
	defer f.Close()
	return handover.Send(c, handover.State{}, f)
}
