package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuwarden/gpuwarden/deploy/allocation"
	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
)

// kubeletSocket is the kubelet's registration socket in its device-plugins directory.
const kubeletSocket = "kubelet.sock"

// Endpoint is the socket file name of a resource's plugin in the kubelet's
// device-plugins directory.
func Endpoint(k allocation.Kind) string {
	return "gpuwarden-" + strings.TrimPrefix(k.Resource(), "gpuwarden.io/") + ".sock"
}

// server is one resource's plugin: a gRPC server on its own socket.
type server struct {
	pluginapi.UnimplementedDevicePluginServer
	p          *Plugin
	kind       allocation.Kind
	endpoint   string
	socket     string
	grpc       *grpc.Server
	id         controlblock.FileID // the socket file this server made
	registered bool
}

func newServer(p *Plugin, k allocation.Kind) *server {
	s := &server{p: p, kind: k, endpoint: Endpoint(k)}
	s.socket = filepath.Join(p.cfg.KubeletDir, s.endpoint)
	return s
}

// start serves on a fresh socket (a stale file at the path is removed).
func (s *server) start() error {
	s.stop()
	if err := os.Remove(s.socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale socket: %w", err)
	}
	lis, err := net.Listen("unix", s.socket)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	s.id, _ = controlblock.StatFile(s.socket)
	s.grpc = grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(s.grpc, s)
	go func(g *grpc.Server) { _ = g.Serve(lis) }(s.grpc)
	return nil
}

// alive says whether the server runs and its socket is still the one it made
// (the kubelet removes every plugin socket when it starts).
func (s *server) alive() bool {
	if s.grpc == nil {
		return false
	}
	id, ok := controlblock.StatFile(s.socket)
	return ok && id == s.id
}

// stop stops serving and removes the socket if it is still ours.
func (s *server) stop() {
	if s.grpc == nil {
		return
	}
	s.grpc.Stop()
	s.grpc = nil
	if id, ok := controlblock.StatFile(s.socket); ok && id == s.id {
		os.Remove(s.socket)
	}
}

// register tells the kubelet about this resource.
func (s *server) register(ctx context.Context, kubelet string) error {
	conn, err := grpc.NewClient("unix://"+kubelet, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("kubelet socket %s: %w", kubelet, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     s.endpoint,
		ResourceName: s.kind.Resource(),
		Options:      options(),
	})
	return err
}

func options() *pluginapi.DevicePluginOptions {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}
}

// GetDevicePluginOptions: preferred allocation yes, PreStartContainer no.
func (s *server) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return options(), nil
}

// ListAndWatch sends the device list now and again at every change.
func (s *server) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	for {
		gpus, changed := s.p.snapshot()
		if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: s.list(gpus)}); err != nil {
			return err
		}
		select {
		case <-stream.Context().Done():
			return nil
		case <-changed:
		}
	}
}

// list is the kubelet's view of this resource's devices.
func (s *server) list(gpus []gpuState) []*pluginapi.Device {
	var out []*pluginapi.Device
	for _, g := range gpus {
		health := pluginapi.Healthy
		if !g.healthy {
			health = pluginapi.Unhealthy
		}
		for _, id := range allocation.IDs(g.GPU, s.kind) {
			out = append(out, &pluginapi.Device{ID: id, Health: health})
		}
	}
	return out
}

// GetPreferredAllocation keeps each container's devices on one GPU.
func (s *server) GetPreferredAllocation(_ context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, cr := range req.GetContainerRequests() {
		ids, err := allocation.Preferred(cr.GetAvailableDeviceIDs(), cr.GetMustIncludeDeviceIDs(), int(cr.GetAllocationSize()))
		if err != nil {
			return nil, status.Errorf(codes.ResourceExhausted, "%s: %d on one GPU: %v", s.kind.Resource(), cr.GetAllocationSize(), err)
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return resp, nil
}

// Allocate gives each container its GPU, limits and control block.
func (s *server) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, cr := range req.GetContainerRequests() {
		car, err := s.p.allocate(s.kind, cr.GetDevicesIds())
		if err != nil {
			s.p.log.Warn("allocate refused", "resource", s.kind.Resource(), "devices", cr.GetDevicesIds(), "err", err)
			return nil, status.Errorf(codes.InvalidArgument, "%s: %v", s.kind.Resource(), err)
		}
		resp.ContainerResponses = append(resp.ContainerResponses, car)
	}
	return resp, nil
}

// PreStartContainer is not required (GetDevicePluginOptions says so).
func (s *server) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}
