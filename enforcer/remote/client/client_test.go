package client

import (
	"bytes"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/remote/session"
)

func TestSplitServer(t *testing.T) {
	for in, want := range map[string]string{
		"gpu-node":       "gpu-node:7070",
		"gpu-node:7443":  "gpu-node:7443",
		"10.0.0.5":       "10.0.0.5:7070",
		"[fd00::1]:7071": "fd00::1:7071",
		"fd00::1":        "fd00::1:7070",
	} {
		h, p, err := SplitServer(in)
		if err != nil || h+":"+strconv.Itoa(p) != want {
			t.Errorf("%q: %s %d %v, want %s", in, h, p, err, want)
		}
	}
	for _, bad := range []string{"", "host:0", "host:99999", "host:http", ":7070"} {
		if _, _, err := SplitServer(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestProgramEnv(t *testing.T) {
	env := ProgramEnv([]string{"A=1", "LD_LIBRARY_PATH=/opt/lib", "GPUWARDEN_REMOTE=unix:/evil"}, "/gw/remote", "/tmp/s.sock")
	got := strings.Join(env, " ")
	for _, want := range []string{"A=1", "LD_LIBRARY_PATH=/gw/remote:/opt/lib", "GPUWARDEN_REMOTE=unix:/tmp/s.sock"} {
		if !strings.Contains(got, want) {
			t.Errorf("env %q lacks %q", got, want)
		}
	}
	if strings.Contains(got, "evil") {
		t.Errorf("env %q keeps the caller's GPUWARDEN_REMOTE", got)
	}
	if env := ProgramEnv(nil, "/gw/remote", "/s"); !strings.Contains(strings.Join(env, " "), "LD_LIBRARY_PATH=/gw/remote") {
		t.Errorf("env %q", env)
	}
}

// TestRunPassesExitStatus: the program's exit status (and a signal's
// 128+n) comes back; it sees the socket it is given.
func TestRunPassesExitStatus(t *testing.T) {
	d := &Dialer{Addr: "127.0.0.1:1", Timeout: time.Second} // never dialled: the program opens no session
	var out bytes.Buffer
	code, err := Run(Program{Args: []string{"sh", "-c", `test -S "${GPUWARDEN_REMOTE#unix:}" && echo socket; exit 3`},
		LibDir: "/x", Stdout: &out, Stderr: &out}, d, session.Request{MemoryFraction: 0.5}, t.Logf)
	if err != nil || code != 3 || !strings.Contains(out.String(), "socket") {
		t.Fatalf("code %d err %v output %q", code, err, out.String())
	}
	code, err = Run(Program{Args: []string{"sh", "-c", "kill -TERM $$"}}, d, session.Request{MemoryFraction: 0.5}, t.Logf)
	if err != nil || code != 128+15 {
		t.Fatalf("killed program: code %d err %v", code, err)
	}
	if _, err := Run(Program{}, d, session.Request{}, t.Logf); err == nil {
		t.Fatal("ran no command")
	}
}

// TestServeRefusedSessionClosesSocket: when the server cannot be reached,
// the program's connection is closed at once (its driver calls fail).
func TestServeRefusedSessionClosesSocket(t *testing.T) {
	d := &Dialer{Addr: "127.0.0.1:1", Timeout: time.Second}
	var msgs []string
	var out bytes.Buffer
	code, err := Run(Program{Args: []string{"sh", "-c", `exec python3 -c '
import os, socket
s = socket.socket(socket.AF_UNIX)
s.connect(os.environ["GPUWARDEN_REMOTE"][5:])
s.settimeout(5)
print("eof" if s.recv(1) == b"" else "data")'`}, Stdout: &out}, d, session.Request{MemoryFraction: 0.5},
		func(f string, a ...any) { msgs = append(msgs, f) })
	if err != nil || code != 0 || out.String() != "eof\n" {
		t.Fatalf("code %d err %v output %q", code, err, out.String())
	}
	if len(msgs) == 0 {
		t.Fatal("the failed connection was not reported")
	}
}
