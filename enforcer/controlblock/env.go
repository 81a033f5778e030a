package controlblock

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/gpuwarden/gpuwarden/enforcer/vocab"
)

// Env is what a container's environment asks of the interposer (the table
// in enforcer/interposer/README.md). ParseEnv is the Go twin of the
// interposer's gw_env_parse: the same rules, the same variables named in
// errors (a test compares the two). It reads each setting with
// enforcer/vocab; what it adds is the variables, which wins where two set
// the same thing, and the control directory.
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

// memList copies a per-device list into the ledger's array.
func memList(v []uint64) (out [MaxDevices]uint64) {
	copy(out[:], v)
	return out
}

// ParseEnv reads the interposer's variables through lookup, each by
// enforcer/vocab's rule for its setting, as the interposer does by the same
// limits (vocab_gen.h).
func ParseEnv(lookup func(string) (string, bool)) (Env, error) {
	e := Env{Weight: 1, Priority: PriorityNormal}
	bad := func(name, value string, err error) error {
		var v *vocab.Error
		if errors.As(err, &v) {
			return &EnvError{name, value, "want " + v.Want}
		}
		return &EnvError{name, value, err.Error()}
	}
	v, vok := lookup("GPUWARDEN_MEMORY_LIMIT")
	cont, cok := lookup("ALIYUN_COM_GPU_MEM_CONTAINER")
	dev, dok := lookup("ALIYUN_COM_GPU_MEM_DEV")
	var contMem []uint64
	var devBytes uint64
	var err error
	if dok {
		if devBytes, err = vocab.ParseGiB(dev); err != nil || devBytes == 0 {
			return e, &EnvError{"ALIYUN_COM_GPU_MEM_DEV", dev, fmt.Sprintf("want the device's memory in GiB, an integer from 1 to %d", vocab.MaxGiB)}
		}
	}
	if cok {
		if contMem, err = vocab.ParseGiBList(cont, MaxDevices); err != nil {
			return e, bad("ALIYUN_COM_GPU_MEM_CONTAINER", cont, err)
		}
	}
	if cok && dok && slices.Max(contMem) > devBytes {
		return e, &EnvError{"ALIYUN_COM_GPU_MEM_CONTAINER", cont, "more than ALIYUN_COM_GPU_MEM_DEV"}
	}
	if vok {
		mem, err := vocab.ParseMemoryList(v, MaxDevices)
		if err != nil {
			return e, bad("GPUWARDEN_MEMORY_LIMIT", v, err)
		}
		e.MemLimit, e.MemSet = memList(mem), true
	} else if cok {
		e.MemLimit, e.MemSet = memList(contMem), true
	}

	w, wok := lookup("GPUWARDEN_COMPUTE_WEIGHT")
	w2, w2ok := lookup("ALIYUN_COM_GPU_SCHD_WEIGHT")
	if wok {
		n, err := vocab.ParseWeight(w)
		if err != nil {
			return e, bad("GPUWARDEN_COMPUTE_WEIGHT", w, err)
		}
		e.Weight = uint32(n)
	}
	if w2ok {
		n, err := vocab.ParseWeight(w2)
		if err != nil {
			return e, bad("ALIYUN_COM_GPU_SCHD_WEIGHT", w2, err)
		}
		if !wok {
			e.Weight = uint32(n)
		}
	}

	if l, ok := lookup("GPUWARDEN_COMPUTE_LIMIT"); ok {
		n, err := vocab.ParseCapPercent(l)
		if err != nil {
			return e, bad("GPUWARDEN_COMPUTE_LIMIT", l, err)
		}
		e.ComputeLimit = uint32(n)
	}

	if p, ok := lookup("GPUWARDEN_PRIORITY"); ok {
		high, err := vocab.ParsePriority(p)
		if err != nil {
			return e, bad("GPUWARDEN_PRIORITY", p, err)
		}
		if high {
			e.Priority = PriorityHigh
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
