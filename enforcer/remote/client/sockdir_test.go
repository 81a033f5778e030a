package client

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestSweepSockDirs: a run killed with SIGKILL leaves its socket directory,
// and the next run removes it; directories of live runs, ones still being
// made (no lock file yet) and other files stay.
func TestSweepSockDirs(t *testing.T) {
	tmp := t.TempDir()
	mk := func(name string, withLock bool) string {
		dir := filepath.Join(tmp, name)
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if withLock {
			if err := os.WriteFile(filepath.Join(dir, "lock"), nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	killed := mk(sockDirPattern+"killed", true)
	live := mk(sockDirPattern+"live", true)
	making := mk(sockDirPattern+"making", false)
	other := mk("unrelated", true)

	// A run that held its lock and was killed: the kernel drops the lock.
	// (-o: flock holds it alone, not the sleep it runs; the group dies.)
	holder := exec.Command("flock", "-o", filepath.Join(killed, "lock"), "sleep", "30")
	holder.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	waitLocked(t, filepath.Join(killed, "lock"))
	_ = syscall.Kill(-holder.Process.Pid, syscall.SIGKILL)
	_ = holder.Wait()

	// A live run's lock, held here (flock locks belong to the open file).
	f, err := os.Open(filepath.Join(live, "lock"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}

	sweepSockDirs(tmp)
	for dir, want := range map[string]bool{killed: false, live: true, making: true, other: true} {
		if _, err := os.Stat(dir); (err == nil) != want {
			t.Errorf("%s: exists %v, want %v", filepath.Base(dir), err == nil, want)
		}
	}
}

// waitLocked waits until another process holds the lock on path.
func waitLocked(t *testing.T, path string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		f.Close() // releases it again if it was free
		if err != nil {
			return
		}
	}
	t.Fatalf("nobody took the lock on %s", path)
}

// TestSockDirLifetime: a run's directory exists, locked, while it runs and
// is gone after close.
func TestSockDirLifetime(t *testing.T) {
	d, err := newSockDir()
	if err != nil {
		t.Fatal(err)
	}
	sweepSockDirs(os.TempDir()) // another run's sweep must leave it
	if _, err := os.Stat(d.path); err != nil {
		t.Fatalf("a live run's directory was swept: %v", err)
	}
	d.close()
	if _, err := os.Stat(d.path); !os.IsNotExist(err) {
		t.Errorf("after close: %v, want it gone", err)
	}
}
