package probes

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
)

// ProcessProgramStats is ProgramStats for an agent running as another
// process: the counters of the gpuwarden programs that process pid holds,
// by their C names. The programs are found through the process's open
// descriptors (the prog_id lines of /proc/PID/fdinfo), so programs of the
// same names loaded by anything else on the node are not counted. Read it
// while statistics are enabled (EnableStats) and take differences.
func ProcessProgramStats(pid int) (map[string]ProgramStat, error) {
	ids, err := processProgramIDs(pid)
	if err != nil {
		return nil, err
	}
	names := programNames()
	out := map[string]ProgramStat{}
	for _, id := range ids {
		prog, err := ebpf.NewProgramFromID(id)
		if err != nil {
			continue // unloaded since the descriptors were read
		}
		name, stat, err := programStat(prog)
		prog.Close()
		if err != nil {
			return nil, fmt.Errorf("eBPF program %d of process %d: %w", id, pid, err)
		}
		if c := names.match(name); c != "" {
			s := out[c]
			s.RunCount += stat.RunCount
			s.Runtime += stat.Runtime
			out[c] = s
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("process %d holds none of gpuwarden's eBPF programs (%d programs open)", pid, len(ids))
	}
	return out, nil
}

func programStat(prog *ebpf.Program) (string, ProgramStat, error) {
	info, err := prog.Info()
	if err != nil {
		return "", ProgramStat{}, err
	}
	s, err := statOf(prog)
	return info.Name, s, err
}

// ProcessExactLaunches is ExactLaunchCounts for an agent running as
// another process: the launches its exact launch probe counted, per
// (cgroup, device), found through its descriptors (the map_id lines of
// /proc/PID/fdinfo).
func ProcessExactLaunches(pid int) (map[Key]uint64, error) {
	ids, err := fdinfoIDs(pid, "map_id:")
	if err != nil {
		return nil, err
	}
	for _, id := range ids {
		m, err := ebpf.NewMapFromID(ebpf.MapID(id))
		if err != nil {
			continue // closed since the descriptors were read
		}
		info, err := m.Info()
		if err == nil && info.Name == "launches_exact" {
			out, err := readLaunches(m, info.Name)
			m.Close()
			return out, err
		}
		m.Close()
	}
	return nil, fmt.Errorf("process %d holds no launches_exact map (%d maps open)", pid, len(ids))
}

// processProgramIDs lists the eBPF programs pid's descriptors refer to:
// programs, and links (whose fdinfo names their program too).
func processProgramIDs(pid int) ([]ebpf.ProgramID, error) {
	ids, err := fdinfoIDs(pid, "prog_id:")
	if err != nil {
		return nil, err
	}
	out := make([]ebpf.ProgramID, len(ids))
	for i, id := range ids {
		out[i] = ebpf.ProgramID(id)
	}
	return out, nil
}

// fdinfoIDs lists the distinct ids of the lines starting with prefix in
// pid's descriptors' fdinfo.
func fdinfoIDs(pid int, prefix string) ([]uint32, error) {
	dir := filepath.Join("/proc", strconv.Itoa(pid), "fdinfo")
	fds, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read the descriptors of process %d: %w", pid, err)
	}
	seen := map[uint32]bool{}
	var ids []uint32
	for _, fd := range fds {
		f, err := os.Open(filepath.Join(dir, fd.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			v, ok := strings.CutPrefix(sc.Text(), prefix)
			if !ok {
				continue
			}
			if n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32); err == nil && !seen[uint32(n)] {
				seen[uint32(n)] = true
				ids = append(ids, uint32(n))
			}
		}
		f.Close()
	}
	return ids, nil
}

// programNameSet is the C names of gpuwarden's programs.
type programNameSet []string

func programNames() programNameSet {
	t := reflect.TypeOf(gpuwardenPrograms{})
	out := make(programNameSet, 0, t.NumField())
	for i := 0; i < t.NumField(); i++ {
		if n := t.Field(i).Tag.Get("ebpf"); n != "" {
			out = append(out, n)
		}
	}
	return out
}

// match maps a name the kernel reports to a C name. Without BTF the
// kernel keeps only the first 15 characters (BPF_OBJ_NAME_LEN).
func (s programNameSet) match(kernelName string) string {
	for _, n := range s {
		if n == kernelName {
			return n
		}
	}
	if len(kernelName) == 15 {
		for _, n := range s {
			if strings.HasPrefix(n, kernelName) {
				return n
			}
		}
	}
	return ""
}
