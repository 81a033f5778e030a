// Package simmachine runs a simulated GPU machine for the demo and the
// benchmarks: simgpu's state in a directory of its own, its workload, and a
// gpuwarden agent on it, started and known to be ready through its ready fd.
package simmachine

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/agentapi"
)

// BinDir is the directory holding the gpuwarden binary: the other build
// outputs (bin/simgpu/...) live beside it.
func BinDir() (string, error) {
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

// Machine is a simulated GPU machine in a directory of its own.
type Machine struct {
	Dir     string // holds the state file
	Bin     string // bin/ with simgpu/ in it
	devices int
	memory  string
}

// New makes a machine of devices GPUs of memory each ("16Gi") in a new
// temporary directory; Close removes it.
func New(devices int, memory string) (*Machine, error) {
	bin, err := BinDir()
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
	return &Machine{Dir: dir, Bin: bin, devices: devices, memory: memory}, nil
}

// Close removes the machine's directory.
func (m *Machine) Close() { os.RemoveAll(m.Dir) }

// Env is the environment of a process on this machine.
func (m *Machine) Env() []string {
	return append(os.Environ(),
		"SIMGPU_STATE="+filepath.Join(m.Dir, "simgpu.state"),
		fmt.Sprintf("SIMGPU_DEVICES=%d", m.devices),
		"SIMGPU_MEMORY="+m.memory,
	)
}

// Workload returns a command running bin/simgpu/workload on this machine.
func (m *Machine) Workload(args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(m.Bin, "simgpu", "workload"), args...)
	cmd.Env = m.Env()
	return cmd
}

// ControlDir is where this machine's containers keep their control blocks.
func (m *Machine) ControlDir() string { return filepath.Join(m.Dir, "control") }

// StartAgent runs `gpuwarden agent` on this machine: NVML and eBPF on
// simgpu's libraries, nothing pinned, no kubelet, its token and settings in
// the machine's directory, its log in agent.log there; env adds or
// overrides settings. It returns once the agent is ready, with its address.
func (m *Machine) StartAgent(listen string, env ...string) (*exec.Cmd, string, error) {
	return m.StartAgentIn("", listen, env...)
}

// StartAgentIn is StartAgent in a network namespace (its /proc/PID/ns/net
// path; "": the caller's).
func (m *Machine) StartAgentIn(netns, listen string, env ...string) (*exec.Cmd, string, error) {
	cmd := exec.Command(filepath.Join(m.Bin, "gpuwarden"), "agent", "--listen", listen)
	if netns != "" {
		cmd = exec.Command("nsenter", "--net="+netns, "--", filepath.Join(m.Bin, "gpuwarden"), "agent", "--listen", listen)
	}
	cmd.Env = append(m.Env(), "GPUWARDEN_CONTROL_DIR="+m.ControlDir(),
		"GPUWARDEN_NVML_LIBRARY="+filepath.Join(m.Bin, "simgpu", "libnvidia-ml.so.1"),
		"GPUWARDEN_EBPF_LIBRARIES="+filepath.Join(m.Bin, "simgpu", "libcuda.so.1"),
		"GPUWARDEN_EBPF_LDCONFIG_SONAME=", "GPUWARDEN_EBPF_PIN_DIR=", "GPUWARDEN_KUBELET_POD_RESOURCES_SOCKET=",
		"GPUWARDEN_ENFORCEMENT_API_TOKEN_FILE="+filepath.Join(m.Dir, "token"),
		"GPUWARDEN_ENFORCEMENT_STATE_FILE="+filepath.Join(m.Dir, "settings.json"))
	cmd.Env = append(cmd.Env, env...) // later entries win
	logPath := filepath.Join(m.Dir, "agent.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, "", err
	}
	defer logf.Close()
	cmd.Stderr = logf
	ready, err := agentapi.AwaitReady(cmd)
	if err != nil {
		return nil, "", err
	}
	if err := cmd.Start(); err != nil {
		ready.Close()
		return nil, "", fmt.Errorf("start agent: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	addr, err := ready.Wait(ctx, func() string { b, _ := os.ReadFile(logPath); return string(b) })
	if err != nil {
		StopProcess(cmd)
		return nil, "", fmt.Errorf("agent on %s: %w", listen, err)
	}
	return cmd, addr, nil
}

// StopProcess stops a process with SIGTERM, and SIGKILL after 10 s.
func StopProcess(cmd *exec.Cmd) {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}
