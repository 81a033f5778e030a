package dra

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"google.golang.org/grpc"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
)

// The driver's two sockets: registration in the kubelet's plugin
// registration directory (the kubelet watches it and asks GetInfo), the DRA
// service in the driver's own plugin directory (where GetInfo points).
const (
	registrationSocket = DriverName + "-reg.sock"
	draSocket          = "dra.sock"
)

// kubeletPlugin serves the kubelet: plugin registration and the DRA
// service, v1.
type kubeletPlugin struct {
	d                    *Driver
	regPath, draPath     string
	regServer, draServer *grpc.Server
	regID, draID         controlblock.FileID
}

type registration struct {
	registerapi.UnimplementedRegistrationServer
	k *kubeletPlugin
}

type draService struct {
	drapb.UnimplementedDRAPluginServer
	k *kubeletPlugin
}

func startKubeletPlugin(d *Driver) (*kubeletPlugin, error) {
	k := &kubeletPlugin{d: d, regPath: filepath.Join(d.cfg.RegistrarDir, registrationSocket),
		draPath: filepath.Join(d.cfg.PluginDir, draSocket)}
	if err := k.serve(); err != nil {
		k.stop()
		return nil, err
	}
	return k, nil
}

// serve starts both servers on fresh sockets, the DRA service first, so
// the kubelet never finds the registration before what it points at.
func (k *kubeletPlugin) serve() error {
	k.stop()
	var err error
	if k.draServer, k.draID, err = listen(k.draPath, func(g *grpc.Server) { drapb.RegisterDRAPluginServer(g, &draService{k: k}) }); err != nil {
		return fmt.Errorf("DRA service: %w", err)
	}
	if k.regServer, k.regID, err = listen(k.regPath, func(g *grpc.Server) { registerapi.RegisterRegistrationServer(g, &registration{k: k}) }); err != nil {
		return fmt.Errorf("plugin registration: %w", err)
	}
	return nil
}

// check serves again when a socket is gone or replaced (a kubelet that
// restarts may clear its directories).
func (k *kubeletPlugin) check() error {
	if id, ok := controlblock.StatFile(k.regPath); ok && id == k.regID {
		if id, ok := controlblock.StatFile(k.draPath); ok && id == k.draID {
			return nil
		}
	}
	k.d.log.Info("a kubelet plugin socket is gone; serving again")
	return k.serve()
}

func (k *kubeletPlugin) stop() {
	for _, g := range []*grpc.Server{k.regServer, k.draServer} {
		if g != nil {
			g.Stop()
		}
	}
	k.regServer, k.draServer = nil, nil
}

func listen(path string, register func(*grpc.Server)) (*grpc.Server, controlblock.FileID, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, controlblock.FileID{}, err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, controlblock.FileID{}, fmt.Errorf("remove stale socket: %w", err)
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, controlblock.FileID{}, err
	}
	id, _ := controlblock.StatFile(path)
	g := grpc.NewServer()
	register(g)
	go func() { _ = g.Serve(lis) }()
	return g, id, nil
}

func (r *registration) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{Type: registerapi.DRAPlugin, Name: DriverName, Endpoint: r.k.draPath,
		SupportedVersions: []string{drapb.DRAPluginService}}, nil
}

func (r *registration) NotifyRegistrationStatus(_ context.Context, s *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if s.PluginRegistered {
		r.k.d.log.Info("registered with the kubelet")
	} else {
		r.k.d.log.Error("the kubelet refused the registration", "err", s.Error)
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

// NodePrepareResources prepares each claim on its own, as the API server
// holds it now: one that cannot be read, is not allocated, or was replaced
// (another UID under its name) fails alone.
func (s *draService) NodePrepareResources(ctx context.Context, req *drapb.NodePrepareResourcesRequest) (*drapb.NodePrepareResourcesResponse, error) {
	resp := &drapb.NodePrepareResourcesResponse{Claims: map[string]*drapb.NodePrepareResourceResponse{}}
	for _, c := range req.Claims {
		devs, err := s.prepareOne(ctx, c)
		if err != nil {
			s.k.d.log.Warn("claim refused", "claim", c.Namespace+"/"+c.Name, "uid", c.Uid, "err", err)
			resp.Claims[c.Uid] = &drapb.NodePrepareResourceResponse{Error: DriverName + ": " + err.Error()}
			continue
		}
		out := &drapb.NodePrepareResourceResponse{}
		for _, p := range devs {
			out.Devices = append(out.Devices, &drapb.Device{RequestNames: []string{baseRequest(p.Request)},
				PoolName: p.Pool, DeviceName: p.Device, CdiDeviceIds: []string{p.CDIDevice}, ShareId: p.ShareID})
		}
		resp.Claims[c.Uid] = out
	}
	return resp, nil
}

func (s *draService) prepareOne(ctx context.Context, c *drapb.Claim) ([]Prepared, error) {
	var claim ResourceClaim
	path := resourceAPI + "/namespaces/" + url.PathEscape(c.Namespace) + "/resourceclaims/" + url.PathEscape(c.Name)
	if err := s.k.d.api.Do(ctx, http.MethodGet, path, nil, &claim); err != nil {
		return nil, fmt.Errorf("read claim %s/%s: %w", c.Namespace, c.Name, err)
	}
	if claim.Metadata.UID != c.Uid {
		return nil, fmt.Errorf("claim %s/%s was replaced: UID %s, the kubelet asks for %s", c.Namespace, c.Name, claim.Metadata.UID, c.Uid)
	}
	return s.k.d.Prepare(ctx, &claim)
}

// NodeUnprepareResources removes what prepare wrote for each claim; the
// claim object may be gone already, and is not read.
func (s *draService) NodeUnprepareResources(_ context.Context, req *drapb.NodeUnprepareResourcesRequest) (*drapb.NodeUnprepareResourcesResponse, error) {
	resp := &drapb.NodeUnprepareResourcesResponse{Claims: map[string]*drapb.NodeUnprepareResourceResponse{}}
	for _, c := range req.Claims {
		out := &drapb.NodeUnprepareResourceResponse{}
		if err := s.k.d.Unprepare(c.Uid); err != nil {
			s.k.d.log.Warn("claim not unprepared", "claim", c.Namespace+"/"+c.Name, "uid", c.Uid, "err", err)
			out.Error = err.Error()
		} else {
			s.k.d.log.Info("claim unprepared", "claim", c.Namespace+"/"+c.Name, "uid", c.Uid)
		}
		resp.Claims[c.Uid] = out
	}
	return resp, nil
}

// baseRequest is a subrequest's request ("gpu/small" is of "gpu"), as the
// kubelet matches containers' claims by request.
func baseRequest(name string) string {
	base, _, _ := strings.Cut(name, "/")
	return base
}
