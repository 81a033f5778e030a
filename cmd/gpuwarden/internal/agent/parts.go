package agent

import (
	"context"
	"sort"
	"sync"

	"github.com/gpuwarden/gpuwarden/enforcer/agentapi"
)

// parts records which parts are up.
type parts struct {
	mu sync.Mutex
	m  map[string]agentapi.PartState
}

func (p *parts) set(name string, enabled bool, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = map[string]agentapi.PartState{}
	}
	s := agentapi.PartState{Enabled: enabled, Up: enabled && err == nil}
	if err != nil {
		s.Error = err.Error()
	}
	p.m[name] = s
}

// snapshot returns the parts and whether every enabled one is up.
func (p *parts) snapshot() (map[string]agentapi.PartState, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]agentapi.PartState, len(p.m))
	ready := true
	names := make([]string, 0, len(p.m))
	for n := range p.m {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		s := p.m[n]
		out[n] = s
		if s.Enabled && !s.Up {
			ready = false
		}
	}
	return out, ready
}

// runPart starts a part that runs until the agent closes: err (from
// making it) leaves it down and unstarted; otherwise it is up, and down
// again if run returns an error. what names it in the log.
func (a *Agent) runPart(ctx context.Context, name, what string, err error, run func(context.Context) error) {
	a.parts.set(name, true, err)
	if err != nil {
		a.log.Error(what+" not started", "err", err)
		return
	}
	ctx, cancel := context.WithCancel(ctx)
	a.closers = append(a.closers, func() error { cancel(); return nil })
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		if err := run(ctx); err != nil {
			a.parts.set(name, true, err)
			a.log.Error(what+" stopped", "err", err)
		}
	}()
}
