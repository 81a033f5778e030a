package deviceplugin_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuwarden/gpuwarden/collector/kubelet/kubelettest"
	"github.com/gpuwarden/gpuwarden/deploy/allocation"
	"github.com/gpuwarden/gpuwarden/deploy/deviceplugin"
	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
	"github.com/gpuwarden/gpuwarden/enforcer/nvmldev"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/session"
	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

const (
	uuid0 = "GPU-00000000-1111-2222-3333-444444444444"
	uuid1 = "GPU-11111111-1111-2222-3333-444444444444"
)

// fakeGPUs is a device list the test changes, as NVML's would.
type fakeGPUs struct {
	mu   sync.Mutex
	devs []nvmldev.Device
	err  error
}

func (f *fakeGPUs) set(err error, devs ...nvmldev.Device) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.devs, f.err = devs, err
}

func (f *fakeGPUs) read() ([]nvmldev.Device, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]nvmldev.Device(nil), f.devs...), f.err
}

var (
	gpu0 = nvmldev.Device{Index: 0, UUID: uuid0, Name: "sim", MemoryTotalBytes: 8<<30 + 512<<20}
	gpu1 = nvmldev.Device{Index: 1, UUID: uuid1, Name: "sim", MemoryTotalBytes: 16 << 30}
)

type rig struct {
	kubelet *kubelettest.DevicePlugins
	cfg     deviceplugin.Config
	gpus    *fakeGPUs
	p       *deviceplugin.Plugin
}

// start runs a plugin with two GPUs against a test kubelet until the test ends.
func start(t *testing.T, change func(*deviceplugin.Config), devices func() ([]nvmldev.Device, error)) *rig {
	t.Helper()
	r := &rig{kubelet: kubelettest.StartDevicePlugins(t), gpus: &fakeGPUs{}}
	r.gpus.set(nil, gpu0, gpu1)
	if devices == nil {
		devices = r.gpus.read
	}
	tmp := t.TempDir()
	devRoot := filepath.Join(tmp, "dev")
	os.MkdirAll(devRoot, 0o755)
	for _, n := range []string{"nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"} { // no nvidia-uvm-tools
		os.WriteFile(filepath.Join(devRoot, n), nil, 0o644)
	}
	lib := filepath.Join(tmp, "lib", "libgpuwarden.so")
	os.MkdirAll(filepath.Dir(lib), 0o755)
	os.WriteFile(lib, []byte("not really a library"), 0o644)
	r.cfg = deviceplugin.Config{
		MaxInst: 4, KubeletDir: r.kubelet.Dir, ControlDir: filepath.Join(tmp, "control"), InterposerPath: lib,
		DeviceRoot: devRoot, Preload: deviceplugin.PreloadEnv, HealthInterval: 20 * time.Millisecond, WatchInterval: 20 * time.Millisecond,
	}
	if change != nil {
		change(&r.cfg)
	}
	p, err := deviceplugin.New(r.cfg, devices, slog.New(slog.NewTextHandler(testWriter{t}, nil)))
	if err != nil {
		t.Fatal(err)
	}
	r.p = p
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return r
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// health counts a device list by health.
func health(devs []*pluginapi.Device) map[string]int {
	m := map[string]int{}
	for _, d := range devs {
		m[d.Health]++
	}
	return m
}

func healthOf(devs []*pluginapi.Device, id string) string {
	for _, d := range devs {
		if d.ID == id {
			return d.Health
		}
	}
	return "missing"
}

func TestRegistersBothResources(t *testing.T) {
	r := start(t, nil, nil)
	slots := r.kubelet.WaitDevices(t, allocation.ResourceGPU, func(d []*pluginapi.Device) bool { return len(d) > 0 })
	mem := r.kubelet.WaitDevices(t, allocation.ResourceMemory, func(d []*pluginapi.Device) bool { return len(d) > 0 })
	if h := health(slots); len(slots) != 8 || h[pluginapi.Healthy] != 8 {
		t.Errorf("slots: %d devices %v, want 4 per GPU, healthy", len(slots), h)
	}
	if h := health(mem); len(mem) != 8+16 || h[pluginapi.Healthy] != 24 {
		t.Errorf("memory: %d devices %v, want one per whole GiB (8 + 16), healthy", len(mem), h)
	}
	if slots[4].ID != uuid1+"::slot-0" || mem[8].ID != uuid1+"::mem-0" {
		t.Errorf("ids: %s, %s", slots[4].ID, mem[8].ID)
	}
	regs := r.kubelet.Registrations()
	got := map[string]string{}
	for _, reg := range regs {
		if reg.Version != "v1beta1" || !reg.Options.GetGetPreferredAllocationAvailable() || reg.Options.GetPreStartRequired() {
			t.Errorf("registration %v", reg)
		}
		got[reg.ResourceName] = reg.Endpoint
	}
	if len(regs) != 2 || got["gpuwarden.io/gpu"] != "gpuwarden-gpu.sock" || got["gpuwarden.io/gpu-memory"] != "gpuwarden-gpu-memory.sock" {
		t.Errorf("registrations %v", regs)
	}
	opts, err := r.kubelet.Client(t, allocation.ResourceGPU).GetDevicePluginOptions(context.Background(), &pluginapi.Empty{})
	if err != nil || !opts.GetPreferredAllocationAvailable {
		t.Errorf("options %v, %v", opts, err)
	}
}

func TestHealthFollowsTheDeviceList(t *testing.T) {
	r := start(t, nil, nil)
	r.kubelet.WaitDevices(t, allocation.ResourceMemory, func(d []*pluginapi.Device) bool { return len(d) == 24 })

	// GPU 1 disappears: its devices stay listed, unhealthy.
	r.gpus.set(nil, gpu0)
	mem := r.kubelet.WaitDevices(t, allocation.ResourceMemory, func(d []*pluginapi.Device) bool {
		return health(d)[pluginapi.Unhealthy] == 16
	})
	if healthOf(mem, uuid0+"::mem-7") != pluginapi.Healthy || healthOf(mem, uuid1+"::mem-15") != pluginapi.Unhealthy {
		t.Errorf("after GPU 1 went: %v", health(mem))
	}
	r.kubelet.WaitDevices(t, allocation.ResourceGPU, func(d []*pluginapi.Device) bool { return health(d)[pluginapi.Unhealthy] == 4 })

	// An unhealthy GPU is not allocated.
	_, err := r.kubelet.Client(t, allocation.ResourceMemory).Allocate(context.Background(), allocReq(uuid1+"::mem-0"))
	if err == nil || !strings.Contains(err.Error(), "not on this node") {
		t.Errorf("allocate on a gone GPU: %v", err)
	}

	// It comes back.
	r.gpus.set(nil, gpu0, gpu1)
	r.kubelet.WaitDevices(t, allocation.ResourceMemory, func(d []*pluginapi.Device) bool { return health(d)[pluginapi.Healthy] == 24 })

	// NVML fails: nothing is healthy.
	r.gpus.set(errors.New("nvml: unknown error"))
	r.kubelet.WaitDevices(t, allocation.ResourceGPU, func(d []*pluginapi.Device) bool { return health(d)[pluginapi.Unhealthy] == 8 })
}

func allocReq(ids ...string) *pluginapi.AllocateRequest {
	return &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}}
}

func mounts(c *pluginapi.ContainerAllocateResponse) map[string]string {
	m := map[string]string{}
	for _, x := range c.Mounts {
		mode := "rw"
		if x.ReadOnly {
			mode = "ro"
		}
		m[x.ContainerPath] = x.HostPath + " " + mode
	}
	return m
}

func devices(c *pluginapi.ContainerAllocateResponse) []string {
	var out []string
	for _, d := range c.Devices {
		out = append(out, d.ContainerPath+"="+d.HostPath+":"+d.Permissions)
	}
	sort.Strings(out)
	return out
}

// checkLimits reads a control block's limits as the interposer would.
func checkLimits(t *testing.T, path string, want uint64) {
	t.Helper()
	lf, err := controlblock.OpenLimits(path)
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	c := lf.Config()
	if c.MemLimit[0] != want || c.NDev != 1 || c.MemLimit[1] != 0 {
		t.Errorf("%s: limit %d (ndev %d), want %d on ordinal 0", path, c.MemLimit[0], c.NDev, want)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o644 {
		t.Errorf("limits mode: %v %v", st.Mode(), err)
	}
}

func TestAllocate(t *testing.T) {
	r := start(t, nil, nil)
	ctx := context.Background()
	memc := r.kubelet.Client(t, allocation.ResourceMemory)
	slotc := r.kubelet.Client(t, allocation.ResourceGPU)
	r.kubelet.WaitDevices(t, allocation.ResourceMemory, func(d []*pluginapi.Device) bool { return len(d) == 24 })

	t.Run("memory", func(t *testing.T) {
		ids := []string{uuid1 + "::mem-2", uuid1 + "::mem-0", uuid1 + "::mem-1"}
		resp, err := memc.Allocate(ctx, allocReq(ids...))
		if err != nil {
			t.Fatal(err)
		}
		c := resp.ContainerResponses[0]
		want := map[string]string{
			"GPUWARDEN_MEMORY_LIMIT": "3Gi", "GPUWARDEN_CONTROL_DIR": "/run/gpuwarden", "LD_PRELOAD": allocation.ContainerInterposer,
			"NVIDIA_VISIBLE_DEVICES": uuid1, "CUDA_VISIBLE_DEVICES": uuid1,
		}
		if fmt.Sprint(c.Envs) != fmt.Sprint(want) {
			t.Errorf("env %v\nwant %v", c.Envs, want)
		}
		dir := filepath.Join(r.cfg.ControlDir, allocation.DirName(ids))
		wantMounts := map[string]string{
			allocation.ContainerInterposer: r.cfg.InterposerPath + " ro",
			"/run/gpuwarden/root/limits":   dir + "/limits ro",
			"/run/gpuwarden/root/usage":    dir + "/usage rw",
		}
		if fmt.Sprint(mounts(c)) != fmt.Sprint(wantMounts) {
			t.Errorf("mounts %v\nwant %v", mounts(c), wantMounts)
		}
		root := r.cfg.DeviceRoot
		wantDevs := []string{"/dev/nvidia-uvm=" + root + "/nvidia-uvm:rw", "/dev/nvidia1=" + root + "/nvidia1:rw", "/dev/nvidiactl=" + root + "/nvidiactl:rw"}
		if fmt.Sprint(devices(c)) != fmt.Sprint(wantDevs) {
			t.Errorf("devices %v\nwant %v", devices(c), wantDevs)
		}
		checkLimits(t, filepath.Join(dir, "limits"), 3<<30)
		if st, err := os.Stat(filepath.Join(dir, "usage")); err != nil || st.Size() != 0 || st.Mode().Perm() != 0o666 {
			t.Errorf("usage: %v %v (want empty, 0666: the container's first process lays it out)", st, err)
		}
	})

	// A directory of the same name left by someone else (another user's,
	// writable by all) is taken back: the agent's, 0755.
	t.Run("directory taken back", func(t *testing.T) {
		simtest.RequirePrivileged(t, "chown")
		ids := []string{uuid1 + "::mem-5"}
		dir := filepath.Join(r.cfg.ControlDir, allocation.DirName(ids))
		if err := os.MkdirAll(dir, 0o777); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, 0o777); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(dir, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		if _, err := memc.Allocate(ctx, allocReq(ids...)); err != nil {
			t.Fatal(err)
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(dir, &st); err != nil {
			t.Fatal(err)
		}
		if int(st.Uid) != os.Geteuid() || st.Mode&0o7777 != 0o755 {
			t.Errorf("control directory: uid %d mode %#o, want uid %d mode 0755", st.Uid, st.Mode&0o7777, os.Geteuid())
		}
	})

	t.Run("slots", func(t *testing.T) {
		ids := []string{uuid0 + "::slot-1", uuid0 + "::slot-3"}
		resp, err := slotc.Allocate(ctx, allocReq(ids...))
		if err != nil {
			t.Fatal(err)
		}
		c := resp.ContainerResponses[0]
		// 8.5 GiB / 4 slots = 2176 MiB a slot.
		if c.Envs["GPUWARDEN_MEMORY_LIMIT"] != "4352Mi" || c.Envs["GPUWARDEN_COMPUTE_WEIGHT"] != "2" || c.Envs["NVIDIA_VISIBLE_DEVICES"] != uuid0 {
			t.Errorf("env %v", c.Envs)
		}
		if d := devices(c); len(d) != 3 || !strings.HasPrefix(d[1], "/dev/nvidia0=") {
			t.Errorf("devices %v", d)
		}
		checkLimits(t, filepath.Join(r.cfg.ControlDir, allocation.DirName(ids), "limits"), 4352<<20)
	})

	t.Run("two containers", func(t *testing.T) {
		req := &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
			{DevicesIds: []string{uuid0 + "::mem-0"}}, {DevicesIds: []string{uuid0 + "::mem-1"}}}}
		resp, err := memc.Allocate(ctx, req)
		if err != nil || len(resp.ContainerResponses) != 2 {
			t.Fatal(resp, err)
		}
		a, b := mounts(resp.ContainerResponses[0]), mounts(resp.ContainerResponses[1])
		if a["/run/gpuwarden/root/usage"] == b["/run/gpuwarden/root/usage"] {
			t.Errorf("two containers share a control block: %v", a)
		}
	})

	refused := []struct {
		name   string
		client pluginapi.DevicePluginClient
		ids    []string
		want   string
	}{
		{"spanning two GPUs", memc, []string{uuid0 + "::mem-0", uuid1 + "::mem-0"}, "more than one GPU"},
		{"unknown GPU", memc, []string{"GPU-nope::mem-0"}, "not on this node"},
		{"beyond the GPU's memory", memc, []string{uuid0 + "::mem-8"}, "has 8 mem devices"},
		{"another resource's ids", slotc, []string{uuid0 + "::mem-0"}, "gpuwarden.io/gpu-memory asked of gpuwarden.io/gpu"},
		{"not an id", slotc, []string{"nvidia0"}, "device id"},
	}
	for _, tt := range refused {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := tt.client.Allocate(ctx, allocReq(tt.ids...))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, %v; want an error with %q", resp, err, tt.want)
			}
		})
	}

	t.Run("interposer missing", func(t *testing.T) {
		os.Rename(r.cfg.InterposerPath, r.cfg.InterposerPath+".away")
		defer os.Rename(r.cfg.InterposerPath+".away", r.cfg.InterposerPath)
		if _, err := memc.Allocate(ctx, allocReq(uuid0+"::mem-3")); err == nil || !strings.Contains(err.Error(), "interposer") {
			t.Errorf("allocate without the interposer on the host: %v", err)
		}
	})
}

// TestSetMaxInst: a GPU's slots follow its max_inst at once, an allocation
// takes the new per-slot quota, and slots the kubelet has assigned are never
// taken away.
func TestSetMaxInst(t *testing.T) {
	r := start(t, nil, nil)
	r.kubelet.WaitDevices(t, allocation.ResourceGPU, func(d []*pluginapi.Device) bool { return len(d) == 8 })
	if err := r.p.SetMaxInst(1, 8, nil); err != nil {
		t.Fatal(err)
	}
	slots := r.kubelet.WaitDevices(t, allocation.ResourceGPU, func(d []*pluginapi.Device) bool { return len(d) == 12 })
	if healthOf(slots, uuid1+"::slot-7") != pluginapi.Healthy || healthOf(slots, uuid0+"::slot-4") != "missing" {
		t.Errorf("after max_inst 8 on GPU 1: %d slots", len(slots))
	}
	resp, err := r.kubelet.Client(t, allocation.ResourceGPU).Allocate(context.Background(), allocReq(uuid1+"::slot-6"))
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.ContainerResponses[0].Envs["GPUWARDEN_MEMORY_LIMIT"]; got != "2Gi" {
		t.Errorf("a slot of 16 GiB / 8: limit %s, want 2Gi", got)
	}
	inUse := []string{uuid1 + "::slot-6", uuid0 + "::slot-3"}
	if err := r.p.SetMaxInst(1, 6, inUse); err == nil || !strings.Contains(err.Error(), "slot 6") {
		t.Errorf("max_inst 6 with slot-6 assigned: %v, want a refusal naming it", err)
	}
	if err := r.p.SetMaxInst(1, 7, inUse); err != nil {
		t.Errorf("max_inst 7 with slot-6 assigned: %v", err)
	}
	if err := r.p.SetMaxInst(0, 0, nil); err == nil {
		t.Error("max_inst 0 accepted")
	}
	r.kubelet.WaitDevices(t, allocation.ResourceGPU, func(d []*pluginapi.Device) bool { return len(d) == 11 })
}

func TestAllocateLdSoPreload(t *testing.T) {
	r := start(t, func(c *deviceplugin.Config) { c.Preload = deviceplugin.PreloadLdSoPreload }, nil)
	r.kubelet.WaitDevices(t, allocation.ResourceMemory, func(d []*pluginapi.Device) bool { return len(d) == 24 })
	ids := []string{uuid0 + "::mem-5"}
	resp, err := r.kubelet.Client(t, allocation.ResourceMemory).Allocate(context.Background(), allocReq(ids...))
	if err != nil {
		t.Fatal(err)
	}
	c := resp.ContainerResponses[0]
	if _, ok := c.Envs["LD_PRELOAD"]; ok {
		t.Errorf("LD_PRELOAD set in ld.so.preload mode: %v", c.Envs)
	}
	file := filepath.Join(r.cfg.ControlDir, allocation.DirName(ids), "ld.so.preload")
	if mounts(c)["/etc/ld.so.preload"] != file+" ro" {
		t.Errorf("mounts %v", mounts(c))
	}
	if b, err := os.ReadFile(file); err != nil || string(b) != allocation.ContainerInterposer+"\n" {
		t.Errorf("ld.so.preload = %q, %v", b, err)
	}
}

func TestPreferredAllocation(t *testing.T) {
	r := start(t, nil, nil)
	c := r.kubelet.Client(t, allocation.ResourceMemory)
	var avail []string
	for i := 0; i < 8; i++ {
		avail = append(avail, fmt.Sprintf("%s::mem-%d", uuid0, i))
	}
	for i := 0; i < 3; i++ {
		avail = append(avail, fmt.Sprintf("%s::mem-%d", uuid1, i))
	}
	req := &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
		{AvailableDeviceIDs: avail, AllocationSize: 2},
		{AvailableDeviceIDs: avail, AllocationSize: 5},
	}}
	resp, err := c.GetPreferredAllocation(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	got := fmt.Sprint(resp.ContainerResponses[0].DeviceIDs, resp.ContainerResponses[1].DeviceIDs)
	want := fmt.Sprint([]string{uuid1 + "::mem-0", uuid1 + "::mem-1"}, avail[:5])
	if got != want {
		t.Errorf("preferred %s\nwant %s", got, want)
	}
	req.ContainerRequests = []*pluginapi.ContainerPreferredAllocationRequest{{AvailableDeviceIDs: avail, AllocationSize: 9}}
	if _, err := c.GetPreferredAllocation(context.Background(), req); err == nil || !strings.Contains(err.Error(), "no GPU has 9") {
		t.Errorf("9 GiB on one GPU where none has 9 free: %v", err)
	}
}

func TestReRegistersWhenTheKubeletRestarts(t *testing.T) {
	r := start(t, nil, nil)
	r.kubelet.WaitDevices(t, allocation.ResourceGPU, func(d []*pluginapi.Device) bool { return len(d) == 8 })
	r.kubelet.WaitDevices(t, allocation.ResourceMemory, func(d []*pluginapi.Device) bool { return len(d) == 24 })
	for i := 0; i < 2; i++ {
		r.kubelet.Restart()
		if n := len(r.kubelet.Registrations()); n != 0 {
			t.Fatalf("registrations after the restart: %d", n)
		}
		r.kubelet.WaitDevices(t, allocation.ResourceGPU, func(d []*pluginapi.Device) bool { return len(d) == 8 })
		r.kubelet.WaitDevices(t, allocation.ResourceMemory, func(d []*pluginapi.Device) bool { return len(d) == 24 })
		for _, ep := range []string{"gpuwarden-gpu.sock", "gpuwarden-gpu-memory.sock"} {
			if _, err := os.Stat(filepath.Join(r.kubelet.Dir, ep)); err != nil {
				t.Errorf("socket after restart %d: %v", i, err)
			}
		}
		if n := len(r.kubelet.Registrations()); n != 2 {
			t.Errorf("restart %d: %d registrations, want 2", i, n)
		}
	}
	// The plugin still allocates after it re-registered.
	if _, err := r.kubelet.Client(t, allocation.ResourceMemory).Allocate(context.Background(), allocReq(uuid1+"::mem-4")); err != nil {
		t.Error(err)
	}
}

// The kubelet removes plugin sockets when it starts, sometimes before its own
// socket is back: the plugin serves again and registers once it can.
func TestServesAgainWhenItsSocketIsRemoved(t *testing.T) {
	r := start(t, nil, nil)
	r.kubelet.WaitDevices(t, allocation.ResourceGPU, func(d []*pluginapi.Device) bool { return len(d) == 8 })
	sock := filepath.Join(r.kubelet.Dir, "gpuwarden-gpu.sock")
	os.Remove(sock)
	r.kubelet.Wait(t, "re-registration", func() bool { return len(r.kubelet.Registrations()) >= 3 })
	if _, err := os.Stat(sock); err != nil {
		t.Error(err)
	}
}

func TestBadConfig(t *testing.T) {
	good := deviceplugin.Config{MaxInst: 4, KubeletDir: "/k", ControlDir: "/c", InterposerPath: "/l.so", DeviceRoot: "/dev",
		Preload: "env", HealthInterval: time.Second}
	for name, change := range map[string]func(*deviceplugin.Config){
		"maxInst 0":        func(c *deviceplugin.Config) { c.MaxInst = 0 },
		"maxInst 129":      func(c *deviceplugin.Config) { c.MaxInst = 129 },
		"relative dir":     func(c *deviceplugin.Config) { c.KubeletDir = "k" },
		"no interposer":    func(c *deviceplugin.Config) { c.InterposerPath = "" },
		"preload":          func(c *deviceplugin.Config) { c.Preload = "LD_PRELOAD" },
		"zero health tick": func(c *deviceplugin.Config) { c.HealthInterval = 0 },
	} {
		c := good
		change(&c)
		if _, err := deviceplugin.New(c, nil, nil); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := deviceplugin.New(good, nil, nil); err != nil {
		t.Error(err)
	}
}

// simgpu's NVML reads SIMGPU_STATE once per process: one machine per test binary.
var machine *simtest.Machine

func TestMain(m *testing.M) { os.Exit(simtest.RunWithProcessMachine(m, &machine, 3, "6Gi")) }

// The devices come from NVML (simgpu's, through go-nvml), as in the agent.
func TestDevicesFromNVML(t *testing.T) {
	nv, err := nvmldev.Open(simtest.Bin(t, "simgpu/libnvidia-ml.so.1"))
	if err != nil {
		t.Fatal(err)
	}
	defer nv.Close()
	r := start(t, nil, nv.Devices)
	r.kubelet.WaitDevices(t, allocation.ResourceGPU, func(d []*pluginapi.Device) bool { return len(d) == 3*4 })
	mem := r.kubelet.WaitDevices(t, allocation.ResourceMemory, func(d []*pluginapi.Device) bool { return len(d) == 3*6 })
	id, err := allocation.ParseID(mem[17].ID)
	if err != nil || !strings.HasPrefix(id.UUID, "GPU-") || id.N != 5 {
		t.Errorf("last memory device %q: %v", mem[17].ID, err)
	}
}

// TestRemoteResource: with remote servers the plugin registers
// gpuwarden.io/remote-gpu alone, maxInst slots per server GPU; a GPU whose
// server stops answering goes unhealthy and cannot be allocated; Allocate
// writes the grant the relay reads, has the relay serve the allocation,
// and gives the container the socket's directory, the library and the
// environment, no device nodes.
func TestRemoteResource(t *testing.T) {
	libDir := t.TempDir()
	os.WriteFile(filepath.Join(libDir, "libcuda.so.1"), nil, 0o644)
	relayed := make(chan string, 4)
	servers := map[string]string{uuid0: "gpu-a:7070", uuid1: "gpu-b"}
	r := start(t, func(c *deviceplugin.Config) {
		c.Remote = &deviceplugin.RemoteConfig{LibDir: libDir,
			Server: func(u string) (string, bool) { s, ok := servers[u]; return s, ok },
			Relay:  func(dir string) error { relayed <- dir; return nil }}
	}, nil)
	devs := r.kubelet.WaitDevices(t, allocation.ResourceRemote, func(d []*pluginapi.Device) bool { return health(d)[pluginapi.Healthy] == 8 })
	if regs := r.kubelet.Registrations(); len(regs) != 1 || regs[0].ResourceName != allocation.ResourceRemote {
		t.Fatalf("registrations %v", regs)
	}
	if !strings.HasSuffix(devs[0].ID, "::remote-0") {
		t.Fatalf("device %s", devs[0].ID)
	}
	ids := []string{uuid1 + "::remote-0", uuid1 + "::remote-1"}
	resp, err := r.kubelet.Client(t, allocation.ResourceRemote).Allocate(context.Background(),
		&pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}})
	if err != nil {
		t.Fatal(err)
	}
	car := resp.ContainerResponses[0]
	dir := allocation.DirName(ids)
	g, err := session.ReadGrant(filepath.Join(r.cfg.ControlDir, dir, session.GrantFile))
	if err != nil || g != (session.Grant{Server: "gpu-b", GPU: uuid1, MemoryBytes: 8 << 30, Weight: 2}) {
		t.Fatalf("grant %+v %v", g, err)
	}
	if len(relayed) != 1 || <-relayed != dir || len(car.Devices) != 0 || car.Envs["GPUWARDEN_REMOTE"] == "" || len(car.Mounts) != 2 {
		t.Fatalf("relayed %v, response %+v", relayed, car)
	}

	// gpu-b stops answering.
	r.gpus.set(nil, gpu0)
	r.kubelet.WaitDevices(t, allocation.ResourceRemote, func(d []*pluginapi.Device) bool {
		return healthOf(d, uuid1+"::remote-3") == pluginapi.Unhealthy && healthOf(d, uuid0+"::remote-3") == pluginapi.Healthy
	})
	if _, err := r.kubelet.Client(t, allocation.ResourceRemote).Allocate(context.Background(),
		&pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids[:1]}}}); err == nil {
		t.Fatal("allocated a GPU whose server is silent")
	}
}
