// Package session is what a remote GPU client and the GPU node agree on
// before driver calls flow: the client's request, the server's answer, the
// list of the server's GPUs, and the decision that places a request on a
// GPU. Messages are JSON in link frames, decoded strictly.
package session

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	"github.com/gpuwarden/gpuwarden/enforcer/policy"
)

// MaxMessage bounds a handshake message.
const MaxMessage = 64 << 10

// Request is what a client asks for. Its identity is not in it: the server
// takes that from the client's certificate.
type Request struct {
	// Memory is a fraction of the GPU's memory ("0.5", "1.0") or a size
	// ("8Gi", "512Mi"; a bare integer is GiB, as GPUWARDEN_MEMORY_LIMIT reads).
	Memory   string `json:"memory"`
	Weight   int    `json:"weight,omitempty"`   // 1-1000; 0: 1
	Priority string `json:"priority,omitempty"` // high or normal; "": normal
	GPU      string `json:"gpu,omitempty"`      // a GPU's UUID; "": the server picks
	// For is the pod a node's relay opens the session for. The server
	// believes it only from a node's certificate; a workload's
	// certificate names itself, and may only repeat that name here.
	For *Workload `json:"for,omitempty"`
}

// Workload names one container of a pod.
type Workload struct {
	Namespace string `json:"namespace"`
	Pod       string `json:"pod"`
	Container string `json:"container"`
}

// Welcome is the server's answer to a request: the granted slice, or why
// there is none.
type Welcome struct {
	Error       string `json:"error,omitempty"`
	Session     string `json:"session,omitempty"`
	GPU         string `json:"gpu,omitempty"` // UUID
	Name        string `json:"name,omitempty"`
	MemoryBytes uint64 `json:"memoryBytes,omitempty"`
	Weight      int    `json:"weight,omitempty"`
	Priority    string `json:"priority,omitempty"`
}

// GPU is one of the server's GPUs as a list answer shows it.
type GPU struct {
	Index       int    `json:"index"`
	UUID        string `json:"uuid"`
	Name        string `json:"name"`
	TotalBytes  uint64 `json:"totalBytes"`
	FreeBytes   uint64 `json:"freeBytes"` // what a new session may still be granted
	UsedBytes   uint64 `json:"usedBytes"`
	Sessions    int    `json:"sessions"` // remote sessions on it
	Unavailable string `json:"unavailable,omitempty"`
}

// GPUList is the answer to a list request.
type GPUList struct {
	Node  string `json:"node"`
	GPUs  []GPU  `json:"gpus"`
	Error string `json:"error,omitempty"`
}

// Decode reads one message strictly: one JSON object of known fields, at
// most MaxMessage bytes.
func Decode(b []byte, v any) error {
	if len(b) > MaxMessage {
		return fmt.Errorf("message of %d bytes: at most %d", len(b), MaxMessage)
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return fmt.Errorf("decode message: %w", err)
	}
	if _, err := d.Token(); !errors.Is(err, io.EOF) {
		return errors.New("decode message: data after the object")
	}
	return nil
}

// Valid is a request checked and read: what Place needs.
type Valid struct {
	Fraction float64 // of the GPU's memory; 0 when Bytes is set
	Bytes    uint64
	Weight   int
	High     bool
	GPU      string
}

// Check validates a request.
func (r Request) Check() (Valid, error) {
	var v Valid
	var err error
	if v.Fraction, v.Bytes, err = ParseMemory(r.Memory); err != nil {
		return v, err
	}
	v.Weight = r.Weight
	if v.Weight == 0 {
		v.Weight = 1
	}
	if v.Weight < 1 || v.Weight > policy.MaxWeight {
		return v, fmt.Errorf("weight %d: want 1-%d", r.Weight, policy.MaxWeight)
	}
	switch r.Priority {
	case "", "normal":
	case "high":
		v.High = true
	default:
		return v, fmt.Errorf("priority %q: want high or normal", r.Priority)
	}
	if len(r.GPU) > 128 {
		return v, errors.New("gpu: a UUID is not that long")
	}
	v.GPU = r.GPU
	return v, nil
}

// ParseMemory reads a memory request: a fraction of the GPU with a decimal
// point ("0.5", "1.0", in (0, 1]) or a size ("8Gi", "512Mi", "2048Ki", "1Ti";
// a bare integer is GiB). Zero, which elsewhere means no limit, is refused:
// a remote session always has a quota.
func ParseMemory(s string) (fraction float64, bytes uint64, err error) {
	bad := func(why string) (float64, uint64, error) {
		return 0, 0, fmt.Errorf("memory %q: %s (want a fraction of the GPU such as 0.5, or a size such as 8Gi)", s, why)
	}
	if s == "" {
		return bad("empty")
	}
	if len(s) > 32 {
		return bad("too long")
	}
	if strings.Contains(s, ".") {
		f, err := strconv.ParseFloat(s, 64)
		if err != nil || math.IsNaN(f) || strings.ContainsAny(s, "eEpPxX_+-") {
			return bad("not a number")
		}
		if f <= 0 || f > 1 {
			return bad("a fraction is above 0 and at most 1")
		}
		return f, 0, nil
	}
	num, unit := s, uint64(1<<30)
	for _, u := range []struct {
		suffix string
		mult   uint64
	}{{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40}} {
		if strings.HasSuffix(s, u.suffix) {
			num, unit = strings.TrimSuffix(s, u.suffix), u.mult
			break
		}
	}
	if num == "" || strings.Trim(num, "0123456789") != "" {
		return bad("not a size")
	}
	n, err := strconv.ParseUint(num, 10, 64)
	if err != nil || n > math.MaxUint64/unit {
		return bad("too large")
	}
	if n == 0 {
		return bad("zero")
	}
	return 0, n * unit, nil
}
