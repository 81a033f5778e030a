package collector

import (
	"sort"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/agentapi"
)

// View is everything the agent knows at one moment.
type View struct {
	Node       string                     `json:"node"`
	Time       time.Time                  `json:"time"`
	Devices    []agentapi.Device          `json:"devices"`
	Containers []agentapi.ContainerDevice `json:"containers"`
	Sources    []agentapi.SourceState     `json:"sources"`
	BadLedgers []agentapi.BadLedger       `json:"badLedgers,omitempty"`
	Refused    []agentapi.RefusedLedger   `json:"refusedLedgers,omitempty"`

	probeEvents, probeLost uint64
	probesOn               bool
	gen                    uint64 // which view joined this is: a view served again keeps it
}

func (v *View) sort() {
	sort.Slice(v.Devices, func(i, j int) bool { return v.Devices[i].Index < v.Devices[j].Index })
	sort.Sort(byContainer{v.Containers, containerNames(v.Containers)})
	sort.Slice(v.Sources, func(i, j int) bool { return v.Sources[i].Name < v.Sources[j].Name })
}

// containerNames are the containers' "namespace/pod/container", made once
// for a sort rather than at each comparison.
func containerNames(cs []agentapi.ContainerDevice) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.Namespace + "/" + c.Pod + "/" + c.Container
	}
	return out
}

// byContainer orders containers by GPU, name, then cgroup.
type byContainer struct {
	cs    []agentapi.ContainerDevice
	names []string
}

func (b byContainer) Len() int { return len(b.cs) }

func (b byContainer) Less(i, j int) bool {
	x, y := &b.cs[i], &b.cs[j]
	if x.GPU != y.GPU {
		return x.GPU < y.GPU
	}
	if b.names[i] != b.names[j] {
		return b.names[i] < b.names[j]
	}
	return x.CgroupID < y.CgroupID
}

func (b byContainer) Swap(i, j int) {
	b.cs[i], b.cs[j] = b.cs[j], b.cs[i]
	b.names[i], b.names[j] = b.names[j], b.names[i]
}
