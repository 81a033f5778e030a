package controlblock

import "testing"

func TestUUIDString(t *testing.T) {
	b := [16]byte{0x5a, 0x4b, 0x78, 0x69, 0x1e, 0x0f, 0x3c, 0x2d, 0xd2, 0xc3, 0xf0, 0xe1, 0x96, 0x87, 0xb4, 0x00}
	if got, want := UUIDString(b), "GPU-5a4b7869-1e0f-3c2d-d2c3-f0e19687b400"; got != want {
		t.Fatalf("UUIDString = %s, want %s", got, want)
	}
}

func TestGPUs(t *testing.T) {
	a, b := [16]byte{1, 15: 0xaa}, [16]byte{2, 15: 0xbb}
	ua, ub := UUIDString(a), UUIDString(b)
	other := "GPU-00000000-0000-0000-0000-0000000000ff"
	for _, tc := range []struct {
		name string
		uuid [MaxDevices][16]byte
		node []string
		want [3]string // ordinals 0-2
	}{
		{"renumbered: ordinal 0 is the node's second GPU", [MaxDevices][16]byte{b}, []string{ua, ub}, [3]string{ub}},
		{"two GPUs", [MaxDevices][16]byte{b, a}, []string{ua, ub}, [3]string{ub, ua}},
		{"no recorded UUID on a node of two: unknown, not GPU 0", [MaxDevices][16]byte{}, []string{ua, ub}, [3]string{}},
		{"no recorded UUID on a node of one: that GPU", [MaxDevices][16]byte{}, []string{ub}, [3]string{ub}},
		{"a UUID not on the node: unknown", [MaxDevices][16]byte{a}, []string{other, ub}, [3]string{}},
		{"node not known: as recorded", [MaxDevices][16]byte{a, {}, b}, nil, [3]string{ua, "", ub}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &UsageSnapshot{DevUUID: tc.uuid}
			got := s.GPUs(tc.node)
			if [3]string(got[:3]) != tc.want {
				t.Fatalf("GPUs = %q, want %q", got[:3], tc.want)
			}
			for d := 3; d < MaxDevices; d++ {
				if got[d] != "" {
					t.Fatalf("ordinal %d = %q, want none", d, got[d])
				}
			}
		})
	}
}
