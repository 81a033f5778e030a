package probes

import (
	"fmt"
	"io"
	"reflect"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// ProgramStat is what the kernel counted for one program while run-time
// statistics were on (run_cnt and run_time_ns): how often it ran and for how
// long in all.
type ProgramStat struct {
	RunCount uint64
	Runtime  time.Duration
}

// EnableStats has the kernel count every eBPF program's runs and run time
// until the returned closer is closed (BPF_ENABLE_STATS: the
// kernel.bpf_stats_enabled sysctl is left as it is, and the counting stops
// when the last holder closes, even if this process dies). Counting adds two
// clock reads to each run, so it is for measuring, not for an agent's
// ordinary work.
func EnableStats() (io.Closer, error) {
	c, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		return nil, fmt.Errorf("enable eBPF run-time statistics: %w", explainAttach(err))
	}
	return c, nil
}

// ProgramStats returns each program's counters by its C name. They only grow, and
// only while statistics are enabled (EnableStats): take the difference of
// two readings.
func (p *Probes) ProgramStats() (map[string]ProgramStat, error) {
	out := map[string]ProgramStat{}
	v := reflect.ValueOf(&p.objs.gpuwardenPrograms).Elem()
	for i := 0; i < v.NumField(); i++ {
		name := v.Type().Field(i).Tag.Get("ebpf")
		prog, _ := v.Field(i).Interface().(*ebpf.Program)
		if prog == nil {
			continue
		}
		s, err := statOf(prog)
		if err != nil {
			return nil, fmt.Errorf("statistics of eBPF program %s: %w", name, err)
		}
		out[name] = s
	}
	return out, nil
}

// statOf reads one program's counters.
func statOf(prog *ebpf.Program) (ProgramStat, error) {
	s, err := prog.Stats()
	if err != nil {
		return ProgramStat{}, err
	}
	return ProgramStat{RunCount: s.RunCount, Runtime: s.Runtime}, nil
}
