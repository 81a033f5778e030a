package main

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

// controlDir is where this machine's containers keep their control blocks.
func (m *simMachine) controlDir() string { return filepath.Join(m.dir, "control") }

// startAgent runs `gpuwarden agent` on this machine: NVML and eBPF on
// simgpu's libraries, nothing pinned, no kubelet, its token and settings in
// the machine's directory, its log in agent.log there; env adds or
// overrides settings. It returns once the agent is ready, with its address.
func (m *simMachine) startAgent(listen string, env ...string) (*exec.Cmd, string, error) {
	return m.startAgentIn("", listen, env...)
}

// startAgentIn is startAgent in a network namespace (its /proc/PID/ns/net
// path; "": the caller's).
func (m *simMachine) startAgentIn(netns, listen string, env ...string) (*exec.Cmd, string, error) {
	cmd := exec.Command(filepath.Join(m.bin, "gpuwarden"), "agent", "--listen", listen)
	if netns != "" {
		cmd = exec.Command("nsenter", "--net="+netns, "--", filepath.Join(m.bin, "gpuwarden"), "agent", "--listen", listen)
	}
	cmd.Env = append(m.env(), "GPUWARDEN_CONTROL_DIR="+m.controlDir(),
		"GPUWARDEN_NVML_LIBRARY="+filepath.Join(m.bin, "simgpu", "libnvidia-ml.so.1"),
		"GPUWARDEN_EBPF_LIBRARIES="+filepath.Join(m.bin, "simgpu", "libcuda.so.1"),
		"GPUWARDEN_EBPF_LDCONFIG_SONAME=", "GPUWARDEN_EBPF_PIN_DIR=", "GPUWARDEN_KUBELET_POD_RESOURCES_SOCKET=",
		"GPUWARDEN_ENFORCEMENT_API_TOKEN_FILE="+filepath.Join(m.dir, "token"),
		"GPUWARDEN_ENFORCEMENT_STATE_FILE="+filepath.Join(m.dir, "settings.json"))
	cmd.Env = append(cmd.Env, env...) // later entries win
	logPath := filepath.Join(m.dir, "agent.log")
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
		stopProcess(cmd)
		return nil, "", fmt.Errorf("agent on %s: %w", listen, err)
	}
	return cmd, addr, nil
}

// stopProcess stops a process with SIGTERM, and SIGKILL after 10 s.
func stopProcess(cmd *exec.Cmd) {
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
