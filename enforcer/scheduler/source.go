package scheduler

import (
	"sync"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
	"github.com/gpuwarden/gpuwarden/enforcer/hostcgroup"
	"github.com/gpuwarden/gpuwarden/enforcer/nvmldev"
)

// Source reports how much device time each container has used.
type Source interface {
	// Busy returns busy[GPU UUID][container key]: the container's device time
	// in nanoseconds since some fixed start. Counters never go down; a
	// container missing from a device's map has used nothing there yet.
	Busy() (map[string]map[string]uint64, error)
}

// PidMapper names the container (its control-block key) a process belongs to.
type PidMapper func(pid uint32) (key string, ok bool)

// CgroupPidMapper maps a process through its cgroup v2 path, as the
// interposer names its own control block (procRoot is normally "/proc", the
// agent's view of the host's processes).
func CgroupPidMapper(procRoot string) PidMapper {
	return func(pid uint32) (string, bool) {
		cg, err := hostcgroup.Of(procRoot, int(pid))
		if err != nil {
			return "", false
		}
		return controlblock.ContainerKey(cg), true
	}
}

// NVMLSource integrates NVML's per-process utilization (a percentage of the
// window since the previous read) into busy nanoseconds per container.
type NVMLSource struct {
	reader *nvmldev.Reader
	owner  PidMapper

	mu    sync.Mutex
	last  time.Time
	total map[string]map[string]uint64  // by UUID, then container
	frac  map[string]map[string]float64 // sub-nanosecond remainders
}

// NewNVMLSource reads through r and attributes processes with owner.
func NewNVMLSource(r *nvmldev.Reader, owner PidMapper) *NVMLSource {
	return &NVMLSource{reader: r, owner: owner, total: map[string]map[string]uint64{}, frac: map[string]map[string]float64{}}
}

// Busy reads NVML and adds utilization x elapsed time to each container.
func (s *NVMLSource) Busy() (map[string]map[string]uint64, error) {
	devs, err := s.reader.Devices()
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	dt := float64(now.Sub(s.last))
	first := s.last.IsZero()
	s.last = now
	for _, d := range devs {
		if s.total[d.UUID] == nil {
			s.total[d.UUID], s.frac[d.UUID] = map[string]uint64{}, map[string]float64{}
		}
		for _, p := range d.Processes {
			if first || p.Utilization <= 0 { // the first read covers an unknown window
				continue
			}
			key, ok := s.owner(p.PID)
			if !ok {
				continue
			}
			ns := p.Utilization*dt + s.frac[d.UUID][key]
			whole := uint64(ns)
			s.frac[d.UUID][key] = ns - float64(whole)
			s.total[d.UUID][key] += whole
		}
	}
	out := make(map[string]map[string]uint64, len(s.total))
	for d, m := range s.total {
		c := make(map[string]uint64, len(m))
		for k, v := range m {
			c[k] = v
		}
		out[d] = c
	}
	return out, nil
}
