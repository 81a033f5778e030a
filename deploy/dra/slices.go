package dra

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"reflect"
	"strconv"

	"github.com/gpuwarden/gpuwarden/collector/kubeapi"
	"github.com/gpuwarden/gpuwarden/deploy/allocation"
)

// The capacities each GPU device offers, consumed by every claim allocated
// on it: memory in bytes, compute in percent of the GPU.
const (
	CapacityMemory  = "memory"
	CapacityCompute = "compute"
	fullCompute     = 100
	mib             = 1 << 20
)

// A remote pool is the nodes labelled RemotePoolLabel=<pool>: a GPU node of
// the pool that serves remote sessions offers its GPUs to all of them,
// itself included, each GPU one device whose AttributeServer says where
// its sessions are served. Local and remote claims of a GPU then consume
// one device's capacities, and the cluster's scheduler, not each node,
// decides how much of it is promised.
const (
	RemotePoolLabel = "gpu.gpuwarden.io/remote-pool"
	AttributeServer = "server"
)

// GPU is one of the node's GPUs as the driver offers it.
type GPU struct {
	allocation.GPU
	Model string
}

// deviceName is a GPU's device name in the node's ResourceSlice.
func deviceName(index int) string { return "gpu-" + strconv.Itoa(index) }

// DeviceOf is GPU g as a device of the node's pool: shareable, with its
// identity as attributes and its memory and compute as capacities whose
// default request is one slot, so a claim that asks for nothing gets what
// a gpuwarden.io/gpu slot gives. server, when set, is where the GPU's
// remote sessions are served (AttributeServer).
func DeviceOf(g GPU, server string) Device {
	str := func(s string) Attribute { return Attribute{String: &s} }
	num := func(n int) Attribute { v := int64(n); return Attribute{Int: &v} }
	q := func(n int64) *Quantity { v := Quantity(n); return &v }
	allow := true
	attrs := map[string]Attribute{"uuid": str(g.UUID), "index": num(g.Index), "model": str(g.Model), "maxInst": num(g.MaxInst)}
	if server != "" {
		attrs[AttributeServer] = str(server)
	}
	return Device{
		Name:                     deviceName(g.Index),
		AllowMultipleAllocations: &allow,
		Attributes:               attrs,
		Capacity: map[string]Capacity{
			CapacityMemory: {Value: Quantity(g.MemoryBytes), RequestPolicy: &RequestPolicy{
				Default: q(int64(allocation.SlotMemory(g.GPU))), ValidRange: &ValidRange{Min: q(mib), Step: q(mib)}}},
			CapacityCompute: {Value: fullCompute, RequestPolicy: &RequestPolicy{
				Default: q(int64(max(1, fullCompute/g.MaxInst))), ValidRange: &ValidRange{Min: q(1), Max: q(fullCompute), Step: q(1)}}},
		},
	}
}

// sliceName is the node's one slice.
func sliceName(node string) string { return node + "-" + DriverName }

// Offer is to whom the node's GPUs are offered: the node alone (zero), or
// every node of remote pool Pool, their sessions served at Server.
type Offer struct {
	Pool   string // RemotePoolLabel's value on the pool's nodes
	Server string // HOST:PORT, as the node's certificate names it
}

// poolSelector selects the nodes of remote pool pool.
func poolSelector(pool string) *NodeSelector {
	return &NodeSelector{Terms: []NodeSelectorTerm{{MatchExpressions: []LabelRequirement{
		{Key: RemotePoolLabel, Operator: "In", Values: []string{pool}}}}}}
}

// sliceOf is the node's slice for gpus: one pool named after the node, one
// device per GPU, owned by the node object (uid), so it goes with the node;
// offered to the node alone, or to a remote pool's nodes.
func sliceOf(node string, uid string, gpus []GPU, generation int64, offer Offer) ResourceSlice {
	devs := make([]Device, 0, len(gpus))
	for _, g := range gpus {
		devs = append(devs, DeviceOf(g, offer.Server))
	}
	controller := true
	spec := SliceSpec{Driver: DriverName, NodeName: node, Devices: devs,
		Pool: Pool{Name: node, Generation: generation, ResourceSliceCount: 1}}
	if offer.Pool != "" {
		spec.NodeName, spec.NodeSelector = "", poolSelector(offer.Pool)
	}
	return ResourceSlice{APIVersion: "resource.k8s.io/v1", Kind: "ResourceSlice",
		Metadata: objectMeta{Name: sliceName(node), OwnerReferences: []ownerReference{
			{APIVersion: "v1", Kind: "Node", Name: node, UID: uid, Controller: &controller}}},
		Spec: spec}
}

// publisher keeps the node's slice in the API server what the node has.
type publisher struct {
	api   *kubeapi.Client
	node  string
	offer Offer
	uid   string // the node object's, for the owner reference
}

// poolSlices lists the driver's slices of pool (a node's pool is named
// after the node).
func poolSlices(ctx context.Context, api *kubeapi.Client, pool string) ([]ResourceSlice, error) {
	var list struct {
		Items []ResourceSlice `json:"items"`
	}
	q := url.QueryEscape("spec.driver=" + DriverName + ",spec.pool.name=" + pool)
	if err := api.Do(ctx, http.MethodGet, resourceAPI+"/resourceslices?fieldSelector="+q, nil, &list); err != nil {
		return nil, fmt.Errorf("list the ResourceSlices of pool %s: %w", pool, err)
	}
	return list.Items, nil
}

// readNode reads the node's UID, and checks that a node offering its GPUs
// to a remote pool is of that pool: its own claims could not be allocated
// its GPUs otherwise.
func (p *publisher) readNode(ctx context.Context) error {
	if p.uid != "" && p.offer.Pool == "" {
		return nil
	}
	var node struct {
		Metadata objectMeta `json:"metadata"`
	}
	if err := p.api.Do(ctx, http.MethodGet, "/api/v1/nodes/"+url.PathEscape(p.node), nil, &node); err != nil {
		return fmt.Errorf("read node %s: %w", p.node, err)
	}
	p.uid = node.Metadata.UID
	if pool := p.offer.Pool; pool != "" && node.Metadata.Labels[RemotePoolLabel] != pool {
		return fmt.Errorf("node %s is not labelled %s=%s (dra.remotePool): its GPUs are offered to that pool's nodes alone, "+
			"so its own pods could not be allocated them; label it", p.node, RemotePoolLabel, pool)
	}
	return nil
}

// publish makes the node's slice hold gpus: created, or updated with the
// pool's generation moved on when its devices differ; any other slice of
// the driver on the node (an older agent's) is deleted. It returns the
// slice as the API server holds it.
func (p *publisher) publish(ctx context.Context, gpus []GPU) (ResourceSlice, error) {
	if err := p.readNode(ctx); err != nil {
		return ResourceSlice{}, err
	}
	have, err := poolSlices(ctx, p.api, p.node)
	if err != nil {
		return ResourceSlice{}, err
	}
	want := sliceOf(p.node, p.uid, gpus, 0, p.offer)
	var cur *ResourceSlice
	for i := range have {
		// A slice's node name is immutable: one offered the other way
		// goes, and is made anew.
		if have[i].Metadata.Name == sliceName(p.node) && have[i].Spec.NodeName == want.Spec.NodeName {
			cur = &have[i]
			continue
		}
		if err := p.api.Do(ctx, http.MethodDelete, resourceAPI+"/resourceslices/"+url.PathEscape(have[i].Metadata.Name), nil, nil); err != nil && !kubeapi.IsNotFound(err) {
			return ResourceSlice{}, fmt.Errorf("delete stale ResourceSlice %s: %w", have[i].Metadata.Name, err)
		}
	}
	var out ResourceSlice
	if cur == nil {
		err = p.api.Do(ctx, http.MethodPost, resourceAPI+"/resourceslices", want, &out)
		if err != nil {
			return ResourceSlice{}, fmt.Errorf("create ResourceSlice: %w", err)
		}
		return out, nil
	}
	if sameDevices(cur.Spec.Devices, want.Spec.Devices) && reflect.DeepEqual(cur.Spec.NodeSelector, want.Spec.NodeSelector) {
		return *cur, nil
	}
	want.Metadata.ResourceVersion = cur.Metadata.ResourceVersion
	want.Spec.Pool.Generation = cur.Spec.Pool.Generation + 1
	if err := p.api.Do(ctx, http.MethodPut, resourceAPI+"/resourceslices/"+url.PathEscape(want.Metadata.Name), want, &out); err != nil {
		return ResourceSlice{}, fmt.Errorf("update ResourceSlice: %w", err)
	}
	return out, nil
}

// sameDevices compares two device lists (quantities are compared by
// value, as they are held).
func sameDevices(a, b []Device) bool { return reflect.DeepEqual(a, b) }

// shared checks that a slice as the API server holds it still makes the
// devices shareable: a server without consumable capacity drops
// allowMultipleAllocations and the request policies, and claims would then
// get whole GPUs, one each.
func shared(s ResourceSlice, n int) error {
	if len(s.Spec.Devices) != n {
		return fmt.Errorf("the node's ResourceSlice holds %d devices, %d published", len(s.Spec.Devices), n)
	}
	for _, d := range s.Spec.Devices {
		if d.AllowMultipleAllocations == nil || d.Capacity[CapacityMemory].RequestPolicy == nil {
			return fmt.Errorf("the API server dropped device %s's shared capacity: "+
				"feature gate DRAConsumableCapacity is off (Kubernetes 1.36 or later has it on)", d.Name)
		}
	}
	return nil
}
