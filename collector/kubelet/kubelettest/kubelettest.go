// Package kubelettest is a test kubelet: it speaks the kubelet's real gRPC
// APIs over real unix sockets, with pods that the test sets.
package kubelettest

import (
	"context"
	"net"
	"path/filepath"
	"sync"
	"testing"

	"google.golang.org/grpc"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// Container is one container of a test pod and the devices it holds.
type Container struct {
	Name    string
	Devices map[string][]string // resource name -> device ids
}

// Pod is a test pod.
type Pod struct {
	Namespace, Name string
	Containers      []Container
}

// PodResources serves the pod-resources API.
type PodResources struct {
	podresourcesv1.UnimplementedPodResourcesListerServer
	Socket string

	mu   sync.Mutex
	pods []Pod
}

// StartPodResources serves the API on a socket in a temp dir until the test ends.
func StartPodResources(t testing.TB) *PodResources {
	t.Helper()
	s := &PodResources{Socket: filepath.Join(t.TempDir(), "kubelet.sock")}
	lis, err := net.Listen("unix", s.Socket)
	if err != nil {
		t.Fatalf("listen %s: %v", s.Socket, err)
	}
	srv := grpc.NewServer()
	podresourcesv1.RegisterPodResourcesListerServer(srv, s)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return s
}

// SetPods replaces the pods the kubelet reports.
func (s *PodResources) SetPods(pods ...Pod) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pods = pods
}

// List answers as the kubelet does.
func (s *PodResources) List(context.Context, *podresourcesv1.ListPodResourcesRequest) (*podresourcesv1.ListPodResourcesResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	resp := &podresourcesv1.ListPodResourcesResponse{}
	for _, p := range s.pods {
		pr := &podresourcesv1.PodResources{Name: p.Name, Namespace: p.Namespace}
		for _, c := range p.Containers {
			cr := &podresourcesv1.ContainerResources{Name: c.Name}
			for res, ids := range c.Devices {
				cr.Devices = append(cr.Devices, &podresourcesv1.ContainerDevices{ResourceName: res, DeviceIds: ids})
			}
			pr.Containers = append(pr.Containers, cr)
		}
		resp.PodResources = append(resp.PodResources, pr)
	}
	return resp, nil
}
