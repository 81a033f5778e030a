// Package kubelet asks the kubelet's pod-resources API (gRPC over its unix
// socket) which pod and container each allocated device went to.
package kubelet

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// DefaultPodResourcesSocket is where the kubelet serves the pod-resources API.
const DefaultPodResourcesSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"

// Assignment says that a container holds devices of one resource.
type Assignment struct {
	Namespace, Pod, Container string
	Resource                  string   // "gpuwarden.io/gpu"; a DRA driver's name for a claim's device
	DeviceIDs                 []string // as the device plugin advertised them; a claim device's CDI device ids
}

// PodResources is a client of the kubelet's pod-resources API.
type PodResources struct {
	conn   *grpc.ClientConn
	client podresourcesv1.PodResourcesListerClient
}

// DialPodResources connects to the API on a unix socket. Connecting is lazy:
// a kubelet that is not up yet is an error of the first List, not of this.
func DialPodResources(socket string) (*PodResources, error) {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("pod-resources socket %s: %w", socket, err)
	}
	return &PodResources{conn: conn, client: podresourcesv1.NewPodResourcesListerClient(conn)}, nil
}

// Close closes the connection.
func (p *PodResources) Close() error { return p.conn.Close() }

// List returns every container's device assignments for resources whose
// name satisfies keep, and its DRA claims' devices of drivers whose name
// does (one assignment per claim device, its CDI device ids as the ids).
func (p *PodResources) List(ctx context.Context, keep func(resource string) bool) ([]Assignment, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := p.client.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	if err != nil {
		return nil, fmt.Errorf("list pod resources: %w", err)
	}
	var out []Assignment
	for _, pod := range resp.GetPodResources() {
		for _, c := range pod.GetContainers() {
			for _, d := range c.GetDevices() {
				if !keep(d.GetResourceName()) {
					continue
				}
				out = append(out, Assignment{
					Namespace: pod.GetNamespace(), Pod: pod.GetName(), Container: c.GetName(),
					Resource: d.GetResourceName(), DeviceIDs: d.GetDeviceIds(),
				})
			}
			for _, dr := range c.GetDynamicResources() {
				for _, r := range dr.GetClaimResources() {
					if !keep(r.GetDriverName()) {
						continue
					}
					a := Assignment{Namespace: pod.GetNamespace(), Pod: pod.GetName(), Container: c.GetName(),
						Resource: r.GetDriverName()}
					for _, cdi := range r.GetCdiDevices() {
						a.DeviceIDs = append(a.DeviceIDs, cdi.GetName())
					}
					out = append(out, a)
				}
			}
		}
	}
	return out, nil
}
