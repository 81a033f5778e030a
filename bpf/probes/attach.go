package probes

import (
	"debug/elf"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// A probe is one driver entry point: the program (by its C name) run at its
// entry and, for calls whose result matters, the one run at its return.
type probe struct {
	symbol string
	entry  string
	ret    string // "": entry only
}

// memoryProbes stay attached for as long as the library is: allocations,
// frees, memory pools and contexts (which tell the device of a call).
var memoryProbes = []probe{
	{"cuMemAlloc_v2", "mem_alloc", "mem_alloc_ret"},
	{"cuMemAllocPitch_v2", "mem_alloc_pitch", "mem_alloc_ret"},
	{"cuMemAllocManaged", "mem_alloc_managed", "mem_alloc_ret"},
	{"cuMemAllocAsync", "mem_alloc_async", "mem_alloc_ret"},
	{"cuMemAllocAsync_ptsz", "mem_alloc_async", "mem_alloc_ret"},
	{"cuMemAllocFromPoolAsync", "mem_alloc_pool", "mem_alloc_ret"},
	{"cuMemAllocFromPoolAsync_ptsz", "mem_alloc_pool", "mem_alloc_ret"},
	{"cuMemCreate", "mem_create", "mem_alloc_ret"},
	{"cuMemFree_v2", "mem_free", "mem_free_ret"},
	{"cuMemFreeAsync", "mem_free", "mem_free_ret"},
	{"cuMemFreeAsync_ptsz", "mem_free", "mem_free_ret"},
	{"cuMemRelease", "mem_release", "mem_free_ret"},
	{"cuDeviceGetDefaultMemPool", "pool_default", "pool_ret"},
	{"cuMemPoolCreate", "pool_create", "pool_ret"},
	{"cuDevicePrimaryCtxRetain", "ctx_retain", "ctx_new_ret"},
	{"cuMemPoolDestroy", "pool_destroy", ""},
	{"cuCtxCreate_v2", "ctx_create", "ctx_new_ret"},
	{"cuCtxCreate_v3", "ctx_create_v3", "ctx_new_ret"},
	{"cuCtxCreate_v4", "ctx_create_v4", "ctx_new_ret"},
	{"cuDevicePrimaryCtxRelease_v2", "ctx_release", "ctx_gone_ret"},
	{"cuCtxDestroy_v2", "ctx_destroy", "ctx_gone_ret"},
	{"cuCtxSetCurrent", "ctx_set_current", ""},
	{"cuCtxPushCurrent_v2", "ctx_push", ""},
	{"cuCtxPopCurrent_v2", "ctx_pop", ""},
}

// program returns a loaded program by its C name.
func (p *Probes) program(name string) *ebpf.Program {
	v := reflect.ValueOf(&p.objs.gpuwardenPrograms).Elem()
	for i := 0; i < v.NumField(); i++ {
		if v.Type().Field(i).Tag.Get("ebpf") == name {
			return v.Field(i).Interface().(*ebpf.Program)
		}
	}
	panic("probes: no program " + name) // the table and the C file disagree
}

// LaunchSymbols are the launch entry points the launch probe counts.
var LaunchSymbols = []string{
	"cuLaunchKernel", "cuLaunchKernel_ptsz", "cuLaunchKernelEx", "cuLaunchKernelEx_ptsz",
	"cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel_ptsz", "cuGraphLaunch", "cuGraphLaunch_ptsz",
}

// Library is one libcuda file with the probes attached to it. Its methods
// are safe for concurrent use.
type Library struct {
	Path    string   // the path it was opened by
	Missing []string // entry points the file does not export
	exe     *link.Executable

	mu     sync.Mutex
	closed bool
	memory []link.Link
	launch []link.Link
	// exported is which LaunchSymbols the file defines (nil: not read yet).
	exported []string
}

// Attach opens the library at path and attaches the memory and context
// probes to it. It fails when the file exports none of the entry points.
func (p *Probes) Attach(path string) (*Library, error) {
	exe, err := link.OpenExecutable(path)
	if err != nil {
		return nil, fmt.Errorf("open library %s: %w", path, err)
	}
	lib := &Library{Path: path, exe: exe}
	for _, pr := range memoryProbes {
		if pr.ret != "" {
			l, err := exe.Uretprobe(pr.symbol, p.program(pr.ret), nil)
			if errors.Is(err, link.ErrNoSymbol) {
				lib.Missing = append(lib.Missing, pr.symbol)
				continue
			}
			if err != nil {
				lib.Detach()
				return nil, fmt.Errorf("attach uretprobe %s to %s: %w", pr.symbol, path, explainAttach(err))
			}
			lib.memory = append(lib.memory, l)
		}
		l, err := exe.Uprobe(pr.symbol, p.program(pr.entry), nil)
		if errors.Is(err, link.ErrNoSymbol) {
			if pr.ret == "" {
				lib.Missing = append(lib.Missing, pr.symbol)
			}
			continue
		}
		if err != nil {
			lib.Detach()
			return nil, fmt.Errorf("attach uprobe %s to %s: %w", pr.symbol, path, explainAttach(err))
		}
		lib.memory = append(lib.memory, l)
	}
	if len(lib.memory) == 0 {
		return nil, fmt.Errorf("attach to %s: it exports none of libcuda's allocation entry points", path)
	}
	return lib, nil
}

// closeAll closes links side by side: the kernel takes each breakpoint out at
// once but then waits (tens to hundreds of milliseconds) for handlers in
// flight, and one after another would add those waits up.
func closeAll(links []link.Link) {
	var wg sync.WaitGroup
	for _, l := range links {
		wg.Go(func() { l.Close() })
	}
	wg.Wait()
}

// AttachLaunch attaches the launch probe to every launch entry point of the
// library (each hit costs a trap into the kernel: see DetachLaunch).
func (p *Probes) AttachLaunch(lib *Library) error {
	lib.mu.Lock()
	defer lib.mu.Unlock()
	if lib.closed || len(lib.launch) > 0 {
		return nil
	}
	for _, sym := range LaunchSymbols {
		l, err := lib.exe.Uprobe(sym, p.objs.Launch, nil)
		if errors.Is(err, link.ErrNoSymbol) {
			continue
		}
		if err != nil {
			closeAll(lib.launch)
			lib.launch = nil
			return fmt.Errorf("attach uprobe %s to %s: %w", sym, lib.Path, explainAttach(err))
		}
		lib.launch = append(lib.launch, l)
	}
	return nil
}

// DetachLaunch removes the launch probes; launches go uncounted until the
// next AttachLaunch.
func (lib *Library) DetachLaunch() {
	lib.mu.Lock()
	defer lib.mu.Unlock()
	closeAll(lib.launch)
	lib.launch = nil
}

// LaunchAttached tells whether the launch probes are attached.
func (lib *Library) LaunchAttached() bool {
	lib.mu.Lock()
	defer lib.mu.Unlock()
	return len(lib.launch) > 0
}

// Detach removes every probe from the library; it cannot be attached again.
func (lib *Library) Detach() {
	lib.mu.Lock()
	defer lib.mu.Unlock()
	lib.closed = true
	closeAll(append(lib.launch, lib.memory...))
	lib.launch, lib.memory = nil, nil
}

// ExactLaunches says whether launches can be counted process by process
// (AttachExact): the kernel has uprobe-multi links (Linux 6.6).
func (p *Probes) ExactLaunches() bool { return p.exact }

// AttachExact attaches the exact launch probe to every launch entry point
// of the library, for process pid (as the caller's pid namespace numbers
// it) alone: one uprobe-multi link whose pid filter keeps the breakpoints
// out of every other process, so only pid pays the traps. Mark the process
// (MarkExact) so the sampling probe leaves its launches to this one.
func (p *Probes) AttachExact(lib *Library, pid int) (link.Link, error) {
	if !p.exact {
		return nil, fmt.Errorf("count launches of process %d: uprobe-multi links need Linux 6.6: %w", pid, ErrKernel)
	}
	syms, err := lib.launchSymbols()
	if err != nil {
		return nil, err
	}
	if len(syms) == 0 {
		return nil, fmt.Errorf("count launches in %s: it exports none of the launch entry points", lib.Path)
	}
	l, err := lib.exe.UprobeMulti(syms, p.objs.LaunchExact, &link.UprobeMultiOptions{PID: uint32(pid)})
	if err != nil {
		return nil, fmt.Errorf("attach launch probe for process %d to %s: %w", pid, lib.Path, explainAttach(err))
	}
	return l, nil
}

// MarkExact tells the sampling launch probe to leave process tgid (host
// pid) alone (on) or to count it again (off).
func (p *Probes) MarkExact(tgid uint32, on bool) error {
	var err error
	if on {
		err = p.objs.ExactProcs.Put(tgid, uint8(1))
	} else if err = p.objs.ExactProcs.Delete(tgid); errors.Is(err, ebpf.ErrKeyNotExist) {
		err = nil
	}
	if err != nil {
		return fmt.Errorf("mark process %d counted exactly: %w", tgid, err)
	}
	return nil
}

// launchSymbols is which launch entry points the file exports, read once
// from its dynamic symbols (a uprobe-multi link wants every symbol found).
func (lib *Library) launchSymbols() ([]string, error) {
	lib.mu.Lock()
	defer lib.mu.Unlock()
	if lib.exported != nil {
		return lib.exported, nil
	}
	f, err := elf.Open(lib.Path)
	if err != nil {
		return nil, fmt.Errorf("read symbols of %s: %w", lib.Path, err)
	}
	defer f.Close()
	dyn, err := f.DynamicSymbols()
	if err != nil {
		return nil, fmt.Errorf("read symbols of %s: %w", lib.Path, err)
	}
	lib.exported = []string{}
	for _, s := range dyn {
		if s.Section != elf.SHN_UNDEF && elf.ST_TYPE(s.Info) == elf.STT_FUNC && slices.Contains(LaunchSymbols, s.Name) &&
			!slices.Contains(lib.exported, s.Name) {
			lib.exported = append(lib.exported, s.Name)
		}
	}
	return lib.exported, nil
}
