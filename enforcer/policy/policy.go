// Package policy turns a GPU's scheduling policy and the containers sharing
// it into each container's share of the device's time. It is pure: no clocks,
// files or processes; enforcer/scheduler feeds it what it measures and holds
// the containers to what it returns.
//
// The policies are cGPU's, numbered as cGPU numbers them:
//
//	0 fair-share  each of max_inst slots gets 1/max_inst, busy or not
//	1 preemptive  idle containers are skipped; busy ones share equally
//	2 weighted    shares in proportion to weight among the containers present
//	              on the device (an idle one keeps its slices while others
//	              run); a container alone may use the whole device
//	3 fixed       weight/max_inst of the device, never more
//	4 soft        like preemptive, but a container may borrow what others
//	              leave unused
//	5 native      memory limits only; launches are not gated
//
// On top of any policy: a high-priority container that is busy takes what it
// wants (within its own policy share and cap) and the others share what it
// leaves; a hard cap (percent) bounds a container's share under every gated
// policy (a capped container does not borrow under soft).
package policy

import "fmt"

// Policy is a GPU's scheduling policy.
type Policy int

// The policies, as cGPU numbers them.
const (
	FairShare Policy = iota
	Preemptive
	Weighted
	Fixed
	Soft
	Native
)

// Defaults when nothing is configured: cGPU's max_inst, and preemptive
// sharing (each busy container gets 1/busy) unless a weight asks for weighted.
//
// max_inst is one number per GPU: the containers (slots) the device plugin
// offers on it and the 1/max_inst that fair-share and fixed divide it by.
// What a user may set, and its limits, is enforcer/vocab's to read and check.
const (
	DefaultMaxInst = 4
	DefaultPolicy  = Preemptive
)

// MaxInst is the max_inst in force for a setting of n: n, or DefaultMaxInst for 0.
func MaxInst(n int) int {
	if n <= 0 {
		return DefaultMaxInst
	}
	return n
}

// FreeWeight is cGPU's free_weight: what is left of a GPU's max_inst once
// the weights of the containers on it are taken (never below 0).
func FreeWeight(maxInst int, cs []Container) int {
	left := float64(MaxInst(maxInst))
	for _, c := range cs {
		left -= weight(c)
	}
	return int(max(left, 0))
}

var names = [...]string{"fair-share", "preemptive", "weighted", "fixed", "soft", "native"}

func (p Policy) String() string {
	if p.Valid() {
		return names[p]
	}
	return fmt.Sprintf("policy(%d)", int(p))
}

// Valid says whether p is one of the six policies.
func (p Policy) Valid() bool { return p >= FairShare && p <= Native }

// Gated says whether the policy holds launches (all but native do).
func (p Policy) Gated() bool { return p != Native }

// Container is what the policy needs to know of one container on the GPU.
type Container struct {
	Weight     int     // 1-vocab.MaxWeight; 0 is taken as 1 (Weight)
	CapPercent int     // hard cap on its share, 1-100; 0: none
	High       bool    // high priority
	Present    bool    // has a context on the device (weighted keeps its slices)
	Busy       bool    // used, or asked for, the device recently
	Demand     float64 // share it uses when nothing holds it back, 0-1; 0: unknown (taken as all it may have). Only a busy high-priority container's counts.
}

// Share is the policy's answer for one container.
type Share struct {
	// Target is the share of the device's time the container is held to,
	// 0-1; for an idle container, what it gets as soon as it is busy.
	Target float64
	// Borrow: it may use more than Target while others leave time unused
	// (soft, and only a container without a cap: a cap holds under every policy).
	Borrow bool
}

// Effective is the policy a GPU runs: the explicit one when set; otherwise,
// as in cGPU, weighted when any container's weight is above 1, else DefaultPolicy.
func Effective(explicit Policy, set bool, cs []Container) Policy {
	if set {
		return explicit
	}
	for _, c := range cs {
		if c.Weight > 1 {
			return Weighted
		}
	}
	return DefaultPolicy
}

// Weight is the weight in force for a setting of w: w, or 1 for 0 (none set).
func Weight(w int) int {
	if w < 1 {
		return 1
	}
	return w
}

func weight(c Container) float64 { return float64(Weight(c.Weight)) }

func capOf(c Container) float64 {
	if c.CapPercent <= 0 || c.CapPercent >= 100 {
		return 1
	}
	return float64(c.CapPercent) / 100
}

// borrows says whether c may use time others leave beyond its target: under
// soft, unless a cap bounds it.
func borrows(p Policy, c Container) bool { return p == Soft && capOf(c) >= 1 }

// base computes the policy's shares among the containers in idx alone, caps applied.
func base(p Policy, maxInst int, cs []Container, idx []int, out []float64) {
	var busy int
	var present float64
	for _, i := range idx {
		if cs[i].Busy {
			busy++
		}
		if cs[i].Present || cs[i].Busy {
			present += weight(cs[i])
		}
	}
	for _, i := range idx {
		c := cs[i]
		var t float64
		switch p {
		case FairShare:
			t = 1 / float64(maxInst)
		case Preemptive, Soft:
			if c.Busy {
				t = 1 / float64(busy)
			} else {
				t = 1 / float64(busy+1)
			}
		case Weighted:
			if c.Present || c.Busy {
				t = weight(c) / present
			} else {
				t = weight(c) / (present + weight(c))
			}
		case Fixed:
			t = min(1, weight(c)/float64(maxInst))
		default: // Native
			t = 1
		}
		out[i] = min(t, capOf(c))
	}
}

// Shares computes each container's share of the device under policy p with
// maxInst slots (see MaxInst). The result is in the order of cs.
func Shares(p Policy, maxInst int, cs []Container) []Share {
	maxInst = MaxInst(maxInst)
	out := make([]Share, len(cs))
	t := make([]float64, len(cs))
	if p == Native {
		for i := range out {
			out[i] = Share{Target: 1}
		}
		return out
	}
	var high, normal []int
	for i, c := range cs {
		if c.High {
			high = append(high, i)
		} else {
			normal = append(normal, i)
		}
	}
	// High priority first, as if the others were not there; the others as if
	// the high ones were not there, then squeezed into what those leave.
	base(p, maxInst, cs, high, t)
	base(p, maxInst, cs, normal, t)
	left := 1.0
	for _, i := range high {
		if cs[i].Busy {
			use := t[i]
			if d := cs[i].Demand; d > 0 && d < use {
				use = d
			}
			left -= use
		}
	}
	left = max(left, 0)
	if len(high) > 0 && left < 1 {
		var sum float64
		for _, i := range normal {
			if cs[i].Busy || (p == Weighted && cs[i].Present) || p == FairShare || p == Fixed {
				sum += t[i]
			}
		}
		if sum > left {
			for _, i := range normal {
				t[i] *= left / sum
			}
		}
	}
	for i := range out {
		out[i] = Share{Target: t[i], Borrow: borrows(p, cs[i])}
	}
	return out
}
