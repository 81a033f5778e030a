package probes

import (
	"testing"

	"github.com/gpuwarden/gpuwarden/bpf/internal/bpftest"
	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

// attachedToSimgpu loads the probes (maps pinned in pinDir; "": none) and
// attaches them to simgpu's libcuda until the test ends.
func attachedToSimgpu(t *testing.T, pinDir string) (*Probes, *Library) {
	t.Helper()
	p, err := Open(pinDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	lib, err := p.Attach(simtest.Bin(t, "simgpu/libcuda.so.1"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lib.Detach() }) // before the probes close
	return p, lib
}

// Loading, attaching to simgpu's libcuda and counting one allocation, without
// the observer around it.
func TestLoadAttachCount(t *testing.T) {
	p, lib := attachedToSimgpu(t, bpftest.PinDir(t))
	if len(lib.Missing) > 0 {
		t.Errorf("simgpu's libcuda lacks %v", lib.Missing)
	}
	cg := simtest.NewCgroup(t, "probes")
	m := simtest.NewMachine(t, 2, "4Gi")
	prog := simtest.StartAllocProg(t, cg.Place(m.Command(simtest.Bin(t, "bpf/cuda-alloc"))))
	prog.Do(t, "ctx 1")
	prog.Do(t, "alloc linear 12345")
	u, err := p.Usage()
	if err != nil {
		t.Fatal(err)
	}
	got := u[Key{cg.ID, 1}]
	if got.Bytes != 12345 || got.Allocs != 1 || got.CtxCreated != 1 {
		t.Errorf("usage of cgroup %d device 1 = %+v, want 12345 bytes in 1 alloc, 1 context; all: %+v", cg.ID, got, u)
	}
	prog.Quit(t)
	u, _ = p.Usage()
	if got := u[Key{cg.ID, 1}]; got.Bytes != 0 || got.ExitFreedBytes != 12345 || got.CtxDestroyed != 1 {
		t.Errorf("after exit: %+v, want 0 bytes, 12345 given back at exit, 1 context gone", got)
	}
	// The dead process's pointer entry goes with the garbage.
	if n, err := p.CollectGarbage(); err != nil || n < 1 {
		t.Errorf("CollectGarbage = %d, %v; want >= 1 entry removed", n, err)
	}
}

// The run-time statistics count each program's runs: the allocation
// programs ran at least once for each allocation made while they were on.
func TestStatsCountAllocations(t *testing.T) {
	simtest.RequirePrivileged(t, "eBPF")
	stats, err := EnableStats()
	if err != nil {
		t.Fatal(err)
	}
	defer stats.Close()
	p, _ := attachedToSimgpu(t, "")
	m := simtest.NewMachine(t, 1, "4Gi")
	prog := simtest.StartAllocProg(t, m.Command(simtest.Bin(t, "bpf/cuda-alloc")))
	defer prog.Quit(t)
	prog.Do(t, "ctx 0")
	before, err := p.ProgramStats()
	if err != nil {
		t.Fatal(err)
	}
	const allocs = 20
	for i := 0; i < allocs; i++ {
		prog.Do(t, "alloc linear 4096")
	}
	after, err := p.ProgramStats()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"mem_alloc", "mem_alloc_ret"} {
		runs := after[name].RunCount - before[name].RunCount
		took := after[name].Runtime - before[name].Runtime
		if runs < allocs || took <= 0 {
			t.Errorf("%s: %d runs in %v over %d allocations; want >= %d runs and some run time", name, runs, took, allocs, allocs)
		}
	}
	if n := after["launch"].RunCount - before["launch"].RunCount; n != 0 {
		t.Errorf("launch ran %d times with no launch probe attached", n)
	}
}
