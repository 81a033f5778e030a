package collector

import (
	"sort"
	"time"
)

// ContainerDevice is one container's use of one GPU.
type ContainerDevice struct {
	Node       string `json:"node"`
	GPU        int    `json:"gpu"` // NVML's index; NoGPU: a GPU of unknown UUID
	UUID       string `json:"uuid"`
	Namespace  string `json:"namespace"`
	Pod        string `json:"pod"`
	Container  string `json:"container"`
	CgroupID   uint64 `json:"cgroupId"`
	CgroupPath string `json:"cgroupPath"`

	// Enforced: the interposer keeps a ledger for the container.
	// Unenforced: the container is in breach (Breaches says why): GPU
	// activity without a ledger, or a ledger that what the node saw
	// contradicts.
	Enforced     bool     `json:"enforced"`
	Unenforced   bool     `json:"unenforced"`
	Breaches     []Breach `json:"breaches,omitempty"`
	HighPriority bool     `json:"highPriority"`

	MemoryUsedBytes uint64 `json:"memoryUsedBytes"`
	// MemorySource says where MemoryUsedBytes comes from: ebpf, nvml or ledger.
	MemorySource     string `json:"memorySource"`
	MemoryLimitBytes uint64 `json:"memoryLimitBytes"` // 0: no quota
	LedgerBytes      uint64 `json:"ledgerBytes"`      // reserved in the interposer's ledger

	AllocFailuresQuota  uint64  `json:"allocFailuresQuota"`
	AllocFailuresDevice uint64  `json:"allocFailuresDevice"`
	Launches            float64 `json:"launches"`
	LaunchesExact       bool    `json:"launchesExact"`
	ThrottledSeconds    float64 `json:"throttledSeconds"`
	ComputeShare        float64 `json:"computeShare"` // 0-1, measured
	ComputeLimit        float64 `json:"computeLimit"` // 0-1 target; 0: none

	PIDs []int `json:"pids"`
}

// Device is one GPU's totals.
type Device struct {
	Node             string  `json:"node"`
	Index            int     `json:"index"`
	UUID             string  `json:"uuid"`
	Name             string  `json:"name"`
	MemoryTotalBytes uint64  `json:"memoryTotalBytes"`
	MemoryUsedBytes  uint64  `json:"memoryUsedBytes"`
	Utilization      float64 `json:"utilization"`
}

// SourceState says whether a source answered the last read.
type SourceState struct {
	Name  string `json:"name"`
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
}

// BadLedger is a control directory whose ledger the agent refused: not a
// regular file of the ABI's size (a symlink, a FIFO, a device, truncated),
// or not a ledger. Its container wrote it: the fault is the container's.
type BadLedger struct {
	Dir   string `json:"dir"`
	Error string `json:"error"`
}

// View is everything the agent knows at one moment.
type View struct {
	Node       string            `json:"node"`
	Time       time.Time         `json:"time"`
	Devices    []Device          `json:"devices"`
	Containers []ContainerDevice `json:"containers"`
	Sources    []SourceState     `json:"sources"`
	BadLedgers []BadLedger       `json:"badLedgers,omitempty"`

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
