package allocation

import (
	"fmt"
	"testing"
	"time"
)

func TestIsDirName(t *testing.T) {
	for name, want := range map[string]bool{
		DirName([]string{"GPU-5f1c::mem-0"}):    true,
		DirName([]string{"GPU-5f1c::slot-3"}):   true,
		DirName([]string{"GPU-5f1c::remote-1"}): true,
		"mem-GPU-5f1c-0123456789abcdef":         true,
		"root":                                  false,
		"kubepods+pod1+abc":                     false,
		"mem-GPU-5f1c-0123456789ABCDEF":         false,
		"slot--0123456789abcdef0":               false,
		"mem-GPU/x-0123456789abcdef":            false,
	} {
		if got := IsDirName(name); got != want {
			t.Errorf("IsDirName(%q) = %v, want %v", name, got, want)
		}
	}
	for name, want := range map[string]bool{
		ClaimDirName("6f1c2a8e-0d3b-4c55-9a1e-2b7d8c9e0f11", "gpu-0"): true,
		ClaimDirName("../..", "gpu-0"):                                true, // sanitized: one path element
		"claim-x/y-gpu-0":                                             false,
		DirName([]string{"GPU-5f1c::mem-0"}):                          false,
	} {
		if got := IsClaimDirName(name); got != want {
			t.Errorf("IsClaimDirName(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestDirOf(t *testing.T) {
	uid := "6f1c2a8e-0d3b-4c55-9a1e-2b7d8c9e0f11"
	for _, c := range []struct {
		ids  []string
		want string
	}{
		{[]string{ClaimCDIKind + "=" + ClaimDirName(uid, "gpu-1")}, ClaimDirName(uid, "gpu-1")},
		{[]string{"GPU-5f1c::mem-0", "GPU-5f1c::mem-1"}, DirName([]string{"GPU-5f1c::mem-1", "GPU-5f1c::mem-0"})},
		// Not a claim device of ours: named as ids are, never as the path it says.
		{[]string{ClaimCDIKind + "=../../etc"}, DirName([]string{ClaimCDIKind + "=../../etc"})},
		{[]string{"other.vendor/gpu=claim-" + uid + "-gpu-1"}, DirName([]string{"other.vendor/gpu=claim-" + uid + "-gpu-1"})},
	} {
		if got := DirOf(c.ids); got != c.want {
			t.Errorf("DirOf(%q) = %q, want %q", c.ids, got, c.want)
		}
	}
}

func TestCollectorDead(t *testing.T) {
	const grace = 5 * time.Minute
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	alloc := DirName([]string{"GPU-a::mem-0"})
	claimDir := ClaimDirName("6f1c2a8e-0d3b-4c55-9a1e-2b7d8c9e0f11", "gpu-0")
	type step struct {
		at      time.Duration // since t0
		dir     Dir           // Name defaults to alloc, Modified to t0
		unknown bool          // the kubelet did not answer
		inUse   bool
		dead    bool
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"listed is never dead", []step{
			{at: 0, dir: Dir{Listed: true}},
			{at: time.Hour, dir: Dir{Listed: true}},
		}},
		{"unlisted: dead after the grace period", []step{
			{at: 0},
			{at: grace - time.Second},
			{at: grace, dead: true},
		}},
		{"a pod that goes after running a long time gets the whole grace period", []step{
			{at: 0, dir: Dir{Listed: true}},
			{at: 10 * grace},
			{at: 11*grace - time.Second},
			{at: 11 * grace, dead: true},
		}},
		{"just allocated, not listed yet", []step{
			{at: grace, dir: Dir{Modified: t0.Add(grace)}},
			{at: 2*grace - time.Second, dir: Dir{Modified: t0.Add(grace)}},
			{at: 2 * grace, dir: Dir{Modified: t0.Add(grace)}, dead: true},
		}},
		{"listed again: the grace period starts over", []step{
			{at: 0},
			{at: grace - time.Minute, dir: Dir{Listed: true}},
			{at: grace},
			{at: 2*grace - time.Second},
			{at: 2 * grace, dead: true},
		}},
		{"the kubelet does not answer: no allocation is dead", []step{
			{at: 0, unknown: true},
			{at: time.Hour, unknown: true},
			{at: 2 * time.Hour},
			{at: 2*time.Hour + grace, dead: true},
		}},
		{"in use by a live process", []step{
			{at: 0},
			{at: grace, inUse: true},
			{at: 2 * grace, inUse: true},
			{at: 2*grace + time.Second, dead: true},
		}},
		{"the interposer's directory: its cgroup exists", []step{
			{at: 0, dir: Dir{Name: "kubepods+x", Cgroup: true}},
			{at: time.Hour, dir: Dir{Name: "kubepods+x", Cgroup: true}},
		}},
		{"the interposer's directory: its cgroup is gone", []step{
			{at: 0, dir: Dir{Name: "kubepods+x", Listed: true}}, // a listing does not name it
			{at: grace, dir: Dir{Name: "kubepods+x"}, unknown: true, dead: true},
		}},
		{"an allocation is not kept by a cgroup's name", []step{
			{at: 0, dir: Dir{Cgroup: true}},
			{at: grace, dir: Dir{Cgroup: true}, dead: true},
		}},
		{"a DRA claim's directory: kept while prepared, whatever the kubelet lists", []step{
			{at: 0, dir: Dir{Name: claimDir, Prepared: true}, unknown: true},
			{at: time.Hour, dir: Dir{Name: claimDir, Prepared: true}},
			{at: time.Hour + grace, dir: Dir{Name: claimDir, Listed: true, Cgroup: true}},
			{at: time.Hour + 2*grace, dir: Dir{Name: claimDir}, unknown: true, dead: true},
		}},
		{"a directory that went and came back starts over", []step{
			{at: 0},
			{at: grace - time.Second, dir: Dir{Name: "other"}},
			{at: grace},
			{at: 2 * grace, dead: true},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &Collector{Grace: grace}
			for i, s := range tt.steps {
				d := s.dir
				if d.Name == "" {
					d.Name = alloc
				}
				if d.Modified.IsZero() {
					d.Modified = t0
				}
				asked := false
				got := c.Dead(t0.Add(s.at), []Dir{d}, !s.unknown, func(names []string) map[string]bool {
					asked = true
					return map[string]bool{d.Name: s.inUse}
				})
				if want := map[bool][]string{true: {d.Name}}[s.dead]; fmt.Sprint(got) != fmt.Sprint(want) {
					t.Errorf("step %d (at %v): Dead = %v, want %v", i, s.at, got, want)
				}
				if s.inUse && !asked {
					t.Errorf("step %d: a directory in use was not asked about", i)
				}
			}
		})
	}
}
