// Package allocation holds every decision about GPU shares that does not
// depend on how they are requested: the resources and their device ids,
// which GPU an id belongs to, which ids to prefer, the control directory of
// an allocation and what a container gets. The kubelet device plugin
// (deploy/deviceplugin) and the DRA driver (deploy/dra) call the same
// functions, so both hand out shares the same way.
package allocation

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// The extended resources.
const (
	// ResourceGPU is a slot on one GPU: each GPU has MaxInst of them.
	ResourceGPU = "gpuwarden.io/gpu"
	// ResourceMemory is one GiB of one GPU's memory.
	ResourceMemory = "gpuwarden.io/gpu-memory"
	// ResourceRemote is a slot on one GPU of a remote GPU server, for a
	// node without GPUs: each server GPU has MaxInst of them.
	ResourceRemote = "gpuwarden.io/remote-gpu"
)

// Kind says which resource a device id is of.
type Kind int

const (
	Slot   Kind = iota // a device of ResourceGPU
	Memory             // a device of ResourceMemory
	Remote             // a device of ResourceRemote
)

// Resource is the extended resource name of a kind.
func (k Kind) Resource() string {
	switch k {
	case Memory:
		return ResourceMemory
	case Remote:
		return ResourceRemote
	}
	return ResourceGPU
}

func (k Kind) String() string {
	switch k {
	case Memory:
		return "mem"
	case Remote:
		return "remote"
	}
	return "slot"
}

// GiB is the size of one ResourceMemory device.
const GiB = 1 << 30

// GPU is one physical GPU as allocation sees it.
type GPU struct {
	UUID        string // NVML's "GPU-..." UUID
	Index       int    // NVML index; the device node is /dev/nvidia<Index>
	MemoryBytes uint64
	MaxInst     int // its slots: the enforcer's max_inst (vocab.CheckMaxInst)
}

// ID is a parsed device id: "<uuid>::slot-<n>", "<uuid>::mem-<n>" or
// "<uuid>::remote-<n>" (the UUID of a remote server's GPU).
type ID struct {
	UUID string
	Kind Kind
	N    int
}

const sep = "::"

func (id ID) String() string { return fmt.Sprintf("%s%s%s-%d", id.UUID, sep, id.Kind, id.N) }

// ParseID parses a device id this package made.
func ParseID(s string) (ID, error) {
	i := strings.LastIndex(s, sep)
	if i <= 0 {
		return ID{}, fmt.Errorf("device id %q: want <gpu uuid>::slot-<n> or <gpu uuid>::mem-<n>", s)
	}
	uuid, rest := s[:i], s[i+len(sep):]
	kind, num, ok := strings.Cut(rest, "-")
	n, err := strconv.Atoi(num)
	if !ok || err != nil || n < 0 || strconv.Itoa(n) != num {
		return ID{}, fmt.Errorf("device id %q: bad number %q", s, num)
	}
	switch kind {
	case "slot":
		return ID{uuid, Slot, n}, nil
	case "mem":
		return ID{uuid, Memory, n}, nil
	case "remote":
		return ID{uuid, Remote, n}, nil
	}
	return ID{}, fmt.Errorf("device id %q: unknown kind %q", s, kind)
}

// Count is how many devices of a kind one GPU has: MaxInst slots (local or
// remote), or one per whole GiB of its memory.
func Count(g GPU, k Kind) int {
	if k == Memory {
		return int(g.MemoryBytes / GiB)
	}
	return g.MaxInst
}

// IDs lists a GPU's device ids of one kind.
func IDs(g GPU, k Kind) []string {
	n := Count(g, k)
	out := make([]string, n)
	for i := range out {
		out[i] = ID{g.UUID, k, i}.String()
	}
	return out
}

// ErrSpansGPUs says that the ids of one request are on more than one GPU.
var ErrSpansGPUs = errors.New("devices on more than one GPU")

// OneGPU returns the GPU and kind that every id belongs to. Ids of two GPUs
// (the memory of one request must land on one GPU) or of two kinds are an
// error, and so is an empty list or a repeated id.
func OneGPU(ids []string) (uuid string, kind Kind, err error) {
	if len(ids) == 0 {
		return "", 0, errors.New("no devices")
	}
	seen := map[string]bool{}
	for i, s := range ids {
		id, err := ParseID(s)
		if err != nil {
			return "", 0, err
		}
		if seen[s] {
			return "", 0, fmt.Errorf("device id %q twice", s)
		}
		seen[s] = true
		if i == 0 {
			uuid, kind = id.UUID, id.Kind
			continue
		}
		if id.Kind != kind {
			return "", 0, fmt.Errorf("devices of two resources: %s and %s", ids[0], s)
		}
		if id.UUID != uuid {
			return "", 0, fmt.Errorf("%w: %s and %s", ErrSpansGPUs, uuid, id.UUID)
		}
	}
	return uuid, kind, nil
}

// Preferred picks size ids out of available, all on one GPU, keeping every
// id of mustInclude (which must then all be on that GPU). Among the GPUs
// that can hold the request it takes the one with the fewest available ids
// (best fit), so whole GPUs stay free for large requests; ties go to the
// lower UUID. Within a GPU it takes the lowest numbers. It fails when no
// single GPU has size available ids.
func Preferred(available, mustInclude []string, size int) ([]string, error) {
	if size <= 0 {
		return nil, fmt.Errorf("allocation size %d", size)
	}
	byGPU := map[string][]ID{}
	for _, s := range available {
		id, err := ParseID(s)
		if err != nil {
			return nil, err
		}
		byGPU[id.UUID] = append(byGPU[id.UUID], id)
	}
	must := map[string]bool{}
	want := ""
	for _, s := range mustInclude {
		id, err := ParseID(s)
		if err != nil {
			return nil, err
		}
		if want != "" && id.UUID != want {
			return nil, fmt.Errorf("%w: the kubelet requires %s and %s", ErrSpansGPUs, want, id.UUID)
		}
		want = id.UUID
		must[s] = true
	}
	if len(must) > size {
		return nil, fmt.Errorf("%d required devices, more than the %d asked", len(must), size)
	}
	var gpus []string
	for uuid, ids := range byGPU {
		if len(ids) >= size && (want == "" || uuid == want) {
			gpus = append(gpus, uuid)
		}
	}
	if len(gpus) == 0 {
		return nil, fmt.Errorf("no GPU has %d free devices of this resource", size)
	}
	sort.Slice(gpus, func(i, j int) bool {
		a, b := len(byGPU[gpus[i]]), len(byGPU[gpus[j]])
		return a < b || a == b && gpus[i] < gpus[j]
	})
	ids := byGPU[gpus[0]]
	sort.Slice(ids, func(i, j int) bool {
		mi, mj := must[ids[i].String()], must[ids[j].String()]
		return mi && !mj || mi == mj && ids[i].N < ids[j].N
	})
	out := make([]string, size)
	for i := range out {
		out[i] = ids[i].String()
	}
	for s := range must {
		if !slices.Contains(out, s) {
			return nil, fmt.Errorf("required device %s is not available", s)
		}
	}
	return out, nil
}
