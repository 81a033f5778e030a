package agent

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

// settingsStore keeps what `gpuwarden ctl` changed, in a file, so that the
// changes outlive an agent restart.
type settingsStore struct {
	path string

	mu         sync.Mutex
	Containers map[string]savedContainer `json:"containers"` // by control-block directory
	GPUs       map[string]savedGPU       `json:"gpus"`       // by UUID (files before UUIDs: by NVML index)
}

type savedContainer struct {
	Compute *scheduler.Settings              `json:"compute,omitempty"`
	Memory  *[controlblock.MaxDevices]uint64 `json:"memoryLimit,omitempty"`
}

type savedGPU struct {
	Policy    policy.Policy `json:"policy"`
	PolicySet bool          `json:"policySet"`
	MaxInst   int           `json:"maxInst"`
}

func loadSettings(path string) (*settingsStore, error) {
	s := &settingsStore{path: path, Containers: map[string]savedContainer{}, GPUs: map[string]savedGPU{}}
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
		s.Containers = map[string]savedContainer{}
	}
	if s.GPUs == nil {
		s.GPUs = map[string]savedGPU{}
	}
	return s, nil
}

// container returns a container's compute settings: those ctl set, else
// what its environment claims.
func (s *settingsStore) container(dir string) scheduler.Settings {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.Containers[dir].Compute; c != nil {
		return *c
	}
	return scheduler.Settings{FromClaims: true}
}

func (s *settingsStore) hasCompute(dir string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.Containers[dir].Compute != nil
}

func (s *settingsStore) memory(dir string) ([controlblock.MaxDevices]uint64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m := s.Containers[dir].Memory; m != nil {
		return *m, true
	}
	return [controlblock.MaxDevices]uint64{}, false
}

// gpus returns the saved GPU settings by UUID. A file written before GPUs
// were known by UUID keys them by NVML index: node (the node's UUIDs by
// index) names them; those it cannot name are returned in unknown.
func (s *settingsStore) gpus(node []string) (out map[string]scheduler.GPUSettings, unknown []string) {
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

// gpu returns one GPU's saved settings.
func (s *settingsStore) gpu(uuid string) scheduler.GPUSettings {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.GPUs[uuid]
	return scheduler.GPUSettings{Policy: g.Policy, PolicySet: g.PolicySet, MaxInst: g.MaxInst}
}

// prune forgets the settings of containers whose control directories are
// gone (exists says which are there), so the store does not grow with every
// container that ever ran.
func (s *settingsStore) prune(exists func(dir string) bool) error {
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
	return s.update(func(s *settingsStore) {
		for _, dir := range gone {
			if !exists(dir) { // not made again since
				delete(s.Containers, dir)
			}
		}
	})
}

// update changes the store and writes it out (atomically, root only).
func (s *settingsStore) update(change func(*settingsStore)) error {
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
