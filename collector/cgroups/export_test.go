package cgroups

import "time"

// Walked is when r last walked the tree.
func (r *Resolver) Walked() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lastWalk
}

// NoWait lets r walk and recheck on every miss.
func (r *Resolver) NoWait() { r.minWalk, r.recheck = 0, 0 }
