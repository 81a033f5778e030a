package membership

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"
	"unsafe"

	"github.com/gpuwarden/gpuwarden/enforcer/agentapi"
	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
	"github.com/gpuwarden/gpuwarden/enforcer/settings"
)

// gpu0 is the UUID the test's ledgers name for their ordinal 0.
var gpu0 = [16]byte{0xa0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}

// writeLedger writes a container's ledger as the interposer lays it out:
// memory held on ordinal 0 (GPU gpu0), the weight and memory its
// environment claims.
func writeLedger(t *testing.T, controlDir, dir string, cgroup uint64, weight uint32, claimMem uint64) {
	t.Helper()
	var u controlblock.Usage
	u.Magic, u.ABIMajor, u.Size = controlblock.UsageMagic, controlblock.ABIMajor, uint32(controlblock.UsageSize)
	u.MaxDevices, u.MaxSlots, u.SlotSize, u.NDev = controlblock.MaxDevices, controlblock.MaxSlots, uint32(unsafe.Sizeof(controlblock.Slot{})), 1
	u.CgroupID, u.ReservedBytes[0] = cgroup, 1<<30
	u.DevUUID[0] = gpu0
	u.ClaimWeight = weight
	if claimMem > 0 {
		u.ClaimMemLimit[0], u.ClaimFlags = claimMem, controlblock.ClaimMemorySet
	}
	copy(u.CgroupPath[:], "/test/"+dir)
	b := unsafe.Slice((*byte)(unsafe.Pointer(&u)), controlblock.UsageSize)
	if err := os.MkdirAll(filepath.Join(controlDir, dir), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(controlblock.UsagePath(controlDir, dir), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// start runs membership over controlDir without NVML, taking every ledger's
// cgroup claim as true.
func start(t *testing.T, controlDir string) *Members {
	t.Helper()
	var e *Members
	store, err := settings.Load(filepath.Join(t.TempDir(), "settings.json"))
	if err != nil {
		t.Fatal(err)
	}
	e = Start(Config{ControlDir: controlDir, GracePeriod: time.Minute, MaxInst: 4, Settings: store,
		Verify: func(dir string, u *controlblock.UsageSnapshot) (string, error) { return u.CgroupPath, nil },
		Alive:  func(uint64) bool { return true },
		CgroupOf: func(int) (string, error) {
			return "", errors.New("no processes in this test")
		},
		// As the collector's view does, it asks membership for its targets.
		PodContainer: func(name string) (uint64, bool) {
			e.Scheduling()
			return 41, name == "ns/pod/ctr"
		},
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// freeWeight waits until membership holds want containers on the GPU, and
// returns its free_weight then.
func freeWeight(t *testing.T, e *Members, containers int) int {
	t.Helper()
	uuid := controlblock.UUIDString(gpu0)
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if g := e.GPU(uuid); g.Containers == containers {
			return g.FreeWeight
		}
	}
	t.Fatalf("GPU %s never held %d containers: %+v", uuid, containers, e.GPUs())
	return 0
}

// A container is held to what ctl set, else its pod's annotations, else its
// environment; a bad change or annotation changes nothing.
func TestSettingsPrecedence(t *testing.T) {
	cd := t.TempDir()
	writeLedger(t, cd, "c1", 41, 1, 0)
	e := start(t, cd)
	// max_inst 4: free_weight is 4 less the container's weight.
	if got := freeWeight(t, e, 1); got != 3 {
		t.Errorf("environment's weight 1: free_weight %d, want 3", got)
	}
	for _, name := range []string{"c1", "/test/c1", "ns/pod/ctr"} {
		if dir, err := e.Find(name); err != nil || dir != "c1" {
			t.Fatalf("Find(%s) = %q, %v", name, dir, err)
		}
	}
	e.Annotate(41, "ns/pod", "ctr", map[string]string{"gpuwarden.io/weight": "2"})
	if got := e.GPU(controlblock.UUIDString(gpu0)).FreeWeight; got != 2 {
		t.Errorf("annotated weight 2: free_weight %d, want 2", got)
	}
	e.Annotate(41, "ns/pod", "ctr", map[string]string{"gpuwarden.io/weight": "9999"})
	if got := e.GPU(controlblock.UUIDString(gpu0)).FreeWeight; got != 2 {
		t.Errorf("after a malformed annotation: free_weight %d, want 2 (unchanged)", got)
	}
	three := 3
	if _, err := e.ChangeContainer("c1", agentapi.ContainerChange{Weight: &three}); err != nil {
		t.Fatal(err)
	}
	e.Annotate(41, "ns/pod", "ctr", map[string]string{"gpuwarden.io/weight": "2"})
	if got := e.GPU(controlblock.UUIDString(gpu0)).FreeWeight; got != 1 {
		t.Errorf("ctl's weight 3 over annotated 2: free_weight %d, want 1", got)
	}
	for _, w := range []int{0, -1, 1001} {
		if _, err := e.ChangeContainer("c1", agentapi.ContainerChange{Weight: &w}); err == nil {
			t.Errorf("weight %d accepted", w)
		}
	}
	if _, err := e.ChangeContainer("nope", agentapi.ContainerChange{}); !errors.Is(err, ErrNoContainer) {
		t.Errorf("change of an unknown container: %v, want ErrNoContainer", err)
	}
}

// A new container's limits file holds the memory its environment claims;
// one the device plugin made first keeps its own.
func TestLimitsFileFromClaim(t *testing.T) {
	cd := t.TempDir()
	writeLedger(t, cd, "claimed", 42, 1, 2<<30)
	writeLedger(t, cd, "granted", 43, 1, 6<<30)
	var granted [controlblock.MaxDevices]uint64
	granted[0] = 3 << 30
	lf, err := controlblock.CreateLimits(controlblock.LimitsPath(cd, "granted"), controlblock.LimitsConfig{MemLimit: granted, NDev: 1})
	if err != nil {
		t.Fatal(err)
	}
	lf.Close()
	e := start(t, cd)
	freeWeight(t, e, 2)
	for dir, want := range map[string]uint64{"claimed": 2 << 30, "granted": 3 << 30} {
		lf, err := controlblock.OpenLimits(controlblock.LimitsPath(cd, dir))
		if err != nil {
			t.Fatal(err)
		}
		if got := lf.Config().MemLimit[0]; got != want {
			t.Errorf("%s: limits file holds %d bytes, want %d", dir, got, want)
		}
		lf.Close()
	}
}

// Without NVML a GPU is named by its UUID only.
func TestResolveGPUWithoutNVML(t *testing.T) {
	e := start(t, t.TempDir())
	uuid := controlblock.UUIDString(gpu0)
	if got, err := e.ResolveGPU(uuid); err != nil || got != uuid {
		t.Errorf("ResolveGPU(%s) = %q, %v", uuid, got, err)
	}
	for _, arg := range []string{"0", "gpu-0", ""} {
		if _, err := e.ResolveGPU(arg); !errors.Is(err, ErrNoGPU) {
			t.Errorf("ResolveGPU(%q) = %v, want ErrNoGPU", arg, err)
		}
	}
	if _, err := e.ChangeGPU(context.Background(), uuid, agentapi.GPUChange{MaxInst: new(int)}); !errors.Is(err, ErrBadChange) {
		t.Errorf("max_inst 0: %v, want ErrBadChange", err)
	}
}

// The ledgers already in the control directory are taken on before Start
// returns, so an agent that says it is ready holds them.
func TestLedgersTakenOnAtStart(t *testing.T) {
	cd := t.TempDir()
	writeLedger(t, cd, "first", 42, 1, 0)
	writeLedger(t, cd, "second", 43, 2, 0)
	e := start(t, cd)
	if g := e.GPU(controlblock.UUIDString(gpu0)); g.Containers != 2 {
		t.Errorf("as Start returned, GPU %+v holds %d containers, want both ledgers' 2", g, g.Containers)
	}
}
