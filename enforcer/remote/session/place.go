package session

import (
	"fmt"
	"sort"
)

// Device is one of the server's GPUs as placement sees it.
type Device struct {
	Index      int
	UUID       string
	Name       string
	TotalBytes uint64
	UsedBytes  uint64 // in use on it now (NVML), sessions included
	Granted    uint64 // the quotas of the remote sessions on it
	Sessions   int
}

// Free is what a new session may be granted on d: the memory neither
// granted to sessions nor in use, whichever leaves less. (A session's use
// is counted once in each; taking the smaller keeps both promises.)
func (d Device) Free() uint64 {
	free := uint64(0)
	if d.TotalBytes > d.Granted {
		free = d.TotalBytes - d.Granted
	}
	if d.UsedBytes >= d.TotalBytes {
		return 0
	}
	return min(free, d.TotalBytes-d.UsedBytes)
}

// Placed is where a request goes and with how much memory.
type Placed struct {
	Device      Device
	MemoryBytes uint64
}

// Place picks a GPU for a valid request: the one it names, else the one
// with the most free memory that fits it. The quota is whole MiB (a
// fraction rounds down), never zero.
func Place(v Valid, devs []Device) (Placed, error) {
	if len(devs) == 0 {
		return Placed{}, fmt.Errorf("no GPU on this server")
	}
	want := func(d Device) uint64 {
		if v.Bytes > 0 {
			return v.Bytes
		}
		b := uint64(v.Fraction*float64(d.TotalBytes)) &^ (1<<20 - 1)
		return max(b, 1<<20)
	}
	if v.GPU != "" {
		for _, d := range devs {
			if d.UUID == v.GPU {
				if w := want(d); w > d.Free() {
					return Placed{}, fmt.Errorf("GPU %s: %d MiB asked, %d MiB free", d.UUID, w>>20, d.Free()>>20)
				}
				return Placed{d, want(d)}, nil
			}
		}
		return Placed{}, fmt.Errorf("no GPU %s on this server", v.GPU)
	}
	s := append([]Device(nil), devs...)
	sort.SliceStable(s, func(i, j int) bool { return s[i].Free() > s[j].Free() })
	for _, d := range s {
		if w := want(d); w <= d.Free() && w <= d.TotalBytes {
			return Placed{d, w}, nil
		}
	}
	return Placed{}, fmt.Errorf("not enough free memory: %d MiB asked, at most %d MiB free on one GPU",
		want(s[0])>>20, s[0].Free()>>20)
}
