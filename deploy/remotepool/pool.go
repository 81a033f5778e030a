// Package remotepool is the remote GPU servers a node without GPUs offers
// its pods: which GPUs they have and whether they answer, asked of each
// server's agent, and which server holds each GPU. The device plugin turns
// its answer into gpuwarden.io/remote-gpu devices (Devices is the one
// place answers become devices). A DRA remote pool learns its servers from
// the servers' own slices instead, and dials them through Dialers.
package remotepool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/nvmldev"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/client"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/pki"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/session"
)

// Answer is one server's answer to a list request.
type Answer struct {
	Server string // as configured: HOST[:PORT]
	List   session.GPUList
	Err    error // no answer within the timeout, or a refusal
}

// Devices turns the servers' answers into devices, in the servers' order
// and then by GPU index, numbered from 0, and says which server holds each
// GPU (by UUID). A server that did not answer has no devices: the device
// plugin marks the devices it listed before unhealthy.
func Devices(answers []Answer) ([]nvmldev.Device, map[string]string) {
	var out []nvmldev.Device
	where := map[string]string{}
	for _, a := range answers {
		if a.Err != nil {
			continue
		}
		gpus := append([]session.GPU(nil), a.List.GPUs...)
		sort.Slice(gpus, func(i, j int) bool { return gpus[i].Index < gpus[j].Index })
		for _, g := range gpus {
			if g.UUID == "" || where[g.UUID] != "" || g.Unavailable != "" {
				continue // a UUID two servers claim stays with the first
			}
			where[g.UUID] = a.Server
			out = append(out, nvmldev.Device{Index: len(out), UUID: g.UUID, Name: g.Name,
				MemoryTotalBytes: g.TotalBytes, MemoryUsedBytes: g.UsedBytes})
		}
	}
	return out, where
}

// Pool asks the configured servers.
type Pool struct {
	servers []string
	dialers map[string]*client.Dialer
	timeout time.Duration

	mu    sync.Mutex
	where map[string]string // GPU UUID -> server, from the last answers
}

// New is a pool of servers (HOST[:PORT], port 7070 by default), dialled
// with this node's credentials; a server that does not answer a list
// request within timeout counts as down.
func New(servers []string, f pki.Files, timeout time.Duration) (*Pool, error) {
	if len(servers) == 0 {
		return nil, errors.New("no remote GPU servers configured")
	}
	p := &Pool{dialers: map[string]*client.Dialer{}, timeout: timeout, where: map[string]string{}}
	for _, s := range servers {
		if _, dup := p.dialers[s]; dup {
			return nil, fmt.Errorf("remote server %q listed twice", s)
		}
		d, err := client.NewDialer(s, f, timeout)
		if err != nil {
			return nil, fmt.Errorf("remote server %q: %w", s, err)
		}
		p.servers = append(p.servers, s)
		p.dialers[s] = d
	}
	return p, nil
}

// Devices asks every server for its GPUs at once and returns the GPUs of
// those that answered; an error only when none did.
func (p *Pool) Devices() ([]nvmldev.Device, error) {
	answers := make([]Answer, len(p.servers))
	var wg sync.WaitGroup
	for i, s := range p.servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i] = p.ask(s)
		}()
	}
	wg.Wait()
	devs, where := Devices(answers)
	p.mu.Lock()
	p.where = where
	p.mu.Unlock()
	var errs []error
	for _, a := range answers {
		if a.Err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", a.Server, a.Err))
		}
	}
	if len(errs) == len(answers) {
		return nil, errors.Join(errs...)
	}
	return devs, nil
}

// ask lists one server's GPUs, giving up after the timeout.
func (p *Pool) ask(server string) Answer {
	ctx, cancel := context.WithTimeout(context.Background(), p.timeout)
	defer cancel()
	done := make(chan Answer, 1)
	go func() {
		l, err := p.dialers[server].List(ctx)
		done <- Answer{Server: server, List: l, Err: err}
	}()
	select {
	case a := <-done:
		return a
	case <-ctx.Done():
		return Answer{Server: server, Err: fmt.Errorf("no answer within %v", p.timeout)}
	}
}

// Server is the server that held GPU uuid at the last answers.
func (p *Pool) Server(uuid string) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s, ok := p.where[uuid]
	return s, ok
}

// Dialer is the dialer of a configured server.
func (p *Pool) Dialer(server string) (*client.Dialer, bool) {
	d, ok := p.dialers[server]
	return d, ok
}

// Dialers dials the servers a DRA remote pool's slices name: any server
// whose certificate the CA vouches for, each with a dialer of its own made
// at its first use.
type Dialers struct {
	files   pki.Files
	timeout time.Duration
	log     *slog.Logger

	mu      sync.Mutex
	dialers map[string]*client.Dialer
}

// NewDialers dials with this node's credentials.
func NewDialers(f pki.Files, timeout time.Duration, log *slog.Logger) *Dialers {
	return &Dialers{files: f, timeout: timeout, log: log, dialers: map[string]*client.Dialer{}}
}

// Dialer is server's dialer; false when one cannot be made (the reason is
// logged: a bad address or unreadable credentials).
func (d *Dialers) Dialer(server string) (*client.Dialer, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if dl, ok := d.dialers[server]; ok {
		return dl, true
	}
	dl, err := client.NewDialer(server, d.files, d.timeout)
	if err != nil {
		d.log.Warn("remote server cannot be dialled", "server", server, "err", err)
		return nil, false
	}
	d.dialers[server] = dl
	return dl, true
}
