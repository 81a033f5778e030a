// Package client is the remote GPU client's side: it opens sessions on a
// GPU node's agent over mutual TLS, lists its GPUs, and relays a local
// program's driver calls (the remote client library's unix socket) over
// one link per connection.
package client

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/remote/link"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/pki"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/session"
)

// DefaultPort is the agent's remote port.
const DefaultPort = 7070

// Dialer opens links to one server.
type Dialer struct {
	Addr    string // host:port
	TLS     *tls.Config
	Timeout time.Duration // connect, and the link's liveness
	// Relayed keeps every session's data on the relayed path
	// (remote.dataPath relayed): never handed to the client library.
	Relayed bool
	// Local, if set, is the server's local socket (the server is this
	// node's own agent): dialled instead of Addr, and a direct session
	// over it gets the worker's own socket.
	Local string
}

// NewDialer is a dialer to server ("host", "host:port", "[v6]:port"; the
// port defaults to 7070) with the client's credentials. The server's
// certificate must name the host as given.
func NewDialer(server string, f pki.Files, timeout time.Duration) (*Dialer, error) {
	host, port, err := SplitServer(server)
	if err != nil {
		return nil, err
	}
	conf, err := pki.ClientConfig(f, host)
	if err != nil {
		return nil, fmt.Errorf("client credentials: %w", err)
	}
	if timeout <= 0 {
		timeout = link.DefaultTimeout
	}
	return &Dialer{Addr: net.JoinHostPort(host, strconv.Itoa(port)), TLS: conf, Timeout: timeout}, nil
}

// SplitServer reads HOST[:PORT].
func SplitServer(s string) (string, int, error) {
	if s == "" {
		return "", 0, errors.New("no server given")
	}
	host, portS, err := net.SplitHostPort(s)
	if err != nil {
		// No port: the whole string is the host (a bare IPv6 address too).
		if ip := net.ParseIP(s); ip != nil || !strings.Contains(s, ":") {
			return s, DefaultPort, nil
		}
		return "", 0, fmt.Errorf("server %q: %w", s, err)
	}
	port, err := strconv.Atoi(portS)
	if err != nil || port < 1 || port > 65535 || host == "" {
		return "", 0, fmt.Errorf("server %q: want HOST[:PORT], a port from 1 to 65535", s)
	}
	return host, port, nil
}

// dial connects and completes the TLS handshake within the timeout.
func (d *Dialer) dial(ctx context.Context) (*link.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, d.Timeout)
	defer cancel()
	nd := &net.Dialer{KeepAlive: -1}
	network, addr := "tcp", d.Addr
	if d.Local != "" {
		network, addr = "unix", d.Local
	}
	c, err := (&tls.Dialer{NetDialer: nd, Config: d.TLS}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", addr, err)
	}
	link.Buffered(c.(*tls.Conn).NetConn())
	return link.New(c, d.Timeout), nil
}

// Open starts a session: the server answers with the granted slice, or
// why not (an error).
func (d *Dialer) Open(ctx context.Context, req session.Request) (*link.Conn, session.Welcome, error) {
	var w session.Welcome
	if _, err := req.Check(); err != nil {
		return nil, w, err
	}
	l, err := d.dial(ctx)
	if err != nil {
		return nil, w, err
	}
	b, _ := json.Marshal(req)
	if err := l.Send(link.Hello, b); err != nil {
		l.Close()
		return nil, w, fmt.Errorf("send the request: %w", err)
	}
	p, err := l.Expect(link.Welcome)
	if err == nil {
		err = session.Decode(p, &w)
	}
	if err != nil {
		l.Close()
		return nil, w, fmt.Errorf("%s did not answer the request (a certificate it refused?): %w", d.Addr, err)
	}
	if w.Error != "" {
		l.Close()
		return nil, w, fmt.Errorf("%s refused the session: %s", d.Addr, w.Error)
	}
	return l, w, nil
}

// List asks the server for its GPUs.
func (d *Dialer) List(ctx context.Context) (session.GPUList, error) {
	var out session.GPUList
	l, err := d.dial(ctx)
	if err != nil {
		return out, err
	}
	defer l.Close()
	if err := l.Send(link.List, nil); err != nil {
		return out, fmt.Errorf("send the list request: %w", err)
	}
	p, err := l.Expect(link.GPUs)
	if err == nil {
		err = session.Decode(p, &out)
	}
	if err != nil {
		return out, fmt.Errorf("%s did not answer the list request (a certificate it refused?): %w", d.Addr, err)
	}
	if out.Error != "" {
		return out, fmt.Errorf("%s: %s", d.Addr, out.Error)
	}
	return out, nil
}
