package membership

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/gpuwarden/gpuwarden/enforcer/agentapi"
	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
	"github.com/gpuwarden/gpuwarden/enforcer/scheduler"
	"github.com/gpuwarden/gpuwarden/enforcer/settings"
	"github.com/gpuwarden/gpuwarden/enforcer/vocab"
)

var (
	// ErrNoContainer: no container of that name runs under the enforcer.
	ErrNoContainer = errors.New("no such container under the enforcer")
	// ErrNoGPU: the node has no GPU of that name.
	ErrNoGPU = errors.New("no such GPU")
	// ErrBadChange: a change asks for what cannot be.
	ErrBadChange = errors.New("bad change")
	// ErrSlots: the device plugin refuses a GPU's new max_inst.
	ErrSlots = errors.New("device plugin refuses")
)

// kindError is an error of one of the kinds above, read as its own message.
type kindError struct{ kind, err error }

func (k kindError) Error() string   { return k.err.Error() }
func (k kindError) Unwrap() []error { return []error{k.kind, k.err} }

// gpuInfo is a GPU's scheduling state, with its NVML index among the
// node's GPUs.
func gpuInfo(st scheduler.GPUStatus, node []string) agentapi.GPUInfo {
	return agentapi.GPUInfo{Index: slices.Index(node, st.UUID), UUID: st.UUID, Policy: st.Policy.String(), PolicySet: st.PolicySet, MaxInst: st.MaxInst,
		FreeWeight: st.FreeWeight, Containers: st.Containers, Slices: agentapi.SliceCounts(st.Slices)}
}

// GPUs is every GPU with containers or settings.
func (e *Members) GPUs() []agentapi.GPUInfo {
	node, _ := e.NodeGPUs()
	out := []agentapi.GPUInfo{}
	for _, st := range e.s.GPUs() {
		out = append(out, gpuInfo(st, node))
	}
	return out
}

// GPU is one GPU's scheduling state.
func (e *Members) GPU(uuid string) agentapi.GPUInfo {
	node, _ := e.NodeGPUs()
	return gpuInfo(e.s.GPU(uuid), node)
}

// inForce reports the scheduler's targets for every container on the GPUs.
func (e *Members) inForce(gpus ...string) []agentapi.InForce {
	var out []agentapi.InForce
	for _, st := range e.s.Status() {
		if slices.Contains(gpus, st.GPU) {
			out = append(out, agentapi.InForce{Container: st.Key, GPU: st.GPU, Policy: st.Policy.String(), Target: st.Target})
		}
	}
	return out
}

// Find resolves a container name (its control-block directory, cgroup path
// or namespace/pod/container) to the directory of the container it names.
func (e *Members) Find(name string) (string, error) {
	m, err := e.find(name)
	if err != nil {
		return "", err
	}
	return m.dir, nil
}

func (e *Members) find(name string) (*member, error) {
	if m := e.byName(name); m != nil {
		return m, nil
	}
	// Asked without e.mu: the collector's view asks membership for its
	// targets.
	if strings.Count(name, "/") == 2 && !strings.HasPrefix(name, "/") && e.cfg.PodContainer != nil {
		if cg, ok := e.cfg.PodContainer(name); ok {
			if m := e.memberOf(cg); m != nil {
				return m, nil
			}
		}
	}
	return nil, kindError{ErrNoContainer, fmt.Errorf("no container %s runs under the enforcer (name it by control-block directory, cgroup path or namespace/pod/container)",
		agentapi.Quote(name))}
}

// byName finds a member by its directory or cgroup path.
func (e *Members) byName(name string) *member {
	e.mu.Lock()
	defer e.mu.Unlock()
	if m := e.members[name]; m != nil {
		return m
	}
	for _, m := range e.members {
		if m.path == name || controlblock.ContainerKey(name) == m.dir {
			return m
		}
	}
	return nil
}

// ChangeContainer validates a change whole, then makes it: nothing changes
// when any part is bad.
func (e *Members) ChangeContainer(name string, ch agentapi.ContainerChange) (agentapi.ChangeResult, error) {
	m, err := e.find(name)
	if err != nil {
		return agentapi.ChangeResult{}, err
	}
	res := agentapi.ChangeResult{Container: m.dir}
	cur := e.current(m.dir)
	next := cur
	if ch.Weight != nil {
		if err := vocab.CheckWeight(*ch.Weight); err != nil {
			return res, err
		}
		next.Weight = *ch.Weight
	}
	if ch.ComputeLimit != nil {
		// 0 lifts the cap: asked for by name, never by a bad value.
		if err := vocab.CheckCapPercent(*ch.ComputeLimit); err != nil && *ch.ComputeLimit != 0 {
			return res, fmt.Errorf("%w, or 0 for none", err)
		}
		next.CapPercent = *ch.ComputeLimit
	}
	if ch.Priority != nil {
		var err error
		if next.High, err = vocab.ParsePriority(*ch.Priority); err != nil {
			return res, err
		}
	}
	var mem [controlblock.MaxDevices]uint64
	if ch.MemoryLimit != nil {
		list, err := vocab.ParseMemoryList(*ch.MemoryLimit, controlblock.MaxDevices)
		if err != nil {
			return res, fmt.Errorf("memoryLimit: %w", err)
		}
		copy(mem[:], list)
		for _, d := range m.devices {
			if held := m.usage.Reserved(d.Ordinal); mem[d.Ordinal] > 0 && held > mem[d.Ordinal] {
				res.Warnings = append(res.Warnings, fmt.Sprintf("GPU %s: the container already holds %d MiB, over the new limit of %d MiB; "+
					"it keeps what it has, and new allocations fail until it is under", d.UUID, held>>20, mem[d.Ordinal]>>20))
			}
		}
	}
	if ch.Weight != nil || ch.ComputeLimit != nil || ch.Priority != nil {
		if err := e.s.SetContainer(m.dir, next); err != nil {
			return res, err
		}
		e.mu.Lock()
		m.applied = next
		e.mu.Unlock()
	}
	if ch.MemoryLimit != nil {
		m.limits.Update(func(c *controlblock.LimitsConfig) { c.MemLimit = mem })
	}
	err = e.cfg.Settings.Update(func(s *settings.Store) {
		sc := s.Containers[m.dir]
		if ch.Weight != nil || ch.ComputeLimit != nil || ch.Priority != nil {
			sc.Compute = &next
		}
		if ch.MemoryLimit != nil {
			sc.Memory = &mem
		}
		s.Containers[m.dir] = sc
	})
	var gpus []string
	for _, d := range m.devices {
		gpus = append(gpus, d.UUID)
	}
	res.InForce = e.inForce(gpus...)
	return res, err
}

// current is the container's compute settings in force.
func (e *Members) current(dir string) scheduler.Settings {
	for _, st := range e.s.Status() {
		if st.Key == dir {
			return scheduler.Settings{Weight: st.Weight, CapPercent: st.CapPercent, High: st.High}
		}
	}
	return scheduler.Settings{}
}

// ResolveGPU reads a GPU's name, NVML's index or a UUID, as the GPU's UUID;
// ErrNoGPU for a GPU the node does not have. Without NVML only a UUID
// names a GPU.
func (e *Members) ResolveGPU(arg string) (string, error) {
	node, err := e.NodeGPUs()
	if err != nil {
		return "", fmt.Errorf("the node's GPUs: %w", err)
	}
	if i, err := strconv.Atoi(arg); err == nil && i >= 0 && i < len(node) {
		return node[i], nil
	}
	if strings.HasPrefix(arg, "GPU-") && len(arg) <= 64 && (node == nil || slices.Contains(node, arg)) {
		return arg, nil
	}
	return "", kindError{ErrNoGPU, errors.New("no GPU " + agentapi.Quote(arg))}
}

// ChangeGPU sets a GPU's policy or max_inst; a new max_inst goes to the
// device plugin first, which may refuse it (ErrSlots), then to the
// scheduler.
func (e *Members) ChangeGPU(ctx context.Context, uuid string, ch agentapi.GPUChange) (agentapi.ChangeResult, error) {
	node, _ := e.NodeGPUs()
	g := e.cfg.Settings.GPU(uuid)
	if ch.Policy != nil {
		p, err := vocab.ParsePolicy(*ch.Policy)
		if err != nil {
			return agentapi.ChangeResult{}, kindError{ErrBadChange, err}
		}
		g.Policy, g.PolicySet = p, true
	}
	if ch.MaxInst != nil {
		g.MaxInst = *ch.MaxInst
		if err := vocab.CheckMaxInst(g.MaxInst); err != nil {
			return agentapi.ChangeResult{}, kindError{ErrBadChange, err}
		}
		if err := e.setSlots(ctx, slices.Index(node, uuid), g.MaxInst); err != nil {
			return agentapi.ChangeResult{}, kindError{ErrSlots, fmt.Errorf("device plugin: %w", err)}
		}
	}
	if err := e.s.SetGPU(uuid, g); err != nil {
		return agentapi.ChangeResult{}, kindError{ErrBadChange, err}
	}
	if err := e.cfg.Settings.Update(func(s *settings.Store) {
		s.GPUs[uuid] = settings.GPU{Policy: g.Policy, PolicySet: g.PolicySet, MaxInst: g.MaxInst}
		delete(s.GPUs, strconv.Itoa(slices.Index(node, uuid))) // its entry by index, from an older file
	}); err != nil {
		return agentapi.ChangeResult{}, err
	}
	info := gpuInfo(e.s.GPU(uuid), node)
	return agentapi.ChangeResult{InForce: e.inForce(uuid), GPU: &info}, nil
}
