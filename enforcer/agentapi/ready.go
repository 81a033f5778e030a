package agentapi

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
)

// An agent is ready once every part it runs has started (up, or known down:
// /readyz says which) and its HTTP server, started last, answers: from then
// on GET /healthz answers 200. A process that starts `gpuwarden agent`
// learns that moment, and the address of a :0 listener, from its ready fd:
// given --ready-fd=N, the agent writes its HTTP address ("" with http off)
// and a newline on fd N, then closes it. Nobody reads the agent's log for it.

// Readiness is the starting process's end of an agent's ready fd.
type Readiness struct {
	r, w *os.File
}

// AwaitReady gives cmd, not started yet, a ready fd: a pipe's write end as
// the next of cmd.ExtraFiles, and --ready-fd naming it at the end of
// cmd.Args. Call Wait once cmd has started, or Close if it did not start.
func AwaitReady(cmd *exec.Cmd) (*Readiness, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("the agent's ready fd: %w", err)
	}
	fd := 3 + len(cmd.ExtraFiles) // ExtraFiles[i] is the child's fd 3+i
	cmd.ExtraFiles = append(cmd.ExtraFiles, w)
	cmd.Args = append(cmd.Args, "--ready-fd="+strconv.Itoa(fd))
	return &Readiness{r: r, w: w}, nil
}

// Wait returns the agent's HTTP address once it is ready. When the agent
// exits first, or ctx ends, the error says which with the end of stderr
// (the agent's log so far; nil: none to show). A cmd.Stderr that is not an
// *os.File is copied by a goroutine that may lag the exit: such a stderr
// should call cmd.Wait first when the agent has exited, or lose its last lines.
func (r *Readiness) Wait(ctx context.Context, stderr func() string) (string, error) {
	// The agent holds the only write end now, so its exit ends the read.
	_ = r.w.Close()
	defer r.r.Close() // also ends the read below when ctx ends first
	type line struct {
		s   string
		err error
	}
	got := make(chan line, 1)
	go func() {
		s, err := bufio.NewReader(r.r).ReadString('\n')
		got <- line{s, err}
	}()
	select {
	case l := <-got:
		if l.err != nil {
			return "", fmt.Errorf("the agent exited before it was ready%s", logTail(stderr))
		}
		return strings.TrimSuffix(l.s, "\n"), nil
	case <-ctx.Done():
		return "", fmt.Errorf("the agent was not ready: %w%s", context.Cause(ctx), logTail(stderr))
	}
}

// Close releases the ready fd of an agent that did not start.
func (r *Readiness) Close() {
	_ = r.w.Close()
	_ = r.r.Close()
}

// logTail is LogEnd of stderr, worded for Wait's error.
func logTail(stderr func() string) string {
	if stderr == nil {
		return ""
	}
	if s := LogEnd(stderr()); s != "" {
		return "; its stderr ends:\n" + s
	}
	return " (its stderr is empty)"
}

// LogEnd is the last whole lines of an agent's log, at most 2 KiB, for an
// error or a failed test's message.
func LogEnd(log string) string {
	s := strings.TrimSpace(log)
	if len(s) > 2048 {
		s = s[len(s)-2048:]
		if i := strings.IndexByte(s, '\n'); i >= 0 {
			s = s[i+1:]
		}
	}
	return s
}
