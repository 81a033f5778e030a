package simtest

import (
	"fmt"
	"io"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// AllocProg is a running cuda-alloc (bin/bpf/cuda-alloc), steered line by
// line on stdin.
type AllocProg struct {
	P     *Proc
	stdin io.WriteCloser
}

// StartAllocProg starts cmd (cuda-alloc or a copy), waiting for its "ready".
func StartAllocProg(t testing.TB, cmd *exec.Cmd) *AllocProg {
	t.Helper()
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &AllocProg{P: Start(t, cmd), stdin: in}
	p.P.WaitLine(t, "ready", 20*time.Second)
	return p
}

// Do sends a command and returns its reply's fields after "ok", failing the
// test on "err".
func (p *AllocProg) Do(t testing.TB, format string, args ...any) []string {
	t.Helper()
	reply := p.Try(t, format, args...)
	if reply[0] != "ok" {
		t.Fatalf("cuda-alloc %q: %s; stderr: %s", fmt.Sprintf(format, args...), strings.Join(reply, " "), p.P.Stderr())
	}
	return reply[1:]
}

// Try sends a command and returns its whole reply ("ok ..." or "err N").
func (p *AllocProg) Try(t testing.TB, format string, args ...any) []string {
	t.Helper()
	cmd := fmt.Sprintf(format, args...)
	if _, err := fmt.Fprintln(p.stdin, cmd); err != nil {
		t.Fatalf("cuda-alloc %q: %v; stderr: %s", cmd, err, p.P.Stderr())
	}
	line := p.P.WaitLine(t, "", 60*time.Second)
	return strings.Fields(line)
}

// Quit asks the program to exit and waits for it.
func (p *AllocProg) Quit(t testing.TB) {
	t.Helper()
	fmt.Fprintln(p.stdin, "quit")
	p.stdin.Close()
	if _, err := p.P.Wait(); err != nil {
		t.Fatalf("cuda-alloc: %v; stderr: %s", err, p.P.Stderr())
	}
}
