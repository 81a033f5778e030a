// Package settings keeps what `gpuwarden ctl` changed, in a file, so that
// the changes outlive an agent restart.
package settings

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
	"github.com/gpuwarden/gpuwarden/enforcer/policy"
	"github.com/gpuwarden/gpuwarden/enforcer/scheduler"
)

// Store is the saved settings of containers and GPUs.
type Store struct {
	path string

	mu         sync.Mutex
	Containers map[string]Container `json:"containers"` // by control-block directory
	GPUs       map[string]GPU       `json:"gpus"`       // by UUID (files before UUIDs: by NVML index)
}

// Container is what ctl set for one container.
type Container struct {
	Compute *scheduler.Settings              `json:"compute,omitempty"`
	Memory  *[controlblock.MaxDevices]uint64 `json:"memoryLimit,omitempty"`
}

// GPU is what ctl set for one GPU.
type GPU struct {
	Policy    policy.Policy `json:"policy"`
	PolicySet bool          `json:"policySet"`
	MaxInst   int           `json:"maxInst"`
}

// Load reads the store at path; a missing file is an empty store.
func Load(path string) (*Store, error) {
	s := &Store{path: path, Containers: map[string]Container{}, GPUs: map[string]GPU{}}
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return s, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read settings: %w", err)
	}
	if err := json.Unmarshal(b, s); err != nil {
		return nil, fmt.Errorf("settings %s: %w", path, err)
	}
	if s.Containers == nil {
		s.Containers = map[string]Container{}
	}
	if s.GPUs == nil {
		s.GPUs = map[string]GPU{}
	}
	return s, nil
}

// Resolve is the compute settings a container is held to: what ctl set,
// else what its pod's annotations set, else what its environment claims
// (nil: not set there).
func Resolve(ctl, annotations *scheduler.Settings) scheduler.Settings {
	switch {
	case ctl != nil:
		return *ctl
	case annotations != nil:
		return *annotations
	}
	return scheduler.Settings{FromClaims: true}
}

// Compute returns the compute settings ctl set for a container; nil: none.
func (s *Store) Compute(dir string) *scheduler.Settings {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.Containers[dir].Compute; c != nil {
		st := *c
		return &st
	}
	return nil
}

// Memory returns the memory limits ctl set for the container, if it did.
func (s *Store) Memory(dir string) ([controlblock.MaxDevices]uint64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m := s.Containers[dir].Memory; m != nil {
		return *m, true
	}
	return [controlblock.MaxDevices]uint64{}, false
}

// GPUSettings returns the saved GPU settings by UUID. A file written before GPUs
// were known by UUID keys them by NVML index: node (the node's UUIDs by
// index) names them; those it cannot name are returned in unknown.
func (s *Store) GPUSettings(node []string) (out map[string]scheduler.GPUSettings, unknown []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out = map[string]scheduler.GPUSettings{}
	for k, g := range s.GPUs {
		if i, err := strconv.Atoi(k); err == nil {
			if i < 0 || i >= len(node) {
				unknown = append(unknown, k)
				continue
			}
			if _, ok := s.GPUs[node[i]]; ok {
				continue // saved by UUID since
			}
			k = node[i]
		}
		out[k] = scheduler.GPUSettings{Policy: g.Policy, PolicySet: g.PolicySet, MaxInst: g.MaxInst}
	}
	return out, unknown
}

// GPU returns one GPU's saved settings.
func (s *Store) GPU(uuid string) scheduler.GPUSettings {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.GPUs[uuid]
	return scheduler.GPUSettings{Policy: g.Policy, PolicySet: g.PolicySet, MaxInst: g.MaxInst}
}

// Prune forgets the settings of containers whose control directories are
// gone (exists says which are there), so the store does not grow with every
// container that ever ran.
func (s *Store) Prune(exists func(dir string) bool) error {
	s.mu.Lock()
	var gone []string
	for dir := range s.Containers {
		if !exists(dir) {
			gone = append(gone, dir)
		}
	}
	s.mu.Unlock()
	if len(gone) == 0 {
		return nil
	}
	return s.Update(func(s *Store) {
		for _, dir := range gone {
			if !exists(dir) { // not made again since
				delete(s.Containers, dir)
			}
		}
	})
}

// Update changes the store and writes it out (atomically, root only).
func (s *Store) Update(change func(*Store)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	change(s)
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(s.path), 0o700); err != nil {
		return fmt.Errorf("save settings: %w", err)
	}
	tmp := s.path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("save settings: %w", err)
	}
	if err := os.Rename(tmp, s.path); err != nil {
		return fmt.Errorf("save settings: %w", err)
	}
	return nil
}
