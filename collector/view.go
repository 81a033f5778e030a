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

	probeEvents, probeLost uint64
	probesOn               bool
}

func (v *View) sort() {
	sort.Slice(v.Devices, func(i, j int) bool { return v.Devices[i].Index < v.Devices[j].Index })
	sort.Slice(v.Containers, func(i, j int) bool {
		a, b := v.Containers[i], v.Containers[j]
		if a.GPU != b.GPU {
			return a.GPU < b.GPU
		}
		if a.Namespace+"/"+a.Pod+"/"+a.Container != b.Namespace+"/"+b.Pod+"/"+b.Container {
			return a.Namespace+"/"+a.Pod+"/"+a.Container < b.Namespace+"/"+b.Pod+"/"+b.Container
		}
		return a.CgroupID < b.CgroupID
	})
	sort.Slice(v.Sources, func(i, j int) bool { return v.Sources[i].Name < v.Sources[j].Name })
}
