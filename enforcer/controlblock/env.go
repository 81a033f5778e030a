package controlblock

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/gpuwarden/gpuwarden/enforcer/policy"
)

// Env is what a container's environment asks of the interposer (the table
// in enforcer/interposer/README.md). ParseEnv is the Go twin of the
// interposer's gw_env_parse: the same rules, the same variables named in
// errors (a test compares the two).
type Env struct {
	MemLimit     [MaxDevices]uint64 // bytes per device ordinal; 0 = no limit
	MemSet       bool               // a memory variable was given
	Weight       uint32             // >= 1
	ComputeLimit uint32             // percent, 0 = none
	Priority     uint32             // PriorityNormal or PriorityHigh
	ControlDir   string
}

// DefaultControlDir is where control blocks live unless GPUWARDEN_CONTROL_DIR says otherwise.
const DefaultControlDir = "/run/gpuwarden"

// EnvError names the variable whose value is malformed.
type EnvError struct {
	Var, Value, Want string
}

func (e *EnvError) Error() string { return fmt.Sprintf("%s=%q: %s", e.Var, e.Value, e.Want) }

func parseDigits(s string) (uint64, bool) {
	if s == "" {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	v, err := strconv.ParseUint(s, 10, 64)
	return v, err == nil
}

func parseSize(s string) (uint64, bool) {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	v, ok := parseDigits(s[:i])
	if !ok {
		return 0, false
	}
	shifts := map[string]uint{"": 30, "Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40}
	shift, ok := shifts[s[i:]]
	if !ok || v > (^uint64(0))>>shift {
		return 0, false
	}
	return v << shift, true
}

// maxGiB is the largest cGPU memory value, in GiB.
const maxGiB = 1 << 20

// parseGiB parses one cGPU memory value: an integer number of GiB.
func parseGiB(s string) (uint64, bool) {
	v, ok := parseDigits(s)
	if !ok || v > maxGiB {
		return 0, false
	}
	return v << 30, true
}

// parseList parses a per-device list: values for ordinals 0, 1, ... in
// order, at most MaxDevices, the last repeating for the rest.
func parseList(s string, one func(string) (uint64, bool)) ([MaxDevices]uint64, bool) {
	var out [MaxDevices]uint64
	if s == "" {
		return out, false
	}
	parts := strings.Split(s, ",")
	if len(parts) > MaxDevices {
		return out, false
	}
	for i, p := range parts {
		v, ok := one(p)
		if !ok {
			return out, false
		}
		out[i] = v
	}
	for i := len(parts); i < MaxDevices; i++ {
		out[i] = out[len(parts)-1]
	}
	return out, true
}

// ParseMemoryList parses GPUWARDEN_MEMORY_LIMIT's value: "6Gi", "512Mi",
// "3Gi,4Gi,5Gi"; a bare number is GiB; the last value repeats.
func ParseMemoryList(s string) ([MaxDevices]uint64, bool) { return parseList(s, parseSize) }

// ParseGiBList parses cGPU's ALIYUN_COM_GPU_MEM_CONTAINER: integers of GiB
// per device, "3" (every device), "3,1" (3 on the first, 1 on the others),
// "3,4,5,6"; the last value repeats.
func ParseGiBList(s string) ([MaxDevices]uint64, bool) { return parseList(s, parseGiB) }

func parseInt(s string, lo, hi uint64) (uint32, bool) {
	v, ok := parseDigits(s)
	if !ok || v < lo || v > hi {
		return 0, false
	}
	return uint32(v), true
}

// ParseEnv reads the interposer's variables through lookup.
func ParseEnv(lookup func(string) (string, bool)) (Env, error) {
	e := Env{Weight: 1, Priority: PriorityNormal}
	v, vok := lookup("GPUWARDEN_MEMORY_LIMIT")
	cont, cok := lookup("ALIYUN_COM_GPU_MEM_CONTAINER")
	dev, dok := lookup("ALIYUN_COM_GPU_MEM_DEV")
	var contMem [MaxDevices]uint64
	var devGiB uint32
	var ok bool
	if dok {
		if devGiB, ok = parseInt(dev, 1, maxGiB); !ok {
			return e, &EnvError{"ALIYUN_COM_GPU_MEM_DEV", dev, "want the device's memory in GiB, an integer from 1"}
		}
	}
	if cok {
		if contMem, ok = ParseGiBList(cont); !ok {
			return e, &EnvError{"ALIYUN_COM_GPU_MEM_CONTAINER", cont, fmt.Sprintf("want the container's memory in GiB "+
				"per device, integers such as 3 or 3,1 (the last repeats, at most %d values, 0: no limit)", MaxDevices)}
		}
	}
	if cok && dok && slices.Max(contMem[:]) > uint64(devGiB)<<30 {
		return e, &EnvError{"ALIYUN_COM_GPU_MEM_CONTAINER", cont, "more than ALIYUN_COM_GPU_MEM_DEV"}
	}
	if vok {
		if e.MemLimit, ok = ParseMemoryList(v); !ok {
			return e, &EnvError{"GPUWARDEN_MEMORY_LIMIT", v, "want sizes per device such as 6Gi, 512Mi or 3Gi,4Gi"}
		}
		e.MemSet = true
	} else if cok {
		e.MemLimit = contMem
		e.MemSet = true
	}

	w, wok := lookup("GPUWARDEN_COMPUTE_WEIGHT")
	w2, w2ok := lookup("ALIYUN_COM_GPU_SCHD_WEIGHT")
	if wok {
		if e.Weight, ok = parseInt(w, 1, policy.MaxWeight); !ok {
			return e, &EnvError{"GPUWARDEN_COMPUTE_WEIGHT", w, fmt.Sprintf("want an integer from 1 to %d", policy.MaxWeight)}
		}
	}
	if w2ok {
		x, ok := parseInt(w2, 1, policy.MaxWeight)
		if !ok {
			return e, &EnvError{"ALIYUN_COM_GPU_SCHD_WEIGHT", w2, fmt.Sprintf("want an integer from 1 to %d", policy.MaxWeight)}
		}
		if !wok {
			e.Weight = x
		}
	}

	if l, ok := lookup("GPUWARDEN_COMPUTE_LIMIT"); ok {
		n := strings.TrimSuffix(l, "%")
		if len(n) == 0 || len(n) >= 16 {
			return e, &EnvError{"GPUWARDEN_COMPUTE_LIMIT", l, "want a percent from 1 to 100"}
		}
		if e.ComputeLimit, ok = parseInt(n, 1, 100); !ok {
			return e, &EnvError{"GPUWARDEN_COMPUTE_LIMIT", l, "want a percent from 1 to 100"}
		}
	}

	if p, ok := lookup("GPUWARDEN_PRIORITY"); ok {
		switch p {
		case "high":
			e.Priority = PriorityHigh
		case "normal":
			e.Priority = PriorityNormal
		default:
			return e, &EnvError{"GPUWARDEN_PRIORITY", p, "want high or normal"}
		}
	}

	d, ok := lookup("GPUWARDEN_CONTROL_DIR")
	if !ok {
		d = DefaultControlDir
	}
	if !strings.HasPrefix(d, "/") || len(d) >= 255 {
		return e, &EnvError{"GPUWARDEN_CONTROL_DIR", d, "want an absolute path shorter than 255 bytes"}
	}
	for i := 0; i < len(d); i++ {
		if d[i] < 0x20 || d[i] == 0x7f {
			return e, &EnvError{"GPUWARDEN_CONTROL_DIR", d, "control characters in the path"}
		}
	}
	e.ControlDir = d
	return e, nil
}
