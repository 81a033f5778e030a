package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// binDir is the directory holding the gpuwarden binary: the other build
// outputs (bin/simgpu/...) live beside it.
func binDir() (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find own binary: %w", err)
	}
	exe, err = filepath.EvalSymlinks(exe)
	if err != nil {
		return "", fmt.Errorf("find own binary: %w", err)
	}
	return filepath.Dir(exe), nil
}

// simMachine is a simulated GPU machine in a directory of its own.
type simMachine struct {
	dir     string // holds the state file
	bin     string // bin/ with simgpu/ in it
	devices int
	memory  string
}

func newSimMachine(devices int, memory string) (*simMachine, error) {
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(bin, "simgpu", "workload")); err != nil {
		return nil, fmt.Errorf("simgpu is not built next to %s: run `make build` (%w)", bin, err)
	}
	dir, err := os.MkdirTemp("", "gpuwarden-sim-")
	if err != nil {
		return nil, fmt.Errorf("make simulated machine: %w", err)
	}
	return &simMachine{dir: dir, bin: bin, devices: devices, memory: memory}, nil
}

func (m *simMachine) close() { os.RemoveAll(m.dir) }

func (m *simMachine) env() []string {
	return append(os.Environ(),
		"SIMGPU_STATE="+filepath.Join(m.dir, "simgpu.state"),
		fmt.Sprintf("SIMGPU_DEVICES=%d", m.devices),
		"SIMGPU_MEMORY="+m.memory,
	)
}

// workload returns a command running bin/simgpu/workload on this machine.
func (m *simMachine) workload(args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(m.bin, "simgpu", "workload"), args...)
	cmd.Env = m.env()
	return cmd
}
