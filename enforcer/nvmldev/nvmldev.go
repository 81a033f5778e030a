// Package nvmldev reads the node's GPUs through NVML (go-nvml): memory,
// utilization, and which processes use each device.
//
// The scheduler (busy time), the collector (device metrics), the device
// plugin (the device list) and smi all read it. It sits in enforcer/, beside
// the control-block ABI, because enforcer/ is the lowest layer those share:
// the collector and the device plugin import enforcer/ already, and the
// enforcer must import nothing of the collector.
package nvmldev

import (
	"errors"
	"fmt"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Process is a process with a context on a device, as NVML reports it (pids
// in the host's pid namespace, on NVIDIA's driver).
type Process struct {
	PID         uint32
	MemoryBytes uint64
	// Utilization is the process's share of the device's time over the last
	// sampling window, 0-1; 0 when NVML has no sample for it.
	Utilization float64
}

// Device is one GPU's state at a point in time.
type Device struct {
	Index            int
	UUID, Name       string
	MemoryTotalBytes uint64
	MemoryUsedBytes  uint64
	Utilization      float64 // 0-1
	Processes        []Process
}

// Reader reads devices through one NVML library.
type Reader struct {
	lib nvml.Interface

	mu       sync.Mutex
	lastSeen map[int]uint64 // per device: the newest utilization sample read, NVML's cursor
}

// Open loads NVML from libraryPath ("" for the system's libnvidia-ml.so.1) and initializes it.
func Open(libraryPath string) (*Reader, error) {
	var opts []nvml.LibraryOption
	if libraryPath != "" {
		opts = append(opts, nvml.WithLibraryPath(libraryPath))
	}
	lib := nvml.New(opts...)
	if ret := initLib(lib); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvml init (%s): %v", orDefault(libraryPath), nvmlError(ret))
	}
	return &Reader{lib: lib, lastSeen: map[int]uint64{}}, nil
}

// initLib turns go-nvml's panic on a library it cannot load into an error.
func initLib(lib nvml.Interface) (ret nvml.Return) {
	defer func() {
		if recover() != nil {
			ret = nvml.ERROR_LIBRARY_NOT_FOUND
		}
	}()
	return lib.Init()
}

func orDefault(p string) string {
	if p == "" {
		return "libnvidia-ml.so.1"
	}
	return p
}

func nvmlError(ret nvml.Return) error { return errors.New(nvml.ErrorString(ret)) }

// Close shuts NVML down.
func (r *Reader) Close() error {
	if ret := r.lib.Shutdown(); ret != nvml.SUCCESS {
		return fmt.Errorf("nvml shutdown: %w", nvmlError(ret))
	}
	return nil
}

// Devices reads every device. A device that fails to answer is an error:
// half a device would report wrong totals.
func (r *Reader) Devices() ([]Device, error) {
	n, ret := r.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvml device count: %w", nvmlError(ret))
	}
	out := make([]Device, 0, n)
	for i := 0; i < n; i++ {
		d, err := r.device(i)
		if err != nil {
			return nil, fmt.Errorf("nvml device %d: %w", i, err)
		}
		out = append(out, d)
	}
	return out, nil
}

// UUIDs lists the node's GPUs by UUID, in NVML's index order. It reads no
// utilization, so it leaves Devices' sampling window alone.
func (r *Reader) UUIDs() ([]string, error) {
	n, ret := r.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvml device count: %w", nvmlError(ret))
	}
	out := make([]string, n)
	for i := range out {
		h, ret := r.lib.DeviceGetHandleByIndex(i)
		if ret == nvml.SUCCESS {
			out[i], ret = h.GetUUID()
		}
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("nvml device %d: uuid: %w", i, nvmlError(ret))
		}
	}
	return out, nil
}

func (r *Reader) device(i int) (Device, error) {
	h, ret := r.lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return Device{}, fmt.Errorf("handle: %w", nvmlError(ret))
	}
	d := Device{Index: i}
	if d.UUID, ret = h.GetUUID(); ret != nvml.SUCCESS {
		return Device{}, fmt.Errorf("uuid: %w", nvmlError(ret))
	}
	if d.Name, ret = h.GetName(); ret != nvml.SUCCESS {
		return Device{}, fmt.Errorf("name: %w", nvmlError(ret))
	}
	mem, ret := h.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return Device{}, fmt.Errorf("memory: %w", nvmlError(ret))
	}
	d.MemoryTotalBytes, d.MemoryUsedBytes = mem.Total, mem.Used
	if u, ret := h.GetUtilizationRates(); ret == nvml.SUCCESS {
		d.Utilization = float64(u.Gpu) / 100
	}
	procs, ret := h.GetComputeRunningProcesses()
	if ret != nvml.SUCCESS {
		return Device{}, fmt.Errorf("processes: %w", nvmlError(ret))
	}
	util := r.processUtilization(i, h)
	for _, p := range procs {
		d.Processes = append(d.Processes, Process{PID: p.Pid, MemoryBytes: p.UsedGpuMemory, Utilization: util[p.Pid]})
	}
	return d, nil
}

// processUtilization returns each process's share of the device since the
// last read (NVML keeps the cursor: samples newer than lastSeen).
func (r *Reader) processUtilization(i int, h nvml.Device) map[uint32]float64 {
	r.mu.Lock()
	since := r.lastSeen[i]
	r.mu.Unlock()
	samples, ret := h.GetProcessUtilization(since)
	util := map[uint32]float64{}
	if ret != nvml.SUCCESS { // NOT_FOUND: nothing ran since the last read
		return util
	}
	newest := since
	for _, s := range samples {
		util[s.Pid] = float64(s.SmUtil) / 100
		newest = max(newest, s.TimeStamp)
	}
	r.mu.Lock()
	r.lastSeen[i] = newest
	r.mu.Unlock()
	return util
}
