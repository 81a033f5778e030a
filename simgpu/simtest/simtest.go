// Package simtest helps tests run real processes on simgpu: it finds the
// repository's build outputs, gives each test its own simulated machine, and
// decides what a test that needs privileges does where it has none.
package simtest

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

var (
	rootOnce sync.Once
	root     string
)

// Root returns the repository root: the nearest directory above the working
// directory that holds go.mod.
func Root(t testing.TB) string {
	t.Helper()
	rootOnce.Do(func() {
		dir, err := os.Getwd()
		if err != nil {
			return
		}
		for {
			if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
				root = dir
				return
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				return
			}
			dir = parent
		}
	})
	if root == "" {
		t.Fatal("simtest: no go.mod above the working directory")
	}
	return root
}

// Bin returns the path of a build output under bin/, failing the test with
// the command to run when it is missing.
func Bin(t testing.TB, rel string) string {
	t.Helper()
	p := filepath.Join(Root(t), "bin", rel)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("simtest: %s is missing: run `make build` first (%v)", p, err)
	}
	return p
}

// Machine is one simulated GPU machine: a state file that every process a
// test starts through it shares.
type Machine struct {
	State   string
	Devices int
	Memory  string
}

// NewMachine gives the test a fresh machine with the given devices and memory per device.
func NewMachine(t testing.TB, devices int, memory string) *Machine {
	t.Helper()
	return &Machine{State: filepath.Join(t.TempDir(), "simgpu.state"), Devices: devices, Memory: memory}
}

// Env is the environment a process needs to use this machine.
func (m *Machine) Env() []string {
	return []string{
		"SIMGPU_STATE=" + m.State,
		fmt.Sprintf("SIMGPU_DEVICES=%d", m.Devices),
		"SIMGPU_MEMORY=" + m.Memory,
	}
}

// Command builds a command on this machine with the machine's environment
// added to the test process's own.
func (m *Machine) Command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), m.Env()...)
	return cmd
}

// Proc is a started process whose stdout the test reads line by line.
type Proc struct {
	Cmd   *exec.Cmd
	lines chan string
	mu    sync.Mutex
	out   strings.Builder
	errb  strings.Builder
}

// Start starts cmd, killing it when the test ends.
func Start(t testing.TB, cmd *exec.Cmd) *Proc {
	t.Helper()
	p := &Proc{Cmd: cmd, lines: make(chan string, 1024)}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = &lockedWriter{mu: &p.mu, b: &p.errb}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", cmd.Path, err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.mu.Lock()
			p.out.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
			p.lines <- sc.Text()
		}
		close(p.lines)
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return p
}

// WaitLine waits for a stdout line starting with prefix and returns it.
func (p *Proc) WaitLine(t testing.TB, prefix string, timeout time.Duration) string {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				t.Fatalf("%s exited before printing %q; stderr: %s", p.Cmd.Path, prefix, p.Stderr())
			}
			if strings.HasPrefix(l, prefix) {
				return l
			}
		case <-deadline:
			t.Fatalf("%s printed no %q within %v; stderr: %s", p.Cmd.Path, prefix, timeout, p.Stderr())
		}
	}
}

// Wait waits for the process to exit and returns all it printed on stdout.
// Stdout is read to its end first: Cmd.Wait closes the pipe once the
// process exits, and what was still in it would be lost.
func (p *Proc) Wait() (string, error) {
	for range p.lines {
	}
	err := p.Cmd.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String(), err
}

// Stderr returns what the process printed on stderr so far.
func (p *Proc) Stderr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.errb.String()
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *strings.Builder
}

func (w *lockedWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(b)
}

var _ io.Writer = (*lockedWriter)(nil)

// RequirePrivileged skips a test that needs root (eBPF, cgroups) where it
// cannot run, unless GPUWARDEN_REQUIRE_PRIVILEGED=1, where it fails instead:
// CI must never pass by skipping.
func RequirePrivileged(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("GPUWARDEN_REQUIRE_PRIVILEGED") == "1" {
		t.Fatalf("needs root for %s, and GPUWARDEN_REQUIRE_PRIVILEGED=1 forbids skipping", why)
	}
	t.Skipf("needs root for %s", why)
}

// RunWithProcessMachine runs a test binary's tests (m.Run) with one simulated
// machine set in the process's own environment: simgpu's libraries read
// SIMGPU_STATE once per process, so a test binary that loads NVML itself
// (go-nvml) can watch only one machine. Use it from TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(simtest.RunWithProcessMachine(m, &machine, 2, "8Gi")) }
func RunWithProcessMachine(m *testing.M, machine **Machine, devices int, memory string) int {
	dir, err := os.MkdirTemp("", "simgpu-machine-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	*machine = &Machine{State: filepath.Join(dir, "simgpu.state"), Devices: devices, Memory: memory}
	for _, kv := range (*machine).Env() {
		k, v, _ := strings.Cut(kv, "=")
		os.Setenv(k, v)
	}
	return m.Run()
}

// LockedBuffer is a buffer a running process or goroutine writes while the
// test reads what it wrote so far.
type LockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *LockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *LockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
