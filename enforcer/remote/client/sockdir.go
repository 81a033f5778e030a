package client

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// sockDirPattern names the private directories that hold a run's driver
// socket, in the temporary directory.
const sockDirPattern = "gpuwarden-remote-"

// sockDir is a run's private directory for its driver socket. It holds a
// lock on a file inside for as long as the run lives: a run killed by
// SIGKILL cannot remove its directory, but the kernel drops its lock, and
// the next run removes what it left (sweepSockDirs).
type sockDir struct {
	path string
	lock *os.File
}

func newSockDir() (*sockDir, error) {
	sweepSockDirs(os.TempDir())
	dir, err := os.MkdirTemp("", sockDirPattern)
	if err != nil {
		return nil, fmt.Errorf("make the socket's directory: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR|syscall.O_NOFOLLOW, 0o600)
	if err == nil {
		err = syscall.Flock(int(lock.Fd()), syscall.LOCK_EX)
	}
	if err != nil {
		if lock != nil {
			lock.Close()
		}
		os.RemoveAll(dir)
		return nil, fmt.Errorf("lock the socket's directory: %w", err)
	}
	return &sockDir{path: dir, lock: lock}, nil
}

func (d *sockDir) close() {
	os.RemoveAll(d.path)
	d.lock.Close()
}

// sweepSockDirs removes the socket directories under tmp that runs of this
// user left behind: those whose lock nobody holds. A directory without a
// lock file may be a run's that is still making it, and is left alone.
func sweepSockDirs(tmp string) {
	dirs, _ := filepath.Glob(filepath.Join(tmp, sockDirPattern+"*"))
	for _, dir := range dirs {
		if st, err := os.Lstat(dir); err != nil || !st.IsDir() || !ownedByMe(st) {
			continue
		}
		f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDONLY|syscall.O_NOFOLLOW, 0)
		if err != nil {
			continue
		}
		if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil {
			os.RemoveAll(dir) // its run is gone: the lock was free
		}
		f.Close()
	}
}

func ownedByMe(st os.FileInfo) bool {
	s, ok := st.Sys().(*syscall.Stat_t)
	return ok && int(s.Uid) == os.Getuid()
}
