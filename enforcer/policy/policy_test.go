package policy

import (
	"math"
	"testing"
)

// c builds a container: weight, cap percent, flags "b" busy, "p" present, "h" high.
func c(w, capPct int, flags string) Container {
	x := Container{Weight: w, CapPercent: capPct}
	for _, f := range flags {
		switch f {
		case 'b':
			x.Busy, x.Present = true, true
		case 'p':
			x.Present = true
		case 'h':
			x.High = true
		}
	}
	return x
}

func TestShares(t *testing.T) {
	for _, tc := range []struct {
		name    string
		p       Policy
		maxInst int
		cs      []Container
		want    []float64
	}{
		{"fair-share: 1/max_inst with an idle partner", FairShare, 4, []Container{c(1, 0, "b"), c(1, 0, "p")}, []float64{0.25, 0.25}},
		{"fair-share: 1/max_inst alone", FairShare, 2, []Container{c(1, 0, "b")}, []float64{0.5}},
		{"fair-share: weights do not count", FairShare, 2, []Container{c(3, 0, "b"), c(1, 0, "b")}, []float64{0.5, 0.5}},
		{"preemptive: an idle partner is skipped", Preemptive, 16, []Container{c(1, 0, "b"), c(1, 0, "p")}, []float64{1, 0.5}},
		{"preemptive: busy ones share equally", Preemptive, 16, []Container{c(1, 0, "b"), c(5, 0, "b"), c(1, 0, "b")}, []float64{1. / 3, 1. / 3, 1. / 3}},
		{"weighted: 1:2", Weighted, 16, []Container{c(1, 0, "b"), c(2, 0, "b")}, []float64{1. / 3, 2. / 3}},
		{"weighted: alone takes the whole device", Weighted, 16, []Container{c(1, 0, "b")}, []float64{1}},
		{"weighted: an idle container keeps its slices while others run", Weighted, 16, []Container{c(1, 0, "b"), c(2, 0, "p")}, []float64{1. / 3, 2. / 3}},
		{"weighted: a container without a context is not present", Weighted, 16, []Container{c(1, 0, "b"), c(2, 0, "")}, []float64{1, 2. / 3}},
		{"weighted: 1:9", Weighted, 16, []Container{c(1, 0, "b"), c(9, 0, "b")}, []float64{0.1, 0.9}},
		{"fixed: weight/max_inst", Fixed, 10, []Container{c(3, 0, "b"), c(7, 0, "b")}, []float64{0.3, 0.7}},
		{"fixed: never more, even alone", Fixed, 10, []Container{c(3, 0, "b")}, []float64{0.3}},
		{"fixed: at most the device", Fixed, 4, []Container{c(9, 0, "b")}, []float64{1}},
		{"soft: like preemptive", Soft, 16, []Container{c(1, 0, "b"), c(1, 0, "b")}, []float64{0.5, 0.5}},
		{"native: ungated", Native, 16, []Container{c(1, 0, "b"), c(1, 10, "b")}, []float64{1, 1}},
		{"cap on top of preemptive", Preemptive, 16, []Container{c(1, 30, "b")}, []float64{0.3}},
		{"cap on top of weighted", Weighted, 16, []Container{c(1, 0, "b"), c(2, 50, "b")}, []float64{1. / 3, 0.5}},
		{"cap on top of fixed", Fixed, 2, []Container{c(1, 20, "b")}, []float64{0.2}},
		{"high priority: busy, the others get nothing", Preemptive, 16, []Container{c(1, 0, "bh"), c(1, 0, "b"), c(1, 0, "b")}, []float64{1, 0, 0}},
		{"high priority: the others share what it leaves", Preemptive, 16, []Container{{Weight: 1, High: true, Busy: true, Present: true, Demand: 0.4}, c(1, 0, "b"), c(1, 0, "b")}, []float64{1, 0.3, 0.3}},
		{"high priority: capped at 60%, the others share 40% by weight", Weighted, 16, []Container{c(1, 60, "bh"), c(1, 0, "b"), c(3, 0, "b")}, []float64{0.6, 0.1, 0.3}},
		{"high priority: idle, no effect", Preemptive, 16, []Container{c(1, 0, "ph"), c(1, 0, "b")}, []float64{1, 1}},
		{"high priority under fixed: the others keep their fixed share", Fixed, 10, []Container{c(6, 0, "bh"), c(3, 0, "b")}, []float64{0.6, 0.3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Shares(tc.p, tc.maxInst, tc.cs)
			for i, w := range tc.want {
				if math.Abs(got[i].Target-w) > 1e-9 {
					t.Errorf("container %d: target %.4f, want %.4f (all: %+v)", i, got[i].Target, w, got)
				}
				if want := tc.p == Soft && tc.cs[i].CapPercent == 0; got[i].Borrow != want {
					t.Errorf("container %d: borrow %v under %v, want %v", i, got[i].Borrow, tc.p, want)
				}
			}
		})
	}
}

// TestCapUnderEveryPolicy: a capped container's target never passes its cap
// and it never borrows, whatever the gated policy, its priority and its
// partners; a cap of 100 (or none) leaves soft's borrowing as it is.
func TestCapUnderEveryPolicy(t *testing.T) {
	partners := map[string][]Container{
		"alone":          nil,
		"busy partner":   {c(1, 0, "b")},
		"idle partner":   {c(1, 0, "p")},
		"busy high":      {c(1, 0, "bh")},
		"heavier weight": {c(5, 0, "b"), c(1, 0, "p")},
	}
	for p := FairShare; p < Native; p++ {
		for _, capPct := range []int{0, 30, 100} {
			for _, flags := range []string{"b", "bh"} {
				for name, others := range partners {
					me := c(3, capPct, flags)
					got := Shares(p, 4, append([]Container{me}, others...))[0]
					limit := 1.0
					if capPct > 0 {
						limit = float64(capPct) / 100
					}
					if got.Target > limit+1e-9 {
						t.Errorf("%v, cap %d%%, %q, %s: target %.3f past the cap", p, capPct, flags, name, got.Target)
					}
					if want := p == Soft && limit == 1; got.Borrow != want {
						t.Errorf("%v, cap %d%%, %q, %s: borrow %v, want %v", p, capPct, flags, name, got.Borrow, want)
					}
				}
			}
		}
	}
}

func TestMaxInst(t *testing.T) {
	if MaxInst(0) != DefaultMaxInst || MaxInst(7) != 7 {
		t.Errorf("MaxInst(0) = %d, MaxInst(7) = %d", MaxInst(0), MaxInst(7))
	}
	if fs := Shares(FairShare, 0, []Container{c(1, 0, "b")}); fs[0].Target != 1./DefaultMaxInst {
		t.Errorf("fair-share with the default max_inst: %v", fs)
	}
	for _, tc := range []struct {
		maxInst int
		cs      []Container
		want    int
	}{
		{4, nil, 4}, {4, []Container{c(1, 0, "b"), c(0, 0, "")}, 2}, {0, []Container{c(3, 0, "b")}, DefaultMaxInst - 3},
		{4, []Container{c(3, 0, "b"), c(2, 0, "b")}, 0},
	} {
		if got := FreeWeight(tc.maxInst, tc.cs); got != tc.want {
			t.Errorf("FreeWeight(%d, %v) = %d, want %d", tc.maxInst, tc.cs, got, tc.want)
		}
	}
}

func TestEffective(t *testing.T) {
	one, two := []Container{c(1, 0, "b"), c(1, 0, "b")}, []Container{c(1, 0, "b"), c(2, 0, "b")}
	if p := Effective(0, false, one); p != DefaultPolicy {
		t.Errorf("no policy, weights 1: %v, want %v", p, DefaultPolicy)
	}
	if p := Effective(0, false, two); p != Weighted {
		t.Errorf("no policy, a weight of 2: %v, want weighted", p)
	}
	if p := Effective(FairShare, true, two); p != FairShare {
		t.Errorf("explicit fair-share with a weight of 2: %v", p)
	}
}

// A weight not set (0) is 1, in the shares as in what is reported
// (enforcer/vocab checks a weight someone sets).
func TestWeight(t *testing.T) {
	for w, want := range map[int]int{0: 1, -3: 1, 1: 1, 7: 7, 1000: 1000} {
		if got := Weight(w); got != want {
			t.Errorf("Weight(%d) = %d, want %d", w, got, want)
		}
	}
	unset := Shares(Weighted, 4, []Container{{Present: true, Busy: true}, {Weight: 1, Present: true, Busy: true}})
	if unset[0] != unset[1] {
		t.Errorf("weighted shares of weight 0 and weight 1 = %v, want equal", unset)
	}
}
