package controlblock

import "testing"

// A limits file's quota wins over the environment's claim, whatever either
// says; without a file the claim holds, and without either there is none.
func TestMemoryLimitsPrecedence(t *testing.T) {
	var fileQuota, claimed [MaxDevices]uint64
	fileQuota[0], claimed[0], claimed[1] = 2<<30, 6<<30, 1<<30
	file := &LimitsConfig{MemLimit: fileQuota}
	claim := &UsageSnapshot{ClaimMemLimit: claimed, ClaimMemorySet: true}
	unclaimed := &UsageSnapshot{ClaimMemLimit: claimed}
	for _, tt := range []struct {
		name   string
		limits *LimitsConfig
		u      *UsageSnapshot
		want   [MaxDevices]uint64
		ok     bool
	}{
		{"file over claim", file, claim, fileQuota, true},
		{"an empty file over a claim: no quota is its word", &LimitsConfig{}, claim, [MaxDevices]uint64{}, true},
		{"claim without a file", nil, claim, claimed, true},
		{"a claim not set is none", nil, unclaimed, [MaxDevices]uint64{}, false},
		{"nothing", nil, nil, [MaxDevices]uint64{}, false},
	} {
		got, ok := MemoryLimits(tt.limits, tt.u)
		if got != tt.want || ok != tt.ok {
			t.Errorf("%s: MemoryLimits = %v, %v; want %v, %v", tt.name, got[:2], ok, tt.want[:2], tt.ok)
		}
	}
}
