package relay

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/hostcgroup"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/client"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/session"
)

// TestRelaySockets: a socket is served however long the control
// directory's path; the peer is identified by its cgroup as the kernel
// reports it, and a refused peer's connection is closed at once; a new
// relay serves the allocations it finds; a released allocation's socket
// is gone.
func TestRelaySockets(t *testing.T) {
	control := filepath.Join(t.TempDir(), strings.Repeat("d", 100))
	dir := "remote-GPU-0-0123456789abcdef"
	if err := os.MkdirAll(filepath.Join(control, dir), 0o755); err != nil {
		t.Fatal(err)
	}
	seen := make(chan string, 4)
	cfg := Config{ControlDir: control, ProcRoot: "/proc", Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Dialer: func(string) (*client.Dialer, bool) { return nil, false },
		Identify: func(_ context.Context, d, cg string) (session.Workload, error) {
			seen <- d + " " + cg
			return session.Workload{}, errors.New("not this pod")
		}}
	r := New(cfg)
	if err := r.Listen(dir); err != nil {
		t.Fatal(err)
	}
	if err := r.Listen("../x"); err == nil {
		t.Error("listened in ../x")
	}
	sock := r.Socket(dir)
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o666 {
		t.Fatalf("socket %s: %v", sock, err)
	}
	// Connect through a short link: the path is longer than an address holds.
	short := filepath.Join(os.TempDir(), "gw-relay-test-"+filepath.Base(t.TempDir()))
	if err := os.Symlink(filepath.Dir(sock), short); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(short)
	c, err := net.Dial("unix", filepath.Join(short, session.RelaySocket))
	if err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("a refused peer read %d bytes, %v; want EOF", n, err)
	}
	c.Close()
	own, _ := hostcgroup.Of("/proc", os.Getpid())
	if got := <-seen; got != dir+" "+own {
		t.Fatalf("identified %q, want %q", got, dir+" "+own)
	}
	r.Close()

	// A restarted relay serves what has a grant.
	if err := os.WriteFile(filepath.Join(control, dir, session.GrantFile), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	r = New(cfg)
	defer r.Close()
	if err := r.Restore(); err != nil {
		t.Fatal(err)
	}
	c, err = net.Dial("unix", filepath.Join(short, session.RelaySocket))
	if err != nil {
		t.Fatalf("restored socket: %v", err)
	}
	c.Close()
	<-seen
	if err := r.Release(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Dir(sock)); !os.IsNotExist(err) {
		t.Fatalf("released relay directory: %v", err)
	}
}
