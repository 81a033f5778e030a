package main

import (
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/agentapi"
	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

// TestAgentReadyFD: an agent that cannot serve its address exits, and the
// process that started it learns so from the ready fd at once, with the
// agent's reason; one that can serve writes the address /healthz answers on.
func TestAgentReadyFD(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	dir := t.TempDir()
	start := func(listen string) (*exec.Cmd, *agentapi.Readiness, *strings.Builder) {
		cmd := exec.Command(simtest.Bin(t, "gpuwarden"), "agent", "--listen", listen)
		cmd.Env = append(os.Environ(), "GPUWARDEN_EBPF_ENABLED=false", "GPUWARDEN_NVML_ENABLED=false",
			"GPUWARDEN_KUBELET_POD_RESOURCES_SOCKET=", "GPUWARDEN_CONTROL_DIR="+filepath.Join(dir, "control"),
			"GPUWARDEN_ENFORCEMENT_API_TOKEN_FILE="+filepath.Join(dir, "token"),
			"GPUWARDEN_ENFORCEMENT_STATE_FILE="+filepath.Join(dir, "settings.json"))
		var stderr strings.Builder // read once the agent has exited, or not at all
		cmd.Stderr = &stderr
		ready, err := agentapi.AwaitReady(cmd)
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			ready.Close()
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd, ready, &stderr
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	cmd, ready, stderr := start(taken.Addr().String())
	_, err = ready.Wait(ctx, func() string { _ = cmd.Wait(); return stderr.String() })
	if err == nil || !strings.Contains(err.Error(), "exited before it was ready") ||
		!strings.Contains(err.Error(), "address already in use") {
		t.Errorf("an agent on a taken address: %v; want an early exit naming the address in use", err)
	}

	_, ready, _ = start("127.0.0.1:0")
	addr, err := ready.Wait(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatalf("GET /healthz at the ready address %q: %v", addr, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /healthz at the ready address: %s", resp.Status)
	}
}
