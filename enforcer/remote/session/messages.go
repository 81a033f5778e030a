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

	"github.com/gpuwarden/gpuwarden/enforcer/vocab"
)

// MaxMessage bounds a handshake message.
const MaxMessage = 64 << 10

// Request is what a client asks for. Its identity is not in it: the server
// takes that from the client's certificate.
type Request struct {
	// The memory asked for: a fraction of the GPU's memory, or bytes;
	// exactly one is set (vocab.ParseMemoryRequest reads what a user
	// writes, "0.5" or "8Gi").
	MemoryFraction float64 `json:"memoryFraction,omitempty"`
	MemoryBytes    uint64  `json:"memoryBytes,omitempty"`
	Weight         int     `json:"weight,omitempty"`   // 1-vocab.MaxWeight; 0: 1
	Priority       string  `json:"priority,omitempty"` // high or normal; "": normal
	GPU            string  `json:"gpu,omitempty"`      // a GPU's UUID; "": the server picks
	// For is the pod a node's relay opens the session for. The server
	// believes it only from a node's certificate; a workload's
	// certificate names itself, and may only repeat that name here.
	For *Workload `json:"for,omitempty"`
	// Direct asks for the session's connection to be handed to the client
	// library once admitted: the data path then has no relay.
	Direct bool `json:"direct,omitempty"`
}

// Data paths (remote.dataPath): a session's bytes go straight between the
// client library and the worker once admitted, or through both agents.
const (
	PathDirect  = "direct"
	PathRelayed = "relayed"
)

// LocalSocket is the GPU node agent's socket for clients on the same node,
// in its control directory.
const LocalSocket = "remote.sock"

// ParseDataPath reads remote.dataPath: whether sessions are forced onto
// the relayed path.
func ParseDataPath(s string) (relayed bool, err error) {
	switch s {
	case PathDirect:
		return false, nil
	case PathRelayed:
		return true, nil
	}
	return false, fmt.Errorf("data path %q: want %s or %s", s, PathDirect, PathRelayed)
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
	// Direct: the server hands its end to the session's worker, and the
	// client hands its end to the client library.
	Direct bool `json:"direct,omitempty"`
	// Local: the session came over the server's local socket (the client
	// is on the same node) and the client takes the worker's own socket:
	// no TLS and no network on the data path.
	Local bool `json:"local,omitempty"`
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
	switch {
	case r.MemoryFraction != 0 && r.MemoryBytes != 0:
		return v, errors.New("memory: a fraction of the GPU or bytes, not both")
	case r.MemoryFraction != 0:
		if err := vocab.CheckFraction(r.MemoryFraction); err != nil {
			return v, err
		}
	case r.MemoryBytes == 0:
		return v, errors.New("memory: none asked for (a session always has a quota)")
	}
	v.Fraction, v.Bytes = r.MemoryFraction, r.MemoryBytes
	v.Weight = r.Weight
	if v.Weight == 0 {
		v.Weight = 1
	}
	if err := vocab.CheckWeight(v.Weight); err != nil {
		return v, err
	}
	if r.Priority != "" {
		var err error
		if v.High, err = vocab.ParsePriority(r.Priority); err != nil {
			return v, err
		}
	}
	if len(r.GPU) > 128 {
		return v, errors.New("gpu: a UUID is not that long")
	}
	v.GPU = r.GPU
	return v, nil
}
