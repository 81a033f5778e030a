// Package vocab is the vocabulary of what users set: a container's weight,
// compute cap and priority, a GPU's policy and max_inst, memory sizes and
// fractions of a GPU. Each has one function here that reads and checks it,
// whoever asks: pod annotations (deploy/allocation), the interposer's
// environment (enforcer/controlblock, and the C interposer through the
// header generated from these constants), remote session requests, the
// change API and the agent's configuration. A value that does not read is
// an *Error naming the setting and what it wants; no bad value ever reads
// as "no limit".
package vocab

//go:generate go run ./cheader -o ../interposer/src/vocab_gen.h

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/gpuwarden/gpuwarden/enforcer/policy"
)

// The limits of what users set.
const (
	MaxWeight     = 1000    // a weight is 1-MaxWeight
	MaxCapPercent = 100     // a compute cap is a percent, 1-MaxCapPercent
	MaxMaxInst    = 128     // a GPU's max_inst is 1-MaxMaxInst
	MaxGiB        = 1 << 20 // the largest cGPU memory value (ALIYUN_COM_GPU_MEM_*), GiB
)

// The two priorities, as users write them.
const (
	PriorityHigh   = "high"
	PriorityNormal = "normal"
)

// sizeUnits are the suffixes a size may carry; a bare number is GiB
// (bareShift), as in cGPU.
var sizeUnits = []struct {
	suffix string
	shift  uint
}{{"Ki", 10}, {"Mi", 20}, {"Gi", 30}, {"Ti", 40}}

const bareShift = 30

// Error is a value that does not read as its setting.
type Error struct {
	Setting string // "weight", "memory limit", ...
	Value   string // as given
	Why     string // what is wrong with it, when more than "not that"; may be empty
	Want    string // what the setting takes: "an integer from 1 to 1000"
}

// echoMax is the longest value an error repeats: a longer one (a hostile
// request's megabytes) is named by its length.
const echoMax = 64

func (e *Error) Error() string {
	v := strconv.Quote(e.Value)
	switch {
	case len(e.Value) > echoMax:
		v = fmt.Sprintf("(%d bytes)", len(e.Value))
	case e.Value != "" && strings.Trim(e.Value, "-0123456789") == "":
		v = e.Value // a number reads as itself
	}
	if e.Why != "" {
		return fmt.Sprintf("%s %s: %s; want %s", e.Setting, v, e.Why, e.Want)
	}
	return fmt.Sprintf("%s %s: want %s", e.Setting, v, e.Want)
}

// digits reads a decimal number of ASCII digits only: no sign, space or
// base prefix, as the C interposer reads it.
func digits(s string) (uint64, bool) {
	if s == "" || strings.Trim(s, "0123456789") != "" {
		return 0, false
	}
	v, err := strconv.ParseUint(s, 10, 64)
	return v, err == nil
}

var wantWeight = fmt.Sprintf("an integer from 1 to %d", MaxWeight)

// CheckWeight checks a weight someone sets: 1-MaxWeight.
func CheckWeight(w int) error {
	if w < 1 || w > MaxWeight {
		return &Error{Setting: "weight", Value: strconv.Itoa(w), Want: wantWeight}
	}
	return nil
}

// ParseWeight reads a weight: an integer, 1-MaxWeight.
func ParseWeight(s string) (int, error) {
	v, ok := digits(s)
	if !ok || v < 1 || v > MaxWeight {
		return 0, &Error{Setting: "weight", Value: s, Want: wantWeight}
	}
	return int(v), nil
}

var wantCap = fmt.Sprintf("a percent from 1 to %d", MaxCapPercent)

// CheckCapPercent checks a compute cap: a percent of the device, 1-100.
func CheckCapPercent(p int) error {
	if p < 1 || p > MaxCapPercent {
		return &Error{Setting: "compute limit", Value: strconv.Itoa(p), Want: wantCap}
	}
	return nil
}

// ParseCapPercent reads a compute cap: "30" or "30%", 1-100.
func ParseCapPercent(s string) (int, error) {
	v, ok := digits(strings.TrimSuffix(s, "%"))
	if !ok || v < 1 || v > MaxCapPercent {
		return 0, &Error{Setting: "compute limit", Value: s, Want: wantCap}
	}
	return int(v), nil
}

// ParsePriority reads a priority, PriorityHigh or PriorityNormal, and says
// whether it is high.
func ParsePriority(s string) (high bool, err error) {
	switch s {
	case PriorityHigh:
		return true, nil
	case PriorityNormal:
		return false, nil
	}
	return false, &Error{Setting: "priority", Value: s, Want: PriorityHigh + " or " + PriorityNormal}
}

// PriorityName writes a priority as ParsePriority reads it.
func PriorityName(high bool) string {
	if high {
		return PriorityHigh
	}
	return PriorityNormal
}

// ParsePolicy reads a GPU's policy by cGPU's number ("2") or its name
// ("weighted"), in any case.
func ParsePolicy(s string) (policy.Policy, error) {
	in := strings.TrimSpace(strings.ToLower(s))
	var names []string
	for p := policy.Policy(0); p.Valid(); p++ {
		if in == p.String() || in == strconv.Itoa(int(p)) {
			return p, nil
		}
		names = append(names, p.String())
	}
	return 0, &Error{Setting: "policy", Value: s,
		Want: fmt.Sprintf("0-%d or one of %s", len(names)-1, strings.Join(names, ", "))}
}

// CheckMaxInst checks a GPU's max_inst: 1-MaxMaxInst.
func CheckMaxInst(n int) error {
	if n < 1 || n > MaxMaxInst {
		return &Error{Setting: "max_inst", Value: strconv.Itoa(n), Want: fmt.Sprintf("an integer from 1 to %d", MaxMaxInst)}
	}
	return nil
}

const wantSize = "a size such as 6Gi, 512Mi or 2048Ki (a bare number is GiB)"

// ParseSize reads one size in bytes: digits and a unit, Ki, Mi, Gi or Ti;
// a bare number is GiB. 0 is 0 (what it means is the caller's).
func ParseSize(s string) (uint64, error) {
	num, shift := s, uint(bareShift)
	for _, u := range sizeUnits {
		if strings.HasSuffix(s, u.suffix) {
			num, shift = strings.TrimSuffix(s, u.suffix), u.shift
			break
		}
	}
	v, ok := digits(num)
	if !ok {
		return 0, &Error{Setting: "size", Value: s, Want: wantSize}
	}
	if v > math.MaxUint64>>shift {
		return 0, &Error{Setting: "size", Value: s, Why: "too large", Want: wantSize}
	}
	return v << shift, nil
}

// ParseGiB reads one cGPU memory value: an integer number of GiB,
// 0-MaxGiB, returned in bytes.
func ParseGiB(s string) (uint64, error) {
	v, ok := digits(s)
	if !ok || v > MaxGiB {
		return 0, &Error{Setting: "memory in GiB", Value: s, Want: fmt.Sprintf("an integer from 0 to %d", MaxGiB)}
	}
	return v << 30, nil
}

// list reads a per-device list: values for ordinals 0, 1, ... in order,
// at most devices of them, the last repeating for the rest.
func list(s string, devices int, one func(string) (uint64, error)) ([]uint64, bool) {
	parts := strings.Split(s, ",")
	if s == "" || len(parts) > devices {
		return nil, false
	}
	out := make([]uint64, devices)
	for i, p := range parts {
		v, err := one(p)
		if err != nil {
			return nil, false
		}
		out[i] = v
	}
	for i := len(parts); i < devices; i++ {
		out[i] = out[len(parts)-1]
	}
	return out, true
}

// ParseMemoryList reads a memory limit per device, GPUWARDEN_MEMORY_LIMIT's
// syntax: sizes such as "6Gi" or "3Gi,4Gi,5Gi", for ordinals 0, 1, ...,
// at most devices values, the last repeating for the rest; 0 is no limit.
// The result has devices values.
func ParseMemoryList(s string, devices int) ([]uint64, error) {
	out, ok := list(s, devices, ParseSize)
	if !ok {
		return nil, &Error{Setting: "memory limit", Value: s, Want: fmt.Sprintf("sizes per device such as 6Gi, 512Mi or 3Gi,4Gi "+
			"(a bare number is GiB, at most %d values, 0: no limit)", devices)}
	}
	return out, nil
}

// ParseGiBList reads cGPU's ALIYUN_COM_GPU_MEM_CONTAINER: integers of GiB
// per device, "3" (every device), "3,1" (3 on the first, 1 on the others),
// "3,4,5,6"; the last value repeats, 0 is no limit. The result, in bytes,
// has devices values.
func ParseGiBList(s string, devices int) ([]uint64, error) {
	out, ok := list(s, devices, ParseGiB)
	if !ok {
		return nil, &Error{Setting: "memory in GiB", Value: s, Want: fmt.Sprintf("the container's memory in GiB per device, "+
			"integers such as 3 or 3,1 (the last repeats, at most %d values, 0: no limit)", devices)}
	}
	return out, nil
}

const wantMemory = "a fraction of the GPU such as 0.5, or a size such as 8Gi"

// ParseMemoryRequest reads the memory a remote session asks for: a fraction
// of the GPU, written with a decimal point ("0.5", "1.0", in (0, 1]), or a
// size as ParseSize reads it. Zero, elsewhere no limit, is refused: a
// session always has a quota. Exactly one of fraction and bytes is set.
func ParseMemoryRequest(s string) (fraction float64, bytes uint64, err error) {
	bad := func(why string) (float64, uint64, error) {
		return 0, 0, &Error{Setting: "memory", Value: s, Why: why, Want: wantMemory}
	}
	if s == "" {
		return bad("empty")
	}
	if strings.Contains(s, ".") {
		f, err := strconv.ParseFloat(s, 64)
		if err != nil || math.IsNaN(f) || strings.ContainsAny(s, "eEpPxX_+-") {
			return bad("not a number")
		}
		if err := CheckFraction(f); err != nil {
			return bad("a fraction is above 0 and at most 1")
		}
		return f, 0, nil
	}
	b, err := ParseSize(s)
	if err != nil {
		if e, ok := err.(*Error); ok && e.Why != "" {
			return bad(e.Why)
		}
		return bad("not a size")
	}
	if b == 0 {
		return bad("zero")
	}
	return 0, b, nil
}

// CheckFraction checks a fraction of a GPU's memory: above 0, at most 1.
func CheckFraction(f float64) error {
	if !(f > 0 && f <= 1) {
		return &Error{Setting: "memory fraction", Value: strconv.FormatFloat(f, 'g', -1, 64), Want: "a fraction of the GPU above 0 and at most 1"}
	}
	return nil
}

// FormatSize writes a size as ParseSize reads it: "8Gi", "3584Mi", else
// whole KiB rounded down (never "0Ki": a limit never becomes "no limit");
// 0 is "0".
func FormatSize(b uint64) string {
	switch {
	case b == 0:
		return "0"
	case b%(1<<30) == 0:
		return fmt.Sprintf("%dGi", b>>30)
	case b%(1<<20) == 0:
		return fmt.Sprintf("%dMi", b>>20)
	}
	return fmt.Sprintf("%dKi", max(b>>10, 1))
}
