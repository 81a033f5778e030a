package probes

import (
	"os"
	"os/exec"
	"testing"

	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

// Another process's programs, read through its descriptors, count what the
// programs' own handles count; a process holding none is an error.
func TestProcessProgramStats(t *testing.T) {
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
	before, err := ProcessProgramStats(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	const allocs = 20
	for i := 0; i < allocs; i++ {
		prog.Do(t, "alloc linear 4096")
	}
	after, err := ProcessProgramStats(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	own, err := p.ProgramStats()
	if err != nil {
		t.Fatal(err)
	}
	for name := range own {
		if _, ok := after[name]; !ok {
			t.Errorf("program %s was not found through the process's descriptors", name)
		}
	}
	if runs := after["mem_alloc"].RunCount - before["mem_alloc"].RunCount; runs < allocs {
		t.Errorf("mem_alloc: %d runs over %d allocations", runs, allocs)
	}
	if after["mem_alloc_managed"] != own["mem_alloc_managed"] {
		t.Errorf("mem_alloc_managed (a name the kernel truncates): %+v through descriptors, %+v through its handle",
			after["mem_alloc_managed"], own["mem_alloc_managed"])
	}

	sleep := exec.Command("sleep", "30")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { sleep.Process.Kill(); sleep.Wait() }()
	if got, err := ProcessProgramStats(sleep.Process.Pid); err == nil {
		t.Errorf("a process with no eBPF programs: %v, want an error", got)
	}
}
