// Package agentapi holds what the agent's HTTP API exchanges with
// `gpuwarden smi`, `gpuwarden ctl` and other clients: the collector's read
// API (containers, devices), the enforcer's change API (container and GPU
// settings, events) and /readyz, and how a process that starts an agent
// learns that it is ready (AwaitReady). The collector and the enforcer both fill
// these types, so they live in enforcer/, which the collector already
// imports and which imports nothing of the collector.
package agentapi

import (
	"strconv"
	"strings"
	"time"
)

// ContainersResponse is GET /api/v1/containers.
type ContainersResponse struct {
	Node       string            `json:"node"`
	Time       time.Time         `json:"time"`
	Containers []ContainerDevice `json:"containers"`
	Sources    []SourceState     `json:"sources"`
	BadLedgers []BadLedger       `json:"badLedgers,omitempty"`
	// RefusedLedgers are ledgers read whose cgroup claim was refused.
	RefusedLedgers []RefusedLedger `json:"refusedLedgers,omitempty"`
}

// DevicesResponse is GET /api/v1/devices.
type DevicesResponse struct {
	Node    string    `json:"node"`
	Time    time.Time `json:"time"`
	Devices []Device  `json:"devices"`
}

// ContainerDevice is one container's use of one GPU.
type ContainerDevice struct {
	Node       string `json:"node"`
	GPU        int    `json:"gpu"` // NVML's index; -1 (collector.NoGPU): a GPU of unknown UUID
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
	// DeviceMismatches counts the checks (one gated launch in 1024 of a
	// process on several GPUs) that found the interposer's context hooks
	// wrong about a launch's device: a context made current behind them.
	// Container-wide, on the entry of its first GPU.
	DeviceMismatches uint64  `json:"deviceMismatches"`
	ComputeShare     float64 `json:"computeShare"` // 0-1, measured by NVML
	ComputeLimit     float64 `json:"computeLimit"` // 0-1 target; 0: none
	// Scheduled: the agent's scheduler holds the container to
	// ComputeLimit on this GPU, and the two figures below are its. A limit
	// the container's ledger claims but no scheduler holds leaves it false.
	Scheduled bool `json:"scheduled"`
	// ScheduledShare is the share the scheduler measured the container
	// take over about the last second, 0-1: on the agent's own clock (each
	// slice from its start until its work ran) where its launches are
	// gated. NVML's ComputeShare judges it.
	ScheduledShare float64 `json:"scheduledShare"`
	// ScheduledSeconds is the device time the scheduler's clock charged
	// the container, ever (monotonic): its share over any window is the
	// window's difference over the window's length.
	ScheduledSeconds float64 `json:"scheduledSeconds"`

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

// RefusedLedger is a control directory whose ledger reads but does not
// speak for the cgroup it names (ledgertrust.Verifier's reason). Writers are the
// cgroups held to account for it: those of the processes that map it and,
// when its slots name processes of other containers, the cgroup its
// directory belongs to. A refusal with no writer (a ledger left by a
// container that is gone) accuses nobody.
type RefusedLedger struct {
	Dir     string   `json:"dir"`
	Cgroup  uint64   `json:"cgroupId"`
	Reason  string   `json:"reason"`
	Writers []string `json:"writers,omitempty"`
}

// Breach is one reason a container is in breach, with what shows it.
type Breach struct {
	Reason   string `json:"reason"`
	Evidence string `json:"evidence"`
	// Procs are the offending processes when the breach names them;
	// empty: the whole cgroup.
	Procs []Process `json:"processes,omitempty"`
}

// Process is a host process, told from a later one with its pid by its
// start time (clock ticks since boot).
type Process struct {
	PID       int    `json:"pid"`
	StartTime uint64 `json:"startTime"`
}

// ContainerChange is POST /api/v1/containers/{container}/settings. Absent
// fields stay as they are. {container} is the control-block directory, the
// cgroup path, or namespace/pod/container.
type ContainerChange struct {
	MemoryLimit  *string `json:"memoryLimit,omitempty"`  // GPUWARDEN_MEMORY_LIMIT's syntax: "6Gi", "3Gi,4Gi"; "0": none
	Weight       *int    `json:"weight,omitempty"`       // 1-vocab.MaxWeight
	ComputeLimit *int    `json:"computeLimit,omitempty"` // percent 0-100; 0: none
	Priority     *string `json:"priority,omitempty"`     // high or normal
}

// GPUChange is POST /api/v1/gpus/{gpu}/settings; {gpu} is NVML's index or
// the GPU's UUID.
type GPUChange struct {
	Policy  *string `json:"policy,omitempty"`  // 0-5 or fair-share, preemptive, weighted, fixed, soft, native
	MaxInst *int    `json:"maxInst,omitempty"` // 1-128: the scheduler's max_inst and the device plugin's slots
}

// GPUInfo is a GPU's scheduling state: GET /api/v1/gpus (every GPU with
// containers or settings) and /api/v1/gpus/{gpu}, and a GPU change's answer.
type GPUInfo struct {
	Index      int    `json:"index"` // NVML's; -1: not on the node, or NVML off
	UUID       string `json:"uuid"`
	Policy     string `json:"policy"` // in force
	PolicySet  bool   `json:"policySet"`
	MaxInst    int    `json:"maxInst"`
	FreeWeight int    `json:"freeWeight"` // cGPU's free_weight: max_inst less its containers' weights
	Containers int    `json:"containers"`
	// Slices counts the scheduler's hand-overs of the GPU, ever.
	Slices SliceCounts `json:"slices"`
}

// SliceCounts are a GPU's slice hand-overs, ever: the previous owner's work
// drains after its gate closes (charged to it), then the device waits for
// the next owner's gate to open (nobody's time). Drains ended by the
// scheduler's 200 ms cap rather than a completion mark mean the marks did
// not come.
type SliceCounts struct {
	Handovers    uint64  `json:"handovers"`
	DrainsCapped uint64  `json:"drainsCapped"`
	DrainSeconds float64 `json:"drainSeconds"`
	GapSeconds   float64 `json:"gapSeconds"`
}

// ChangeResult is every change's answer. InForce lists the shares the
// scheduler holds the containers on the GPUs concerned to once the change
// is made: a
// change is in force when the answer comes (grants follow on the next
// tick, 5 ms); metrics show it within the collector's 1 s view.
type ChangeResult struct {
	Container string    `json:"container,omitempty"`
	Warnings  []string  `json:"warnings,omitempty"`
	InForce   []InForce `json:"inForce,omitempty"`
	GPU       *GPUInfo  `json:"gpu,omitempty"` // a GPU change's GPU
}

// InForce is one container's share on one GPU.
type InForce struct {
	Container string  `json:"container"`
	GPU       string  `json:"gpu"` // UUID
	Policy    string  `json:"policy"`
	Target    float64 `json:"target"`
}

// Event is something the enforcer saw or did, for /api/v1/events.
type Event struct {
	Time      time.Time `json:"time"`
	Kind      string    `json:"kind"` // breach, frozen, killed, unfrozen
	Reason    string    `json:"reason,omitempty"`
	Cgroup    string    `json:"cgroup"`
	Namespace string    `json:"namespace,omitempty"`
	Pod       string    `json:"pod,omitempty"`
	Container string    `json:"container,omitempty"`
	GPU       int       `json:"gpu"`
	PIDs      []int     `json:"pids,omitempty"`
	Message   string    `json:"message"`
}

// ReadyResponse is GET /readyz: which parts are up. It answers 503 while an
// enabled part is down.
type ReadyResponse struct {
	Ready bool                 `json:"ready"`
	Parts map[string]PartState `json:"parts"`
}

// PartState is one part's state on /readyz.
type PartState struct {
	Enabled bool   `json:"enabled"`
	Up      bool   `json:"up"`
	Error   string `json:"error,omitempty"`
}

// Quote quotes a name taken from a request for an answer, cut to 64 bytes,
// so an answer never repeats much of what a client sent.
func Quote(s string) string {
	const most = 64
	if len(s) <= most {
		return strconv.Quote(s)
	}
	return strconv.Quote(strings.ToValidUTF8(s[:most], "")) + "..."
}
