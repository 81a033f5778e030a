package interposer_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
)

// TestControlFilesNotFollowed: limits and usage are taken only as regular
// files, never through a symlink, and a FIFO in their place is refused at
// once rather than waited on. Each is a one-line error naming the file, and
// every hook fails (closed), whatever the linked file would have allowed.
func TestControlFilesNotFollowed(t *testing.T) {
	for _, c := range []struct {
		name, file string
		make       func(t *testing.T, path string)
	}{
		{"limits-symlink", "limits", func(t *testing.T, path string) {
			// a file of the container's own making, allowing 8 GiB
			other := filepath.Join(t.TempDir(), "limits")
			var cfg controlblock.LimitsConfig
			cfg.MemLimit[0] = 8 * gi
			f, err := controlblock.CreateLimits(other, cfg)
			if err != nil {
				t.Fatal(err)
			}
			f.Close()
			if err := os.Symlink(other, path); err != nil {
				t.Fatal(err)
			}
		}},
		{"limits-fifo", "limits", func(t *testing.T, path string) {
			if err := syscall.Mkfifo(path, 0o644); err != nil {
				t.Fatal(err)
			}
		}},
		{"usage-symlink", "usage", func(t *testing.T, path string) {
			other := filepath.Join(t.TempDir(), "usage")
			if err := os.WriteFile(other, nil, 0o666); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(other, path); err != nil {
				t.Fatal(err)
			}
		}},
		{"usage-fifo", "usage", func(t *testing.T, path string) {
			if err := syscall.Mkfifo(path, 0o666); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := newBox(t, 1, "16Gi", "GPUWARDEN_MEMORY_LIMIT=1Gi")
			if err := os.MkdirAll(filepath.Join(b.ctl, b.key), 0o755); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(b.ctl, b.key, c.file)
			c.make(t, path)
			r := b.runWithin(20*time.Second, "init", "ctx", "0", "alloc", "4Gi")
			r.expect(t, "init CUDA_ERROR_NOT_PERMITTED", "ctx CUDA_ERROR_NOT_PERMITTED", "alloc CUDA_ERROR_NOT_PERMITTED")
			if lines := strings.Split(strings.TrimSpace(r.stderr), "\n"); len(lines) != 1 || !strings.Contains(lines[0], path) {
				t.Errorf("stderr %q, want one line naming %s", r.stderr, path)
			}
		})
	}
}

// runWithin is run, killing gw-check if it has not finished in d (a
// process blocked on a control file must fail the test, not hang it).
func (b *box) runWithin(d time.Duration, args ...string) result {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	cmd := b.check(args...)
	kill := exec.CommandContext(ctx, cmd.Path, cmd.Args[1:]...)
	kill.Env, kill.SysProcAttr = cmd.Env, cmd.SysProcAttr
	var stderr strings.Builder
	kill.Stderr = &stderr
	out, err := kill.Output()
	if ctx.Err() != nil {
		b.t.Fatalf("gw-check still running after %v: %s", d, stderr.String())
	}
	return result{lines: strings.Split(strings.TrimSpace(string(out)), "\n"), stderr: stderr.String(), err: err}
}
