package controlblock

import (
	"fmt"
	"slices"
)

// UUIDString spells a CUDA UUID as NVML does: "GPU-" and 32 hex digits in
// groups of 8-4-4-4-12.
func UUIDString(b [16]byte) string {
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// GPUs maps each CUDA ordinal of the ledger to its GPU's UUID, as NVML
// spells it. Ordinals are the container's own (CUDA_VISIBLE_DEVICES
// renumbers them from 0), so a GPU outside the container is known only by
// the UUID the interposer records for each ordinal. node lists the node's
// GPUs by UUID (nil: not known, every recorded UUID is taken as it is).
//
// An ordinal with no recorded UUID (zero: an old interposer, or none
// recorded yet), or one that names no GPU of the node, maps to "": it is
// not guessed to be GPU 0. Only on a node with exactly one GPU can ordinal
// 0 be nothing but that GPU.
func (s *UsageSnapshot) GPUs(node []string) [MaxDevices]string {
	var out [MaxDevices]string
	for d := 0; d < MaxDevices; d++ {
		if s.DevUUID[d] == ([16]byte{}) {
			if d == 0 && len(node) == 1 {
				out[d] = node[0]
			}
			continue
		}
		u := UUIDString(s.DevUUID[d])
		if node == nil || slices.Contains(node, u) {
			out[d] = u
		}
	}
	return out
}
