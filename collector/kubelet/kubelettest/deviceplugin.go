package kubelettest

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// DevicePlugins is the kubelet's device manager, as plugins see it: the
// Registration service on kubelet.sock in a device-plugins directory; for
// each registration it dials the plugin's endpoint back and follows its
// ListAndWatch stream, as the kubelet does.
type DevicePlugins struct {
	Dir    string // the device-plugins directory
	Socket string // Dir/kubelet.sock

	t       testing.TB
	mu      sync.Mutex
	srv     *grpc.Server
	regs    []*pluginapi.RegisterRequest
	plugins map[string]*Plugin // by resource name: the latest registration
	changed chan struct{}
}

// Plugin is one registered resource's plugin.
type Plugin struct {
	Request *pluginapi.RegisterRequest
	Client  pluginapi.DevicePluginClient
	conn    *grpc.ClientConn
	cancel  context.CancelFunc
	devices []*pluginapi.Device
}

// StartDevicePlugins serves registration in a fresh directory until the test ends.
func StartDevicePlugins(t testing.TB) *DevicePlugins {
	t.Helper()
	// A unix socket path is at most 107 bytes: keep the directory short.
	dir, err := os.MkdirTemp("", "dp-")
	if err != nil {
		t.Fatal(err)
	}
	k := &DevicePlugins{Dir: dir, Socket: filepath.Join(dir, "kubelet.sock"),
		t: t, plugins: map[string]*Plugin{}, changed: make(chan struct{})}
	k.serve()
	t.Cleanup(func() {
		k.stop()
		os.RemoveAll(dir)
	})
	return k
}

func (k *DevicePlugins) serve() {
	lis, err := net.Listen("unix", k.Socket)
	if err != nil {
		k.t.Fatalf("listen %s: %v", k.Socket, err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(srv, registration{k: k})
	go func() { _ = srv.Serve(lis) }()
	k.mu.Lock()
	k.srv = srv
	k.mu.Unlock()
}

func (k *DevicePlugins) stop() {
	k.mu.Lock()
	srv := k.srv
	plugins := k.plugins
	k.plugins = map[string]*Plugin{}
	k.mu.Unlock()
	if srv != nil {
		srv.Stop()
	}
	for _, p := range plugins {
		p.cancel()
		p.conn.Close()
	}
}

// Restart does what a kubelet restart does to the directory: the old
// registration server goes, every socket in the directory is removed (its
// own and the plugins'), and a new kubelet.sock is served. Registrations
// start from none.
func (k *DevicePlugins) Restart() {
	k.stop()
	entries, _ := os.ReadDir(k.Dir)
	for _, e := range entries {
		if e.Type()&os.ModeSocket != 0 {
			os.Remove(filepath.Join(k.Dir, e.Name()))
		}
	}
	k.mu.Lock()
	k.regs = nil
	k.mu.Unlock()
	k.serve()
}

type registration struct {
	pluginapi.UnimplementedRegistrationServer
	k *DevicePlugins
}

// Register checks the request as the kubelet does, then connects to the plugin.
func (r registration) Register(_ context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k := r.k
	if !slices.Contains(pluginapi.SupportedVersions[:], req.GetVersion()) {
		return nil, fmt.Errorf("unsupported device plugin API version %q", req.GetVersion())
	}
	if req.GetResourceName() == "" || filepath.Base(req.GetEndpoint()) != req.GetEndpoint() {
		return nil, fmt.Errorf("bad registration %v", req)
	}
	conn, err := grpc.NewClient("unix://"+filepath.Join(k.Dir, req.GetEndpoint()), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Plugin{Request: req, Client: pluginapi.NewDevicePluginClient(conn), conn: conn, cancel: cancel}
	k.mu.Lock()
	k.regs = append(k.regs, req)
	if old := k.plugins[req.GetResourceName()]; old != nil {
		old.cancel()
		old.conn.Close()
	}
	k.plugins[req.GetResourceName()] = p
	k.notifyLocked()
	k.mu.Unlock()
	go k.follow(ctx, p)
	return &pluginapi.Empty{}, nil
}

// follow keeps the plugin's latest device list.
func (k *DevicePlugins) follow(ctx context.Context, p *Plugin) {
	stream, err := p.Client.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		return
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			return
		}
		k.mu.Lock()
		p.devices = resp.GetDevices()
		k.notifyLocked()
		k.mu.Unlock()
	}
}

func (k *DevicePlugins) notifyLocked() {
	close(k.changed)
	k.changed = make(chan struct{})
}

// Registrations returns every registration since the start or the last restart.
func (k *DevicePlugins) Registrations() []*pluginapi.RegisterRequest {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.regs)
}

// Client returns the registered plugin of a resource, waiting for it.
func (k *DevicePlugins) Client(t testing.TB, resource string) pluginapi.DevicePluginClient {
	t.Helper()
	var c pluginapi.DevicePluginClient
	k.Wait(t, "registration of "+resource, func() bool {
		k.mu.Lock()
		defer k.mu.Unlock()
		if p := k.plugins[resource]; p != nil {
			c = p.Client
			return true
		}
		return false
	})
	return c
}

// Devices returns the latest device list of a resource (nil if none yet).
func (k *DevicePlugins) Devices(resource string) []*pluginapi.Device {
	k.mu.Lock()
	defer k.mu.Unlock()
	if p := k.plugins[resource]; p != nil {
		return p.devices
	}
	return nil
}

// WaitDevices waits until a resource's device list satisfies ok, and returns it.
func (k *DevicePlugins) WaitDevices(t testing.TB, resource string, ok func([]*pluginapi.Device) bool) []*pluginapi.Device {
	t.Helper()
	var devs []*pluginapi.Device
	k.Wait(t, "devices of "+resource, func() bool {
		devs = k.Devices(resource)
		return devs != nil && ok(devs)
	})
	return devs
}

// Wait waits up to 10 s for cond, checked at every change the kubelet sees
// (a registration, a device list) and every 100 ms.
func (k *DevicePlugins) Wait(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		k.mu.Lock()
		ch := k.changed
		k.mu.Unlock()
		if cond() {
			return
		}
		select {
		case <-ch:
		case <-time.After(100 * time.Millisecond):
		case <-deadline:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}
