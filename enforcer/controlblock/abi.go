// Package controlblock is the Go side of the control block that the
// interposer (libgpuwarden.so) and the agent share per container: the
// agent-written `limits` file and the container-written `usage` ledger. The
// layout is defined once, in enforcer/interposer/gpuwarden_abi.h; the structs
// here mirror it field by field (the `c` tags name the C fields) and
// TestLayoutMatchesHeader checks every offset and size against the header.
package controlblock

import "unsafe"

// ABI constants, as gpuwarden_abi.h defines them.
const (
	ABIMajor      = 1
	ABIMinor      = 4 // 1: launches and throttled time per device; 2: device mismatches; 3: completion marks; 4: gate closes
	MaxDevices    = 16
	MaxSlots      = 128
	CgroupPathMax = 512

	LimitsMagic = 0x5354494d494c5747 // "GWLIMITS"
	UsageMagic  = 0x0045474153555747 // "GWUSAGE\0"

	DefaultContextReserve = 64 << 20
	DefaultGraceNs        = 10_000_000_000
)

// Slot states.
const (
	SlotFree     = 0
	SlotClaiming = 1
	SlotLive     = 2
	SlotReaping  = 3
)

// Priorities and claim flags.
const (
	PriorityNormal = 0
	PriorityHigh   = 1
	ClaimMemorySet = 1
)

// Gate is one device's launch gate (struct gw_gate).
type Gate struct {
	Grant    uint64    `c:"grant"`
	Wake     uint32    `c:"wake"`
	Pad0     uint32    `c:"pad0"`
	Closes   uint64    `c:"closes"`
	Reserved [5]uint64 `c:"reserved"`
}

// Limits is the agent's file (struct gw_limits).
type Limits struct {
	Magic          uint64             `c:"magic"`
	ABIMajor       uint16             `c:"abi_major"`
	ABIMinor       uint16             `c:"abi_minor"`
	Size           uint32             `c:"size"`
	Seq            uint64             `c:"seq"`
	Generation     uint64             `c:"generation"`
	ContextReserve uint64             `c:"context_reserve"`
	GraceNs        uint64             `c:"grace_ns"`
	GateMask       uint32             `c:"gate_mask"`
	NDev           uint32             `c:"ndev"`
	MemLimit       [MaxDevices]uint64 `c:"mem_limit"`
	ReservedConfig [8]uint64          `c:"reserved_config"`
	HeartbeatNs    uint64             `c:"heartbeat_ns"`
	Gate           [MaxDevices]Gate   `c:"gate"`
	Reserved       [768]byte          `c:"reserved"`
}

// Slot is one process of the container (struct gw_slot).
type Slot struct {
	State         uint32             `c:"state"`
	Pid           int32              `c:"pid"`
	StartTime     uint64             `c:"start_time"`
	Bytes         [MaxDevices]uint64 `c:"bytes"`
	Launches      uint64             `c:"launches"`
	ThrottledNs   uint64             `c:"throttled_ns"`
	AllocFailures uint64             `c:"alloc_failures"`
	// Minor 1: of Launches and ThrottledNs, what is also counted per
	// device in Usage.LaunchesDev and Usage.ThrottledNsDev.
	LaunchesPlaced    uint64   `c:"launches_placed"`
	ThrottledPlacedNs uint64   `c:"throttled_placed_ns"`
	Reserved          [72]byte `c:"reserved"`
}

// Usage is the container's ledger (struct gw_usage).
type Usage struct {
	Magic             uint64               `c:"magic"`
	ABIMajor          uint16               `c:"abi_major"`
	ABIMinor          uint16               `c:"abi_minor"`
	Size              uint32               `c:"size"`
	MaxDevices        uint32               `c:"max_devices"`
	MaxSlots          uint32               `c:"max_slots"`
	SlotSize          uint32               `c:"slot_size"`
	NDev              uint32               `c:"ndev"`
	ReservedBytes     [MaxDevices]uint64   `c:"reserved_bytes"`
	LaunchesIssued    [MaxDevices]uint64   `c:"launches_issued"`
	AllocFailures     [MaxDevices]uint64   `c:"alloc_failures"`
	ClaimMemLimit     [MaxDevices]uint64   `c:"claim_mem_limit"`
	ClaimWeight       uint32               `c:"claim_weight"`
	ClaimComputeLimit uint32               `c:"claim_compute_limit"`
	ClaimPriority     uint32               `c:"claim_priority"`
	ClaimFlags        uint32               `c:"claim_flags"`
	CgroupID          uint64               `c:"cgroup_id"`
	CgroupPath        [CgroupPathMax]byte  `c:"cgroup_path"`
	DevUUID           [MaxDevices][16]byte `c:"dev_uuid"`
	Pad1              [8]byte              `c:"pad1"`
	// Minor 1: container-wide, by device ordinal, launches whose device the
	// interposer knew and time launches waited at a gate (ns).
	LaunchesDev    [MaxDevices]uint64 `c:"launches_dev"`
	ThrottledNsDev [MaxDevices]uint64 `c:"throttled_ns_dev"`
	// Minor 2: gated launches whose device, as the interposer kept it from
	// the context hooks, differed from the driver's when checked.
	DevMismatches uint64   `c:"dev_mismatches"`
	Pad2          [56]byte `c:"pad2"`
	// Minor 3: each device's latest completion mark (UsageFile.Mark).
	MarkRecNs  [MaxDevices]uint64 `c:"mark_rec_ns"`
	MarkDoneNs [MaxDevices]uint64 `c:"mark_done_ns"`
	MarkTicket [MaxDevices]uint64 `c:"mark_ticket"`
	Reserved   [2048]byte         `c:"reserved"`
	Slots      [MaxSlots]Slot     `c:"slots"`
}

// Sizes of the files.
const (
	LimitsSize = int(unsafe.Sizeof(Limits{}))
	UsageSize  = int(unsafe.Sizeof(Usage{}))
)
