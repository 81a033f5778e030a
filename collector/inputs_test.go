package collector

import (
	"context"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"unsafe"

	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
	"github.com/gpuwarden/gpuwarden/enforcer/membership"
	"github.com/gpuwarden/gpuwarden/enforcer/nvmldev"
)

// TestViewJoinedAgainOnlyWhenSomethingMoves: a view whose sources read as
// the last one's did, while that one showed nothing moving, is that view
// again; any change in a source, GPU time in use, or rejoinEvery passing
// makes a new one.
func TestViewJoinedAgainOnlyWhenSomethingMoves(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "c1"), 0o755); err != nil {
		t.Fatal(err)
	}
	usage := controlblock.UsagePath(dir, "c1")
	if err := os.WriteFile(usage, ledgerBytes(), 0o666); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	dev := nvmldev.Device{Index: 0, UUID: "GPU-0", MemoryTotalBytes: 80 << 30, MemoryUsedBytes: 1 << 30}
	setDev := func(f func(d *nvmldev.Device)) {
		mu.Lock()
		defer mu.Unlock()
		f(&dev)
	}
	sched := map[membership.GPUKey]membership.Scheduled{{Cgroup: 7, UUID: "GPU-0"}: {Target: 0.5}}
	c := New("node", "test", Sources{ControlDir: dir,
		NVML: func() ([]nvmldev.Device, error) {
			mu.Lock()
			defer mu.Unlock()
			return []nvmldev.Device{dev}, nil
		},
		Scheduling: func() map[membership.GPUKey]membership.Scheduled {
			mu.Lock()
			defer mu.Unlock()
			return maps.Clone(sched)
		}}, slog.New(slog.DiscardHandler))
	c.maxAge = 0
	gen := func() uint64 { return c.View(context.Background()).gen }

	first := gen()
	if g := gen(); g != first {
		t.Fatalf("nothing changed, yet view %d became %d", first, g)
	}
	steps := []struct {
		what   string
		change func()
	}{
		{"NVML's memory in use", func() { setDev(func(d *nvmldev.Device) { d.MemoryUsedBytes += 1 << 20 }) }},
		{"a ledger's header", func() {
			f, err := os.OpenFile(usage, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.WriteAt([]byte{1}, int64(unsafe.Offsetof(controlblock.Usage{}.ReservedBytes))); err != nil {
				t.Fatal(err)
			}
		}},
		{"the enforcer's target", func() {
			mu.Lock()
			defer mu.Unlock()
			sched[membership.GPUKey{Cgroup: 7, UUID: "GPU-0"}] = membership.Scheduled{Target: 0.25}
		}},
		{"a new container directory", func() {
			if err := os.Mkdir(filepath.Join(dir, "c2"), 0o755); err != nil {
				t.Fatal(err)
			}
		}},
	}
	last := first
	for _, s := range steps {
		s.change()
		g := gen()
		if g == last {
			t.Errorf("%s changed, yet the view was served again", s.what)
		}
		if again := gen(); again != g {
			t.Errorf("after %s changed once, views %d and %d differ with nothing else changed", s.what, g, again)
		}
		last = g
	}

	// GPU time in use moves with time alone: every view is joined.
	setDev(func(d *nvmldev.Device) { d.Utilization = 0.3 })
	a, b := gen(), gen()
	if a == last || b == a {
		t.Errorf("with the GPU busy, views %d, %d, %d: want each joined", last, a, b)
	}
	setDev(func(d *nvmldev.Device) { d.Utilization = 0 })
	quietAgain := gen()
	if gen() != quietAgain {
		t.Error("idle again, the view was not served again")
	}

	// However quiet, a view is joined again after rejoinEvery.
	c.mu.Lock()
	c.joined = c.joined.Add(-rejoinEvery)
	c.mu.Unlock()
	if gen() == quietAgain {
		t.Errorf("a view served for %v was not joined again", rejoinEvery)
	}
}
