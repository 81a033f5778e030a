package dra

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuwarden/gpuwarden/collector/kubeapi"
	"github.com/gpuwarden/gpuwarden/deploy/allocation"
	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
	"github.com/gpuwarden/gpuwarden/enforcer/nvmldev"
	"github.com/gpuwarden/gpuwarden/enforcer/scheduler"
)

const (
	node  = "node-a"
	gib   = int64(1) << 30
	uidA  = "6f1c2a8e-0d3b-4c55-9a1e-2b7d8c9e0f11"
	uidB  = "0a0b0c0d-1111-2222-3333-444455556666"
	share = "gpu.gpuwarden.io/v1alpha1"
)

type rig struct {
	d        *Driver
	control  string
	cdi      string
	settings map[string]*scheduler.Settings
}

func newRig(t *testing.T) *rig {
	t.Helper()
	dir := t.TempDir()
	lib := filepath.Join(dir, "libgpuwarden.so")
	if err := os.WriteFile(lib, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	r := &rig{control: filepath.Join(dir, "control"), cdi: filepath.Join(dir, "cdi"), settings: map[string]*scheduler.Settings{}}
	if err := controlblock.PrepareControlDir(r.control); err != nil {
		t.Fatal(err)
	}
	devices := func() ([]nvmldev.Device, error) {
		return []nvmldev.Device{
			{Index: 0, UUID: "GPU-aaaa", Name: "simgpu", MemoryTotalBytes: uint64(15 * gib)},
			{Index: 1, UUID: "GPU-bbbb", Name: "simgpu", MemoryTotalBytes: uint64(15 * gib)},
		}, nil
	}
	d, err := New(Config{NodeName: node, MaxInst: 4, CDIDir: r.cdi, RegistrarDir: "/r", PluginDir: "/p",
		HealthInterval: time.Second,
		Node:           allocation.Node{ControlDir: r.control, InterposerPath: lib, DeviceRoot: filepath.Join(dir, "dev")},
		SetCompute: func(dir string, st *scheduler.Settings) error {
			if st == nil {
				delete(r.settings, dir)
			} else {
				r.settings[dir] = st
			}
			return nil
		}}, devices, nil)
	if err != nil {
		t.Fatal(err)
	}
	d.refresh()
	r.d = d
	return r
}

// claim is a claim allocated device on this node with the given consumed
// memory (GiB) and compute, and opaque configs (JSON) for its request.
func claim(uid string, device string, memGiB, compute int64, configs ...string) *ResourceClaim {
	c := &ResourceClaim{Metadata: objectMeta{Namespace: "ml", Name: "train", UID: uid}}
	c.Status.Allocation = &Allocation{}
	c.Status.Allocation.Devices.Results = []Result{{Request: "gpu", Driver: DriverName, Pool: node, Device: device,
		ConsumedCapacity: map[string]Quantity{CapacityMemory: Quantity(memGiB * gib), CapacityCompute: Quantity(compute)}}}
	for _, js := range configs {
		c.Status.Allocation.Devices.Config = append(c.Status.Allocation.Devices.Config,
			AllocConfig{Source: "FromClaim", Requests: []string{"gpu"}, Opaque: &Opaque{Driver: DriverName, Parameters: json.RawMessage(js)}})
	}
	return c
}

func TestPrepareWritesWhatTheDevicePluginGives(t *testing.T) {
	r := newRig(t)
	devs, err := r.d.Prepare(context.Background(), claim(uidA, "gpu-1", 6, 50, `{"apiVersion": "`+share+`", "kind": "ShareConfig", "priority": "high", "computeLimit": 80}`))
	if err != nil {
		t.Fatal(err)
	}
	dirName := allocation.ClaimDirName(uidA, "gpu-1")
	if len(devs) != 1 || devs[0].Device != "gpu-1" || devs[0].Pool != node || devs[0].Request != "gpu" ||
		devs[0].CDIDevice != "gpu.gpuwarden.io/claim="+dirName {
		t.Fatalf("devices %+v", devs)
	}
	lf, err := controlblock.OpenLimits(filepath.Join(r.control, dirName, "limits"))
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	if got := lf.Config().MemLimit[0]; got != uint64(6*gib) {
		t.Errorf("limits file: memory %d, want 6 GiB", got)
	}
	// compute 50 of a GPU with 4 slots is 2 slots' worth: weight 2.
	if st := r.settings[dirName]; st == nil || *st != (scheduler.Settings{Weight: 2, CapPercent: 80, High: true}) {
		t.Errorf("settings %+v, want weight 2, cap 80, high", st)
	}
	spec := r.spec(t, uidA)
	if spec.Kind != "gpu.gpuwarden.io/claim" || len(spec.Devices) != 1 || spec.Devices[0].Name != dirName {
		t.Fatalf("spec %+v", spec)
	}
	env := strings.Join(spec.Devices[0].Edits.Env, " ")
	for _, want := range []string{"GPUWARDEN_MEMORY_LIMIT=6Gi", "CUDA_VISIBLE_DEVICES=GPU-bbbb", "GPUWARDEN_COMPUTE_WEIGHT=2",
		"GPUWARDEN_COMPUTE_LIMIT=80", "GPUWARDEN_PRIORITY=high", "LD_PRELOAD=" + allocation.ContainerInterposer} {
		if !strings.Contains(env, want) {
			t.Errorf("env %q lacks %s", env, want)
		}
	}
	mounts := mountsOf(spec.Devices[0])
	if m := mounts["/run/gpuwarden/root/limits"]; m.HostPath != filepath.Join(r.control, dirName, "limits") || m.Options[1] != "ro" {
		t.Errorf("limits mount %+v", m)
	}
	if m := mounts["/run/gpuwarden/root/usage"]; m.Options[1] != "rw" {
		t.Errorf("usage mount %+v", m)
	}
	if p, _ := r.d.Prepared(); !p[dirName] {
		t.Errorf("Prepared %v lacks %s", p, dirName)
	}

	// Asked again (a kubelet restart): the container's files stay the same inodes.
	before, _ := os.Stat(filepath.Join(r.control, dirName, "usage"))
	if _, err := r.d.Prepare(context.Background(), claim(uidA, "gpu-1", 6, 50)); err != nil {
		t.Fatal(err)
	}
	after, _ := os.Stat(filepath.Join(r.control, dirName, "usage"))
	if !os.SameFile(before, after) {
		t.Error("a second prepare replaced the usage file the container maps")
	}

	for _, uid := range []string{uidA, uidB} { // uidB was never prepared: nothing to do
		if err := r.d.Unprepare(uid); err != nil {
			t.Fatalf("unprepare %s: %v", uid, err)
		}
	}
	if _, err := os.Stat(filepath.Join(r.control, dirName)); !os.IsNotExist(err) {
		t.Errorf("control directory left: %v", err)
	}
	if _, err := os.Stat(specPath(r.cdi, uidA)); !os.IsNotExist(err) {
		t.Errorf("CDI spec left: %v", err)
	}
	if len(r.settings) != 0 {
		t.Errorf("settings left: %v", r.settings)
	}
}

func TestDefaultsAreOneSlot(t *testing.T) {
	r := newRig(t)
	g, _ := r.d.gpu("gpu-0")
	dev := DeviceOf(g, "")
	mem, comp := dev.Capacity[CapacityMemory], dev.Capacity[CapacityCompute]
	if mem.Value != Quantity(15*gib) || *mem.RequestPolicy.Default != Quantity(15*gib/4) {
		t.Errorf("memory capacity %d, default %d: want 15Gi, a quarter", mem.Value, *mem.RequestPolicy.Default)
	}
	if comp.Value != 100 || *comp.RequestPolicy.Default != 25 {
		t.Errorf("compute capacity %d, default %d: want 100, 25", comp.Value, *comp.RequestPolicy.Default)
	}
	if dev.AllowMultipleAllocations == nil || !*dev.AllowMultipleAllocations || *dev.Attributes["uuid"].String != "GPU-aaaa" {
		t.Errorf("device %+v", dev)
	}
	if _, err := r.d.Prepare(context.Background(), claim(uidA, "gpu-0", 15/4, 25)); err != nil {
		t.Fatal(err)
	}
	if st := r.settings[allocation.ClaimDirName(uidA, "gpu-0")]; st == nil || st.Weight != 1 {
		t.Errorf("a one-slot claim's settings %+v, want weight 1", st)
	}
	// A GPU's own max_inst (gpuwarden ctl gpu 1 --max-inst 2): its slot is half the GPU.
	r.d.cfg.MaxInstOf = func(uuid string) int { return map[string]int{"GPU-bbbb": 2}[uuid] }
	r.d.refresh()
	g1, _ := r.d.gpu("gpu-1")
	if dev := DeviceOf(g1, ""); *dev.Capacity[CapacityCompute].RequestPolicy.Default != 50 || *dev.Attributes["maxInst"].Int != 2 {
		t.Errorf("GPU 1 with max_inst 2: %+v", dev)
	}
	if g0, _ := r.d.gpu("gpu-0"); g0.MaxInst != 4 {
		t.Errorf("GPU 0's max_inst %d, want the configured 4", g0.MaxInst)
	}
}

func TestRefusedClaimsWriteNothing(t *testing.T) {
	cfg := func(s string) string { return `{"apiVersion": "` + share + `", "kind": "ShareConfig", ` + s + `}` }
	cases := []struct {
		name string
		c    *ResourceClaim
		why  string
	}{
		{"weight 0", claim(uidA, "gpu-0", 1, 25, cfg(`"weight": 0`)), "weight 0: want an integer from 1 to 1000"},
		{"unknown field", claim(uidA, "gpu-0", 1, 25, cfg(`"weigth": 2`)), `unknown field "weigth"`},
		{"no such GPU", claim(uidA, "gpu-7", 1, 25), "no such GPU"},
		{"over the GPU", claim(uidA, "gpu-0", 16, 25), "consumed memory 16Gi and compute 25"},
		{"bad UID", claim("../../etc", "gpu-0", 1, 25), "want a UUID"},
		{"admin access", func() *ResourceClaim {
			c := claim(uidA, "gpu-0", 1, 25)
			admin := true
			c.Status.Allocation.Devices.Results[0].AdminAccess = &admin
			return c
		}(), "admin access is not offered"},
		{"another node's pool", func() *ResourceClaim {
			c := claim(uidA, "gpu-0", 1, 25)
			c.Status.Allocation.Devices.Results[0].Pool = "node-b"
			return c
		}(), "not of this node's pool"},
		{"no capacity", func() *ResourceClaim {
			c := claim(uidA, "gpu-0", 1, 25)
			c.Status.Allocation.Devices.Results[0].ConsumedCapacity = nil
			return c
		}(), "DRAConsumableCapacity"},
		{"two GPUs", func() *ResourceClaim {
			c := claim(uidA, "gpu-0", 1, 25)
			r := c.Status.Allocation.Devices.Results[0]
			r.Device = "gpu-1"
			c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results, r)
			return c
		}(), "more than one GPU"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { newRig(t).refused(t, tc.c, tc.why) })
	}
}

// spec is the CDI spec of claim uid, as the driver wrote it.
func (r *rig) spec(t *testing.T, uid string) cdiSpec {
	t.Helper()
	var spec cdiSpec
	b, err := os.ReadFile(specPath(r.cdi, uid))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	return spec
}

// mountsOf is a CDI device's mounts by their path in the container.
func mountsOf(d cdiDevice) map[string]cdiMount {
	mounts := map[string]cdiMount{}
	for _, m := range d.Edits.Mounts {
		mounts[m.ContainerPath] = m
	}
	return mounts
}

// refused checks that preparing c fails saying why, and writes nothing.
func (r *rig) refused(t *testing.T, c *ResourceClaim, why string) {
	t.Helper()
	_, err := r.d.Prepare(context.Background(), c)
	if err == nil || !strings.Contains(err.Error(), why) {
		t.Fatalf("error %v, want one saying %q", err, why)
	}
	for _, d := range []string{r.control, r.cdi} {
		if entries, _ := os.ReadDir(d); len(entries) > 0 {
			t.Errorf("%s holds %d entries after a refusal", d, len(entries))
		}
	}
	if len(r.settings) != 0 {
		t.Errorf("settings written: %v", r.settings)
	}
}

// sliceServer answers the requests the driver makes of the API server for
// its slice, over HTTPS with a bearer token: the node, and ResourceSlices
// listed, created, replaced and deleted. With dropShared it drops what
// an API server without consumable capacity drops. (The real API server
// is in make k8s-test.)
type sliceServer struct {
	mu         sync.Mutex
	slices     map[string]ResourceSlice
	nodeLabels map[string]string
	dropShared bool
	version    int
}

func (f *sliceServer) start(t *testing.T) *kubeapi.Client {
	t.Helper()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if r.Header.Get("Authorization") != "Bearer tok" {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		name, named := strings.CutPrefix(r.URL.Path, resourceAPI+"/resourceslices/")
		switch {
		case r.Method == http.MethodGet && r.URL.Path == "/api/v1/nodes/"+node:
			_ = json.NewEncoder(w).Encode(map[string]any{"metadata": map[string]any{"name": node, "uid": "node-uid", "labels": f.nodeLabels}})
		case r.Method == http.MethodGet && r.URL.Path == resourceAPI+"/resourceslices":
			pool, ok := strings.CutPrefix(r.URL.Query().Get("fieldSelector"), "spec.driver="+DriverName+",spec.pool.name=")
			if !ok {
				http.Error(w, "field selector", http.StatusBadRequest)
				return
			}
			items := []ResourceSlice{}
			for _, s := range f.slices {
				if s.Spec.Pool.Name == pool {
					items = append(items, s)
				}
			}
			_ = json.NewEncoder(w).Encode(map[string]any{"items": items})
		case (r.Method == http.MethodPost && r.URL.Path == resourceAPI+"/resourceslices") || (r.Method == http.MethodPut && named):
			var s ResourceSlice
			if err := json.NewDecoder(r.Body).Decode(&s); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			old, exists := f.slices[s.Metadata.Name]
			if r.Method == http.MethodPost && exists || r.Method == http.MethodPut && (!exists || old.Metadata.ResourceVersion != s.Metadata.ResourceVersion) {
				http.Error(w, "conflict", http.StatusConflict)
				return
			}
			if f.dropShared {
				for i := range s.Spec.Devices {
					s.Spec.Devices[i].AllowMultipleAllocations = nil
					for k, c := range s.Spec.Devices[i].Capacity {
						c.RequestPolicy = nil
						s.Spec.Devices[i].Capacity[k] = c
					}
				}
			}
			f.version++
			s.Metadata.ResourceVersion = strconv.Itoa(f.version)
			f.slices[s.Metadata.Name] = s
			_ = json.NewEncoder(w).Encode(s)
		case r.Method == http.MethodDelete && named:
			delete(f.slices, name)
		default:
			http.Error(w, r.Method+" "+r.URL.String(), http.StatusNotFound)
		}
	}))
	srv.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte("tok\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := kubeapi.New(srv.URL, filepath.Join(dir, "token"), ca)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestPublish(t *testing.T) {
	r := newRig(t)
	stale := sliceOf(node, "node-uid", nil, 0, Offer{})
	stale.Metadata.Name = "left-by-an-older-agent"
	f := &sliceServer{slices: map[string]ResourceSlice{stale.Metadata.Name: stale}}
	p := &publisher{api: f.start(t), node: node}
	ctx := context.Background()
	gpus := r.d.refresh()

	s, err := p.publish(ctx, gpus)
	if err != nil {
		t.Fatal(err)
	}
	if err := shared(s, 2); err != nil {
		t.Error(err)
	}
	if len(f.slices) != 1 || s.Metadata.Name != node+"-gpu.gpuwarden.io" || s.Spec.Pool.Generation != 0 ||
		s.Metadata.OwnerReferences[0].UID != "node-uid" || s.Spec.NodeName != node {
		t.Errorf("slices %+v", f.slices)
	}
	// Unchanged: nothing written.
	v := f.version
	if _, err := p.publish(ctx, gpus); err != nil || f.version != v {
		t.Errorf("an unchanged slice was written again (%v)", err)
	}
	// A GPU gone: the slice follows, its pool's generation moved on.
	s, err = p.publish(ctx, gpus[:1])
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Spec.Devices) != 1 || s.Spec.Pool.Generation != 1 {
		t.Errorf("after a GPU left: %d devices, generation %d", len(s.Spec.Devices), s.Spec.Pool.Generation)
	}

	// A server without consumable capacity: the driver says which gate.
	f.dropShared = true
	s, err = p.publish(ctx, gpus)
	if err != nil {
		t.Fatal(err)
	}
	if err := shared(s, 2); err == nil || !strings.Contains(err.Error(), "feature gate DRAConsumableCapacity is off") {
		t.Errorf("shared capacity dropped: %v, want the gate named", err)
	}
}
