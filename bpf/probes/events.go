package probes

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"

	"github.com/cilium/ebpf/ringbuf"
)

// API names the allocation entry point of a failed-allocation event.
var API = map[uint32]string{
	uint32(gpuwardenGwApiGW_API_MEM_ALLOC):         "cuMemAlloc_v2",
	uint32(gpuwardenGwApiGW_API_MEM_ALLOC_PITCH):   "cuMemAllocPitch_v2",
	uint32(gpuwardenGwApiGW_API_MEM_ALLOC_MANAGED): "cuMemAllocManaged",
	uint32(gpuwardenGwApiGW_API_MEM_ALLOC_ASYNC):   "cuMemAllocAsync",
	uint32(gpuwardenGwApiGW_API_MEM_ALLOC_POOL):    "cuMemAllocFromPoolAsync",
	uint32(gpuwardenGwApiGW_API_MEM_CREATE):        "cuMemCreate",
}

// FailedAlloc is an allocation the driver refused.
type FailedAlloc struct {
	MonotonicNS uint64 // CLOCK_MONOTONIC at the failure
	Cgroup      uint64
	PID, TID    uint32
	Comm        string
	Device      uint32 // or DeviceUnknown
	Bytes       uint64 // requested
	Result      uint32 // CUresult (2: CUDA_ERROR_OUT_OF_MEMORY)
	API         string // entry point
}

// Events reads failed-allocation events from the ring buffer.
type Events struct{ rd *ringbuf.Reader }

// ErrClosed is returned by Events.Read after Close.
var ErrClosed = os.ErrClosed

// Events opens a reader of the failed-allocation ring buffer. Only one
// reader should be open at a time.
func (p *Probes) Events() (*Events, error) {
	rd, err := ringbuf.NewReader(p.objs.Events)
	if err != nil {
		return nil, fmt.Errorf("open events ring buffer: %w", err)
	}
	return &Events{rd: rd}, nil
}

// Read blocks until an event arrives or the reader is closed (ErrClosed).
func (e *Events) Read() (FailedAlloc, error) {
	rec, err := e.rd.Read()
	if errors.Is(err, ringbuf.ErrClosed) {
		return FailedAlloc{}, ErrClosed
	}
	if err != nil {
		return FailedAlloc{}, fmt.Errorf("read events ring buffer: %w", err)
	}
	var raw gpuwardenAllocFailEvent
	if err := binary.Read(bytes.NewReader(rec.RawSample), binary.LittleEndian, &raw); err != nil {
		return FailedAlloc{}, fmt.Errorf("decode event: %w", err)
	}
	comm := make([]byte, 0, len(raw.Comm))
	for _, c := range raw.Comm {
		if c == 0 {
			break
		}
		comm = append(comm, byte(c))
	}
	return FailedAlloc{
		MonotonicNS: raw.TsNs, Cgroup: raw.Cgroup, PID: raw.Tgid, TID: raw.Tid, Comm: string(comm),
		Device: raw.Device, Bytes: raw.Bytes, Result: raw.Result, API: API[raw.Api],
	}, nil
}

// Close unblocks Read and releases the reader.
func (e *Events) Close() error { return e.rd.Close() }
