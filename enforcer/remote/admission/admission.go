// Package admission is a remote GPU server's rules on who gets sessions:
// how many one client may hold at once, so one certificate (or one pod
// behind a node's relay) cannot take every session of the server, and
// which clients may run at high priority, which preempts everyone else's
// work on the GPU.
package admission

import (
	"fmt"
	"path"
	"strings"

	"github.com/gpuwarden/gpuwarden/enforcer/remote/pki"
)

// DefaultSessionsPerClient is the sessions one client may hold where the
// rules say nothing.
const DefaultSessionsPerClient = 16

// Rules are a server's admission rules. A client is the container a
// session runs for: its certificate's, or the pod a node's relay names.
type Rules struct {
	// SessionsPerClient is the most sessions one client holds at once;
	// 0: DefaultSessionsPerClient.
	SessionsPerClient int
	// HighPriority are the clients that may ask for priority high, as
	// patterns NAMESPACE[/POD[/CONTAINER]] (each part a glob, a missing
	// part matching any); empty: none.
	HighPriority []string
}

// CheckPattern validates a HighPriority pattern.
func CheckPattern(p string) error {
	parts := strings.Split(p, "/")
	if len(parts) > 3 {
		return fmt.Errorf("pattern %q: want NAMESPACE[/POD[/CONTAINER]]", p)
	}
	for _, part := range parts {
		if part == "" {
			return fmt.Errorf("pattern %q: an empty part (want NAMESPACE[/POD[/CONTAINER]], * for any)", p)
		}
		if _, err := path.Match(part, ""); err != nil {
			return fmt.Errorf("pattern %q: %w", p, err)
		}
	}
	return nil
}

// CheckPriority refuses priority high to a client the rules do not name.
func (r Rules) CheckPriority(id pki.Identity, high bool) error {
	if !high || r.mayRunHigh(id) {
		return nil
	}
	return fmt.Errorf("priority high is not granted to %s (the server's remote.highPriority does not name it): ask for normal", id)
}

// CheckHeld refuses a client that holds its most sessions already.
func (r Rules) CheckHeld(id pki.Identity, held int) error {
	most := r.SessionsPerClient
	if most <= 0 {
		most = DefaultSessionsPerClient
	}
	if held >= most {
		return fmt.Errorf("%s holds %d sessions, the most one client may (remote.maxSessionsPerClient): end one first", id, held)
	}
	return nil
}

func (r Rules) mayRunHigh(id pki.Identity) bool {
	names := []string{id.Namespace, id.Pod, id.Container}
	for _, p := range r.HighPriority {
		if matches(p, names) {
			return true
		}
	}
	return false
}

// matches says whether every part of pattern p matches its name.
func matches(p string, names []string) bool {
	parts := strings.Split(p, "/")
	if len(parts) > len(names) {
		return false
	}
	for i, part := range parts {
		if ok, err := path.Match(part, names[i]); err != nil || !ok {
			return false
		}
	}
	return true
}
