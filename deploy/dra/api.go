package dra

import "encoding/json"

// The part of resource.k8s.io/v1 the driver reads and writes, as the API
// server's JSON has it. The driver speaks to the API server through
// collector/kubeapi rather than client-go (see that package): these few
// types are all it needs.

const resourceAPI = "/apis/resource.k8s.io/v1"

type objectMeta struct {
	Name            string            `json:"name,omitempty"`
	Namespace       string            `json:"namespace,omitempty"`
	UID             string            `json:"uid,omitempty"`
	ResourceVersion string            `json:"resourceVersion,omitempty"`
	Labels          map[string]string `json:"labels,omitempty"`
	OwnerReferences []ownerReference  `json:"ownerReferences,omitempty"`
}

type ownerReference struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Name       string `json:"name"`
	UID        string `json:"uid"`
	Controller *bool  `json:"controller,omitempty"`
}

// ResourceSlice is a slice of the node's pool.
type ResourceSlice struct {
	APIVersion string     `json:"apiVersion"`
	Kind       string     `json:"kind"`
	Metadata   objectMeta `json:"metadata"`
	Spec       SliceSpec  `json:"spec"`
}

// SliceSpec is a ResourceSlice's spec: its devices are the node's
// (NodeName), or those of every node NodeSelector selects (a remote pool).
type SliceSpec struct {
	Driver       string        `json:"driver"`
	Pool         Pool          `json:"pool"`
	NodeName     string        `json:"nodeName,omitempty"`
	NodeSelector *NodeSelector `json:"nodeSelector,omitempty"`
	Devices      []Device      `json:"devices"`
}

// NodeSelector selects nodes by label; a slice's has exactly one term.
type NodeSelector struct {
	Terms []NodeSelectorTerm `json:"nodeSelectorTerms"`
}

// NodeSelectorTerm is requirements that must all hold.
type NodeSelectorTerm struct {
	MatchExpressions []LabelRequirement `json:"matchExpressions,omitempty"`
}

// LabelRequirement is one requirement on a node's label.
type LabelRequirement struct {
	Key      string   `json:"key"`
	Operator string   `json:"operator"`
	Values   []string `json:"values,omitempty"`
}

// Pool names the pool a slice is of; Generation moves with each change.
type Pool struct {
	Name               string `json:"name"`
	Generation         int64  `json:"generation"`
	ResourceSliceCount int64  `json:"resourceSliceCount"`
}

// Device is one device of a slice.
type Device struct {
	Name                     string               `json:"name"`
	Attributes               map[string]Attribute `json:"attributes,omitempty"`
	Capacity                 map[string]Capacity  `json:"capacity,omitempty"`
	AllowMultipleAllocations *bool                `json:"allowMultipleAllocations,omitempty"`
}

// Attribute is one of a device's attributes: a number or a string.
type Attribute struct {
	Int    *int64  `json:"int,omitempty"`
	String *string `json:"string,omitempty"`
}

// Capacity is how much of something a device has and how requests
// consume it.
type Capacity struct {
	Value         Quantity       `json:"value"`
	RequestPolicy *RequestPolicy `json:"requestPolicy,omitempty"`
}

// RequestPolicy is what a request that names no amount takes, and which
// amounts are valid.
type RequestPolicy struct {
	Default    *Quantity   `json:"default,omitempty"`
	ValidRange *ValidRange `json:"validRange,omitempty"`
}

// ValidRange bounds a request; Step rounds it up.
type ValidRange struct {
	Min  *Quantity `json:"min,omitempty"`
	Max  *Quantity `json:"max,omitempty"`
	Step *Quantity `json:"step,omitempty"`
}

// ResourceClaim is what the driver reads of a claim: who it is and what
// the scheduler allocated.
type ResourceClaim struct {
	Metadata objectMeta  `json:"metadata"`
	Status   ClaimStatus `json:"status"`
}

// ClaimStatus holds a claim's allocation, once it has one.
type ClaimStatus struct {
	Allocation *Allocation `json:"allocation,omitempty"`
}

// Allocation is the devices allocated to a claim and their configs.
type Allocation struct {
	Devices struct {
		Results []Result      `json:"results"`
		Config  []AllocConfig `json:"config,omitempty"`
	} `json:"devices"`
}

// Result is one allocated device: the request it is for, where it is, and
// how much of its capacities the claim consumes.
type Result struct {
	Request          string              `json:"request"`
	Driver           string              `json:"driver"`
	Pool             string              `json:"pool"`
	Device           string              `json:"device"`
	AdminAccess      *bool               `json:"adminAccess,omitempty"`
	ShareID          *string             `json:"shareID,omitempty"`
	ConsumedCapacity map[string]Quantity `json:"consumedCapacity,omitempty"`
}

// AllocConfig is a config of the claim's (or its class's) for some of its
// requests (all when Requests is empty).
type AllocConfig struct {
	Source   string   `json:"source"`
	Requests []string `json:"requests,omitempty"`
	Opaque   *Opaque  `json:"opaque,omitempty"`
}

// Opaque is a driver's own configuration: a ShareConfig for this driver.
type Opaque struct {
	Driver     string          `json:"driver"`
	Parameters json.RawMessage `json:"parameters"`
}
