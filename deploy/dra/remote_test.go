package dra

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuwarden/gpuwarden/deploy/allocation"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/relay"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/session"
)

const (
	pool       = "rack-1"
	serverNode = "gpu-node-b"
	serverAddr = "gpu-node-b:7070"
)

func TestPublishToRemotePool(t *testing.T) {
	r := newRig(t)
	own := sliceOf(node, "node-uid", nil, 0, Offer{}) // published before the node served sessions
	f := &sliceServer{slices: map[string]ResourceSlice{own.Metadata.Name: own}}
	p := &publisher{api: f.start(t), node: node, offer: Offer{Pool: pool, Server: serverAddr}}
	ctx := context.Background()
	gpus := r.d.refresh()

	// The node is not of the pool it offers its GPUs to: its own pods could
	// not have them. Nothing is written.
	if _, err := p.publish(ctx, gpus); err == nil || !strings.Contains(err.Error(), RemotePoolLabel+"="+pool) {
		t.Fatalf("publish from a node without the pool's label: %v, want the label named", err)
	}
	if f.version != 0 {
		t.Error("a slice was written for a node outside its pool")
	}

	f.nodeLabels = map[string]string{RemotePoolLabel: pool}
	s, err := p.publish(ctx, gpus)
	if err != nil {
		t.Fatal(err)
	}
	if s.Spec.NodeName != "" || s.Spec.NodeSelector == nil || len(f.slices) != 1 {
		t.Fatalf("slice %+v: want the node-name slice replaced by one with a node selector", s.Spec)
	}
	term := s.Spec.NodeSelector.Terms
	if len(term) != 1 || len(term[0].MatchExpressions) != 1 || term[0].MatchExpressions[0].Key != RemotePoolLabel ||
		term[0].MatchExpressions[0].Operator != "In" || strings.Join(term[0].MatchExpressions[0].Values, ",") != pool {
		t.Errorf("node selector %+v", s.Spec.NodeSelector)
	}
	for _, d := range s.Spec.Devices {
		if a := d.Attributes[AttributeServer]; a.String == nil || *a.String != serverAddr {
			t.Errorf("device %s: server attribute %+v, want %s", d.Name, a, serverAddr)
		}
	}
	if err := shared(s, 2); err != nil {
		t.Error(err)
	}
}

// remoteRig is a node without GPUs in pool, whose API server holds the
// slice of serverNode offering its GPU 0 (15 GiB, 4 slots) to pool.
type remoteRig struct {
	*rig
	relayed, released []string
	lib               string
}

func newRemoteRig(t *testing.T, offeredTo string) *remoteRig {
	t.Helper()
	r := &remoteRig{rig: newRig(t), lib: t.TempDir()}
	if err := os.WriteFile(filepath.Join(r.lib, "libcuda.so.1"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	rl := relay.New(relay.Config{ControlDir: r.control, Log: slog.Default()})
	t.Cleanup(func() { rl.Close() })
	r.d.cfg.Remote = &Remote{Pool: pool, LibDir: r.lib,
		Relay:   func(dir string) error { r.relayed = append(r.relayed, dir); return rl.Listen(dir) },
		Release: func(dir string) error { r.released = append(r.released, dir); return rl.Release(dir) }}
	srv := sliceOf(serverNode, "uid-b", []GPU{{GPU: allocation.GPU{UUID: "GPU-remote", Index: 0, MemoryBytes: uint64(15 * gib), MaxInst: 4},
		Model: "simgpu"}}, 3, Offer{Pool: offeredTo, Server: serverAddr})
	f := &sliceServer{slices: map[string]ResourceSlice{srv.Metadata.Name: srv}}
	r.d.api = f.start(t)
	return r
}

// remoteClaim is a claim allocated serverNode's GPU 0.
func remoteClaim(memGiB, compute int64, configs ...string) *ResourceClaim {
	c := claim(uidA, "gpu-0", memGiB, compute, configs...)
	c.Status.Allocation.Devices.Results[0].Pool = serverNode
	return c
}

func TestPrepareRemoteClaim(t *testing.T) {
	r := newRemoteRig(t, pool)
	ctx := context.Background()
	devs, err := r.d.Prepare(ctx, remoteClaim(6, 50, `{"apiVersion": "`+share+`", "kind": "ShareConfig", "weight": 3}`))
	if err != nil {
		t.Fatal(err)
	}
	dirName := allocation.ClaimDirName(uidA, "gpu-0")
	if len(devs) != 1 || devs[0].Pool != serverNode || devs[0].CDIDevice != cdiKind+"="+dirName {
		t.Fatalf("devices %+v", devs)
	}
	g, err := session.ReadGrant(filepath.Join(r.control, dirName, session.GrantFile))
	if err != nil {
		t.Fatal(err)
	}
	if g != (session.Grant{Server: serverAddr, GPU: "GPU-remote", MemoryBytes: uint64(6 * gib), Weight: 3}) {
		t.Errorf("grant %+v", g)
	}
	if strings.Join(r.relayed, ",") != dirName {
		t.Errorf("relayed %v, want %s", r.relayed, dirName)
	}
	if fi, err := os.Stat(filepath.Join(r.control, dirName, session.RelayDir, session.RelaySocket)); err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Errorf("relay socket: %v", err)
	}
	if _, err := os.Stat(filepath.Join(r.control, dirName, "limits")); !os.IsNotExist(err) {
		t.Errorf("a remote claim got a local control block: %v", err)
	}
	if len(r.settings) != 0 {
		t.Errorf("a remote claim's settings were saved for the local enforcer: %v", r.settings)
	}
	spec := r.spec(t, uidA)
	env := strings.Join(spec.Devices[0].Edits.Env, " ")
	if !strings.Contains(env, "GPUWARDEN_REMOTE=unix:"+allocation.ContainerRemoteDir+"/"+session.RelaySocket) ||
		!strings.Contains(env, "LD_LIBRARY_PATH="+allocation.ContainerRemoteLib) || strings.Contains(env, "LD_PRELOAD") {
		t.Errorf("env %q", env)
	}
	mounts := mountsOf(spec.Devices[0])
	if m := mounts[allocation.ContainerRemoteDir]; m.HostPath != filepath.Join(r.control, dirName, session.RelayDir) || m.Options[1] != "ro" {
		t.Errorf("relay mount %+v", m)
	}
	if m := mounts[allocation.ContainerRemoteLib]; m.HostPath != r.lib || m.Options[1] != "ro" {
		t.Errorf("library mount %+v", m)
	}

	// Asked again (a kubelet restart): the grant the relay serves stays.
	before, _ := os.Stat(filepath.Join(r.control, dirName, session.GrantFile))
	if _, err := r.d.Prepare(ctx, remoteClaim(6, 50)); err != nil {
		t.Fatal(err)
	}
	after, _ := os.Stat(filepath.Join(r.control, dirName, session.GrantFile))
	if !os.SameFile(before, after) {
		t.Error("a second prepare replaced the grant")
	}

	if err := r.d.Unprepare(uidA); err != nil {
		t.Fatal(err)
	}
	if strings.Join(r.released, ",") != dirName {
		t.Errorf("released %v, want %s", r.released, dirName)
	}
	if _, err := os.Stat(filepath.Join(r.control, dirName)); !os.IsNotExist(err) {
		t.Errorf("control directory left: %v", err)
	}
}

func TestRefusedRemoteClaimsWriteNothing(t *testing.T) {
	cases := []struct {
		name      string
		offeredTo string
		c         *ResourceClaim
		why       string
	}{
		{"another pool's device", "rack-2", remoteClaim(1, 25), "no slice offers it to remote pool " + pool},
		{"no such device", pool, func() *ResourceClaim {
			c := remoteClaim(1, 25)
			c.Status.Allocation.Devices.Results[0].Device = "gpu-3"
			return c
		}(), "no slice offers it"},
		{"compute cap", pool, remoteClaim(1, 25, `{"apiVersion": "`+share+`", "kind": "ShareConfig", "computeLimit": 50}`),
			"computeLimit is not offered on a remote GPU"},
		{"over the GPU", pool, remoteClaim(16, 25), "consumed memory 16Gi"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newRemoteRig(t, tc.offeredTo)
			r.refused(t, tc.c, tc.why)
			if len(r.relayed) != 0 {
				t.Errorf("relayed %v after a refusal", r.relayed)
			}
		})
	}
}

func TestRemoteDeviceAttributes(t *testing.T) {
	g := GPU{GPU: allocation.GPU{UUID: "GPU-x", Index: 1, MemoryBytes: uint64(gib), MaxInst: 2}}
	good := DeviceOf(g, serverAddr)
	if got, server, err := remoteDeviceGPU("p", good); err != nil || server != serverAddr || got.GPU != g.GPU {
		t.Fatalf("remoteDeviceGPU: %+v %q %v", got, server, err)
	}
	for name, mutate := range map[string]func(d *Device){
		"no server":   func(d *Device) { delete(d.Attributes, AttributeServer) },
		"bad server":  func(d *Device) { s := "host:99999"; d.Attributes[AttributeServer] = Attribute{String: &s} },
		"no uuid":     func(d *Device) { delete(d.Attributes, "uuid") },
		"bad maxInst": func(d *Device) { n := int64(0); d.Attributes["maxInst"] = Attribute{Int: &n} },
		"no memory":   func(d *Device) { delete(d.Capacity, CapacityMemory) },
	} {
		d := DeviceOf(g, serverAddr)
		mutate(&d)
		if _, _, err := remoteDeviceGPU("p", d); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestCheckPoolName(t *testing.T) {
	for _, ok := range []string{"a", "rack-1", "eu.west_2", strings.Repeat("x", 63)} {
		if err := CheckPoolName(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "-a", "a-", "a/b", "a b", strings.Repeat("x", 64)} {
		if err := CheckPoolName(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
