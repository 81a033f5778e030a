package allocation

import (
	"errors"
	"strings"
	"testing"
)

const (
	gpuA = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
	gpuB = "GPU-bbbbbbbb-0000-0000-0000-000000000000"
)

func TestIDs(t *testing.T) {
	g := GPU{UUID: gpuA, MemoryBytes: 8<<30 + 512<<20, MaxInst: 4}
	if got := IDs(g, Slot); len(got) != 4 || got[3] != gpuA+"::slot-3" {
		t.Errorf("slots = %v", got)
	}
	if got := IDs(g, Memory); len(got) != 8 || got[7] != gpuA+"::mem-7" {
		t.Errorf("memory = %v (a partial GiB is not a device)", got)
	}
	for _, s := range []string{gpuA + "::slot-3", gpuA + "::mem-0", "a::b::mem-12"} {
		id, err := ParseID(s)
		if err != nil || id.String() != s {
			t.Errorf("ParseID(%q) = %v, %v", s, id, err)
		}
	}
	for _, s := range []string{"", "GPU-a", "::slot-1", gpuA + "::slot-", gpuA + "::slot-01", gpuA + "::slot--1",
		gpuA + "::disk-1", gpuA + "::slot1", gpuA + "::slot-+1"} {
		if _, err := ParseID(s); err == nil {
			t.Errorf("ParseID(%q) accepted", s)
		}
	}
}

func TestOneGPU(t *testing.T) {
	tests := []struct {
		ids  []string
		want string // error substring, "" for success
	}{
		{[]string{gpuA + "::mem-0", gpuA + "::mem-3"}, ""},
		{[]string{gpuA + "::mem-0", gpuB + "::mem-0"}, "more than one GPU"},
		{[]string{gpuA + "::mem-0", gpuA + "::slot-0"}, "two resources"},
		{[]string{gpuA + "::mem-0", gpuA + "::mem-0"}, "twice"},
		{nil, "no devices"},
		{[]string{"junk"}, "device id"},
	}
	for _, tt := range tests {
		_, _, err := OneGPU(tt.ids)
		if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("OneGPU(%v) = %v, want %q", tt.ids, err, tt.want)
		}
	}
}

func mem(uuid string, ns ...int) []string {
	var out []string
	for _, n := range ns {
		out = append(out, ID{uuid, Memory, n}.String())
	}
	return out
}

func TestPreferred(t *testing.T) {
	avail := append(mem(gpuA, 0, 1, 2, 3, 4, 5), mem(gpuB, 6, 2, 7)...)
	tests := []struct {
		name      string
		available []string
		must      []string
		size      int
		want      []string
		err       string
	}{
		{"best fit: the fuller GPU", avail, nil, 2, mem(gpuB, 2, 6), ""},
		{"only one GPU is big enough", avail, nil, 4, mem(gpuA, 0, 1, 2, 3), ""},
		{"must include decides the GPU", avail, mem(gpuA, 5), 2, mem(gpuA, 5, 0), ""},
		{"must include on two GPUs", avail, append(mem(gpuA, 5), mem(gpuB, 6)...), 2, nil, "more than one GPU"},
		{"no GPU big enough", avail, nil, 7, nil, "no GPU has 7"},
		{"must include too small", avail, mem(gpuB, 6), 4, nil, "no GPU has 4"},
		{"size zero", avail, nil, 0, nil, "size 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Preferred(tt.available, tt.must, tt.size)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("got %v, %v; want error %q", got, err, tt.err)
				}
				return
			}
			if err != nil || strings.Join(got, " ") != strings.Join(tt.want, " ") {
				t.Fatalf("got %v, %v; want %v", got, err, tt.want)
			}
		})
	}
}

func TestDecide(t *testing.T) {
	gpus := map[string]GPU{gpuA: {UUID: gpuA, Index: 0, MemoryBytes: 10 << 30, MaxInst: 3},
		gpuB: {UUID: gpuB, Index: 1, MemoryBytes: 16 << 30, MaxInst: 4}}
	look := func(u string) (GPU, bool) { g, ok := gpus[u]; return g, ok }

	g, err := Decide(mem(gpuB, 3, 1, 2), look)
	if err != nil || g.MemoryLimitBytes != 3<<30 || g.Weight != 0 || g.GPU.Index != 1 || g.Count != 3 {
		t.Fatalf("memory grant = %+v, %v", g, err)
	}
	if g.Dir != DirName(mem(gpuB, 1, 2, 3)) || !strings.HasPrefix(g.Dir, "mem-"+gpuB+"-") {
		t.Errorf("dir %q depends on order or lacks its prefix", g.Dir)
	}
	env := g.Env(true)
	if env["GPUWARDEN_MEMORY_LIMIT"] != "3Gi" || env["NVIDIA_VISIBLE_DEVICES"] != gpuB || env["LD_PRELOAD"] != ContainerInterposer ||
		env["GPUWARDEN_CONTROL_DIR"] != "/run/gpuwarden" {
		t.Errorf("env = %v", env)
	}
	if _, ok := g.Env(false)["LD_PRELOAD"]; ok {
		t.Error("LD_PRELOAD set without preload")
	}

	// 10 GiB / 3 slots = 3413.33 MiB: whole MiB, times 2 slots.
	g, err = Decide([]string{gpuA + "::slot-0", gpuA + "::slot-2"}, look)
	if err != nil || g.MemoryLimitBytes != 2*3413<<20 || g.Weight != 2 || g.Env(false)["GPUWARDEN_MEMORY_LIMIT"] != "6826Mi" ||
		g.Env(false)["GPUWARDEN_COMPUTE_WEIGHT"] != "2" {
		t.Fatalf("slot grant = %+v, %v", g, err)
	}

	for _, bad := range [][]string{
		append(mem(gpuA, 0), mem(gpuB, 0)...), // spans GPUs
		mem("GPU-gone", 0),                    // unknown GPU
		mem(gpuA, 10),                         // beyond its memory
		{gpuA + "::slot-3"},                   // beyond its MaxInst
	} {
		if g, err := Decide(bad, look); err == nil {
			t.Errorf("Decide(%v) = %+v, want an error", bad, g)
		}
	}
	if _, err := Decide(append(mem(gpuA, 0), mem(gpuB, 0)...), look); !errors.Is(err, ErrSpansGPUs) {
		t.Errorf("spanning GPUs: %v, want ErrSpansGPUs", err)
	}
	gpus[gpuA] = GPU{UUID: gpuA, MemoryBytes: 10 << 30}
	if g, err := Decide(mem(gpuA, 0), look); err == nil {
		t.Errorf("a GPU without max_inst: %+v, want an error", g)
	}
}

// TestResize: slots grow freely and shrink no further than the highest
// slot of the GPU the kubelet has assigned.
func TestResize(t *testing.T) {
	g := GPU{UUID: gpuA, Index: 2, MaxInst: 8}
	inUse := []string{gpuA + "::slot-5", gpuA + "::mem-9", gpuB + "::slot-7", "junk"}
	for n, ok := range map[int]bool{6: true, 8: true, 128: true, 5: false, 1: false, 0: false, 129: false} {
		if err := Resize(g, n, inUse); (err == nil) != ok {
			t.Errorf("Resize to %d with slot-5 assigned: %v, want ok %v", n, err, ok)
		}
	}
	if err := Resize(g, 5, inUse); err == nil || !strings.Contains(err.Error(), "slot 5") {
		t.Errorf("refusal %v does not name the assigned slot", err)
	}
	if err := Resize(g, 1, nil); err != nil {
		t.Errorf("nothing assigned: %v", err)
	}
}

func TestDirName(t *testing.T) {
	a, b := DirName(mem(gpuA, 0, 1)), DirName(mem(gpuA, 0, 2))
	if a == b || a != DirName(mem(gpuA, 1, 0)) {
		t.Errorf("DirName: %q %q", a, b)
	}
	odd := DirName([]string{"GPU-../x::mem-0"})
	if strings.ContainsAny(odd, "/.") || len(odd) > 100 {
		t.Errorf("DirName of an odd uuid = %q", odd)
	}
}
