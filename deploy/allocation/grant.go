package allocation

import (
	"fmt"
	"hash/fnv"
	"sort"
	"strings"

	"github.com/gpuwarden/gpuwarden/enforcer/vocab"
)

// Where things appear inside a container.
const (
	// ContainerControlDir is GPUWARDEN_CONTROL_DIR in the container.
	ContainerControlDir = "/run/gpuwarden"
	// ContainerKey is the interposer's container key inside a cgroup
	// namespace (its cgroup path is "/"); the container's own control block
	// is mounted at ContainerControlDir/ContainerKey.
	ContainerKey = "root"
	// ContainerInterposer is where the interposer is mounted (read-only).
	ContainerInterposer = "/usr/local/gpuwarden/lib/libgpuwarden.so"
	// LdSoPreload is glibc's system-wide preload list.
	LdSoPreload = "/etc/ld.so.preload"
)

// Grant is what one container gets for one allocation: the GPU, how much of
// it, and the name of its control directory.
type Grant struct {
	GPU   GPU
	Kind  Kind
	Count int // devices of Kind allocated
	// MemoryLimitBytes is the container's quota on the GPU: Count GiB for
	// ResourceMemory; Count x (the GPU's memory / maxInst), in whole MiB,
	// for ResourceGPU and ResourceRemote.
	MemoryLimitBytes uint64
	// Weight is the compute weight: Count for slots, local or remote (k
	// slots are k shares of the GPU's time), 0 (not set, the interposer's
	// default 1) for memory.
	Weight uint32
	// CapPercent caps the container's compute share (percent of the GPU;
	// 0: no cap) and HighPriority lets it preempt normal containers: a DRA
	// claim's ShareConfig sets them.
	CapPercent   uint32
	HighPriority bool
	// Dir is the control directory's name under the control dir: DirName(ids).
	Dir string
}

// Decide turns the device ids the kubelet allocated to one container into a
// grant. gpu looks a GPU up by UUID. The ids must all be of one GPU and one
// resource: a request spanning GPUs is refused (ErrSpansGPUs), since its
// memory could not be enforced as one quota.
func Decide(ids []string, gpu func(uuid string) (GPU, bool)) (Grant, error) {
	uuid, kind, err := OneGPU(ids)
	if err != nil {
		return Grant{}, err
	}
	g, ok := gpu(uuid)
	if !ok {
		return Grant{}, fmt.Errorf("GPU %s is not on this node", uuid)
	}
	if err := vocab.CheckMaxInst(g.MaxInst); err != nil {
		return Grant{}, fmt.Errorf("GPU %s: %w", uuid, err)
	}
	n := Count(g, kind)
	for _, s := range ids {
		if id, _ := ParseID(s); id.N >= n {
			return Grant{}, fmt.Errorf("device %s: GPU %s has %d %s devices", s, uuid, n, kind)
		}
	}
	gr := Grant{GPU: g, Kind: kind, Count: len(ids), Dir: DirName(ids)}
	if kind == Memory {
		gr.MemoryLimitBytes = uint64(len(ids)) * GiB
	} else {
		gr.MemoryLimitBytes = uint64(len(ids)) * SlotMemory(g)
		gr.Weight = uint32(len(ids))
	}
	return gr, nil
}

// SlotMemory is one slot's memory quota: the GPU's memory / maxInst, in
// whole MiB.
func SlotMemory(g GPU) uint64 { return g.MemoryBytes / uint64(g.MaxInst) &^ (1<<20 - 1) }

// Resize checks that GPU g may have maxInst slots while the kubelet has
// assigned the slot ids inUse (of any GPU): its slots can grow, and shrink
// no further than the highest one assigned.
func Resize(g GPU, maxInst int, inUse []string) error {
	if err := vocab.CheckMaxInst(maxInst); err != nil {
		return err
	}
	need := 0
	for _, s := range inUse {
		if id, err := ParseID(s); err == nil && id.UUID == g.UUID && id.Kind == Slot {
			need = max(need, id.N+1)
		}
	}
	if maxInst < need {
		return fmt.Errorf("max_inst %d: GPU %d (%s) has slot %d assigned to a container; no fewer than %d slots "+
			"until it is released", maxInst, g.Index, g.UUID, need-1, need)
	}
	return nil
}

// DirName is the control directory of the allocation that holds ids: a
// function of the set of ids alone (their order does not matter), so the
// collector can find a container's control block from the ids the kubelet's
// pod-resources API reports for it. Form: "<kind>-<gpu uuid>-<16 hex
// digits of FNV-1a 64 over the sorted ids, one per line>", a valid key.
func DirName(ids []string) string {
	s := append([]string(nil), ids...)
	sort.Strings(s)
	h := fnv.New64a()
	for _, id := range s {
		h.Write([]byte(id))
		h.Write([]byte{'\n'})
	}
	prefix := "x"
	if len(s) > 0 {
		if id, err := ParseID(s[0]); err == nil {
			prefix = id.Kind.String() + "-" + sanitize(id.UUID)
		}
	}
	return fmt.Sprintf("%s-%016x", prefix, h.Sum64())
}

// sanitize keeps a UUID to [A-Za-z0-9-] and 64 bytes, so a name is always
// one safe path element.
func sanitize(s string) string {
	var b strings.Builder
	for i := 0; i < len(s) && b.Len() < 64; i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' {
			b.WriteByte(c)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}

// Env is the environment a container gets for a grant (the interposer's
// variables). The GPU is the container's only visible device, ordinal 0, so
// the memory limit is one value. withPreload adds LD_PRELOAD.
func (g Grant) Env(withPreload bool) map[string]string {
	env := map[string]string{
		"GPUWARDEN_CONTROL_DIR":  ContainerControlDir,
		"GPUWARDEN_MEMORY_LIMIT": vocab.FormatSize(g.MemoryLimitBytes),
		"NVIDIA_VISIBLE_DEVICES": g.GPU.UUID,
		"CUDA_VISIBLE_DEVICES":   g.GPU.UUID,
	}
	if g.Weight > 0 {
		env["GPUWARDEN_COMPUTE_WEIGHT"] = fmt.Sprint(g.Weight)
	}
	if g.CapPercent > 0 {
		env["GPUWARDEN_COMPUTE_LIMIT"] = fmt.Sprint(g.CapPercent)
	}
	if g.HighPriority {
		env["GPUWARDEN_PRIORITY"] = vocab.PriorityHigh
	}
	if withPreload {
		env["LD_PRELOAD"] = ContainerInterposer
	}
	return env
}

// ClaimCDIKind is the CDI kind of DRA claims' devices: "<kind>=<name>"
// names one, its name the claim device's ClaimDirName.
const ClaimCDIKind = "gpu.gpuwarden.io/claim"

// DirOf is the control directory of what the kubelet's pod-resources API
// lists for one container's request: a DRA claim device's CDI device id
// names it (ClaimCDIKind), a device plugin allocation's ids make it
// (DirName).
func DirOf(ids []string) string {
	if len(ids) == 1 {
		if name, ok := strings.CutPrefix(ids[0], ClaimCDIKind+"="); ok && IsClaimDirName(name) {
			return name
		}
	}
	return DirName(ids)
}

// ClaimDirName is the control directory of a DRA claim's device: a
// function of the claim's UID and the device's name alone, so the driver
// finds it again from the UID the kubelet unprepares, even after a restart.
// Form: "claim-<uid>-<device>", each part kept to safe characters.
func ClaimDirName(claimUID, device string) string {
	return "claim-" + sanitize(claimUID) + "-" + sanitize(device)
}
