package agentapi

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a process's stderr, read while the process writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// shell runs script with sh as an agent is run: --ready-fd=N comes as $1.
func shell(t *testing.T, script string, extra ...*os.File) (*exec.Cmd, *Readiness, *syncBuffer) {
	t.Helper()
	cmd := exec.Command("sh", "-c", script, "sh")
	cmd.ExtraFiles = extra
	var stderr syncBuffer
	cmd.Stderr = &stderr
	r, err := AwaitReady(cmd)
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		r.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd, r, &stderr
}

// writeReady is what the agent does: its address on the fd --ready-fd names.
const writeReady = `fd=${1#--ready-fd=}; echo 127.0.0.1:4242 >&"$fd"; exec sleep 10`

func TestReadyAddress(t *testing.T) {
	_, r, stderr := shell(t, writeReady)
	addr, err := r.Wait(context.Background(), stderr.String)
	if err != nil || addr != "127.0.0.1:4242" {
		t.Errorf("Wait = %q, %v; want 127.0.0.1:4242", addr, err)
	}
}

// The ready fd follows the files cmd already passes.
func TestReadyAfterExtraFiles(t *testing.T) {
	other, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	cmd, r, stderr := shell(t, writeReady, other)
	if last := cmd.Args[len(cmd.Args)-1]; last != "--ready-fd=4" {
		t.Errorf("last argument %q, want --ready-fd=4", last)
	}
	if addr, err := r.Wait(context.Background(), stderr.String); err != nil || addr != "127.0.0.1:4242" {
		t.Errorf("Wait = %q, %v; want 127.0.0.1:4242", addr, err)
	}
}

func TestReadyAgentExitsFirst(t *testing.T) {
	cmd, r, stderr := shell(t, `echo "level=ERROR msg=\"agent failed to start\" err=\"listen: address in use\"" >&2; exit 1`)
	// The exit ends the ready fd before exec's goroutine has copied stderr.
	_, err := r.Wait(context.Background(), func() string { _ = cmd.Wait(); return stderr.String() })
	if err == nil || !strings.Contains(err.Error(), "exited before it was ready") ||
		!strings.Contains(err.Error(), "listen: address in use") {
		t.Errorf("Wait = %v; want an early exit with the agent's stderr", err)
	}
}

func TestReadyTimesOut(t *testing.T) {
	_, r, stderr := shell(t, `echo still starting >&2; exec sleep 10`)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	_, err := r.Wait(ctx, stderr.String)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "still starting") {
		t.Errorf("Wait = %v; want the deadline with the agent's stderr", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Wait returned %v after its deadline", d)
	}
}
