package controlblock

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Containers write into their control directories, so every file there is
// hostile input: it may be a symlink (to /dev/zero, to another container's
// file), a FIFO, a device node, a directory, a file of any size, or a file
// truncated while the agent reads it. The agent opens them only through
// openControlFile.

// ErrBadFile says a control file is not the regular file of the ABI's size
// that the agent or the interposer made.
var ErrBadFile = errors.New("not a control file")

// ErrEmpty says a control file has no bytes: a ledger the device plugin
// made, not laid out yet by the container's first process.
var ErrEmpty = fmt.Errorf("%w: empty", ErrBadFile)

// fileRule is what a control file must be.
type fileRule struct {
	size int64
	// agentOwned: owned by the agent's user, one link, writable by no one
	// else (limits); a ledger is owned by the container's user.
	agentOwned bool
}

// openControlFile opens path without following a symlink and without
// blocking on a special file. It checks the path with lstat before opening
// (so a FIFO or a device is never opened) and the open file with fstat
// (the same inode, still conforming).
func openControlFile(path string, flag int, rule fileRule) (int, error) {
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		return -1, &os.PathError{Op: "lstat", Path: path, Err: err}
	}
	if err := rule.check(&st); err != nil {
		return -1, fmt.Errorf("%s: %w", path, err)
	}
	fd, err := syscall.Open(path, flag|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: path, Err: err}
	}
	var fst syscall.Stat_t
	if err := syscall.Fstat(fd, &fst); err != nil {
		syscall.Close(fd)
		return -1, &os.PathError{Op: "fstat", Path: path, Err: err}
	}
	if fst.Dev != st.Dev || fst.Ino != st.Ino {
		syscall.Close(fd)
		return -1, fmt.Errorf("%s: %w: replaced while opened", path, ErrBadFile)
	}
	if err := rule.check(&fst); err != nil {
		syscall.Close(fd)
		return -1, fmt.Errorf("%s: %w", path, err)
	}
	return fd, nil
}

func (r fileRule) check(st *syscall.Stat_t) error {
	switch {
	case st.Mode&syscall.S_IFMT != syscall.S_IFREG:
		return fmt.Errorf("%w: a %s", ErrBadFile, fileKind(st.Mode))
	case st.Size == 0:
		return ErrEmpty
	case st.Size != r.size:
		return fmt.Errorf("%w: %d bytes, want %d", ErrBadFile, st.Size, r.size)
	case !r.agentOwned:
		return nil
	case int(st.Uid) != os.Geteuid():
		return fmt.Errorf("%w: owned by uid %d, not the agent's", ErrBadFile, st.Uid)
	case st.Nlink != 1:
		return fmt.Errorf("%w: %d links", ErrBadFile, st.Nlink)
	case st.Mode&0o022 != 0:
		return fmt.Errorf("%w: writable by others (mode %#o)", ErrBadFile, st.Mode&0o7777)
	}
	return nil
}

func fileKind(mode uint32) string {
	switch mode & syscall.S_IFMT {
	case syscall.S_IFLNK:
		return "symlink"
	case syscall.S_IFDIR:
		return "directory"
	case syscall.S_IFIFO:
		return "FIFO"
	case syscall.S_IFCHR:
		return "character device"
	case syscall.S_IFBLK:
		return "block device"
	case syscall.S_IFSOCK:
		return "socket"
	case syscall.S_IFREG:
		return "regular file"
	}
	return "file of unknown type"
}

// PrepareControlDir makes the control directory the agent's before any
// container directory in it is adopted. A new one is mode 1777: interposers
// of any user make their container's directory in it, and the sticky bit
// keeps each from renaming or removing another's (or its own, once the agent
// owns it). An existing one keeps its mode, gaining the sticky bit where
// others may write it.
func PrepareControlDir(dir string) error {
	if err := os.Mkdir(dir, 0o755); err == nil {
		if err := os.Chmod(dir, 0o1777); err != nil {
			return fmt.Errorf("prepare control directory: %w", err)
		}
	} else if !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("prepare control directory: %w", err)
	}
	fd, err := syscall.Open(dir, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("prepare control directory: %w", &os.PathError{Op: "open", Path: dir, Err: err})
	}
	defer syscall.Close(fd)
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return fmt.Errorf("prepare control directory: %w", err)
	}
	mode := st.Mode & 0o7777
	if mode&0o022 != 0 {
		mode |= syscall.S_ISVTX
	}
	if err := own(fd, &st, mode); err != nil {
		return fmt.Errorf("prepare control directory %s: %w", dir, err)
	}
	return nil
}

// AdoptDir makes a container's control directory the agent's: root-owned
// (the agent's user), mode 0755, so the container can no longer create,
// rename or remove files in it; its `usage` stays writable by the container
// through the file's own mode. Off Kubernetes the interposer made the
// directory as the container's user. A symlink or a non-directory is
// refused. The directory is made when missing.
func AdoptDir(dir string) error {
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("adopt %s: %w", dir, err)
	}
	fd, err := syscall.Open(dir, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		var st syscall.Stat_t
		if syscall.Lstat(dir, &st) == nil && st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
			return fmt.Errorf("adopt %s: %w: a %s, not a directory", dir, ErrBadFile, fileKind(st.Mode))
		}
		return fmt.Errorf("adopt %s: %w", dir, err)
	}
	defer syscall.Close(fd)
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return fmt.Errorf("adopt %s: %w", dir, err)
	}
	if err := own(fd, &st, 0o755); err != nil {
		return fmt.Errorf("adopt %s: %w", dir, err)
	}
	return nil
}

// own gives an open directory to the agent's user and group with mode, when
// it has other ones. The owner changes first: until then its old owner
// could still change the mode back.
func own(fd int, st *syscall.Stat_t, mode uint32) error {
	uid, gid := os.Geteuid(), os.Getegid()
	chowned := int(st.Uid) != uid || int(st.Gid) != gid
	if chowned {
		if err := syscall.Fchown(fd, uid, gid); err != nil {
			return fmt.Errorf("chown: %w", err)
		}
	}
	if chowned || st.Mode&0o7777 != mode { // chown may clear set-id bits
		if err := syscall.Fchmod(fd, mode); err != nil {
			return fmt.Errorf("chmod: %w", err)
		}
	}
	return nil
}

// RemoveDir removes the control directory name in controlDir: the named
// files in it, then the directory, never following a symlink (what is
// unlinked is the entry itself, whatever it points to). The directory is
// made the agent's first (AdoptDir's rule), so no one else can add an entry
// while it goes; an entry that is not one of files keeps it, with an error.
func RemoveDir(controlDir, name string, files ...string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsRune(name, '/') {
		return fmt.Errorf("remove %q: not a directory name", name)
	}
	pfd, err := unix.Open(controlDir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("remove %s: %w", name, &os.PathError{Op: "open", Path: controlDir, Err: err})
	}
	defer unix.Close(pfd)
	fd, err := unix.Openat(pfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("remove %s: %w", name, err)
	}
	defer unix.Close(fd)
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return fmt.Errorf("remove %s: %w", name, err)
	}
	if err := own(fd, &st, 0o755); err != nil {
		return fmt.Errorf("remove %s: %w", name, err)
	}
	for _, f := range files {
		if err := unix.Unlinkat(fd, f, 0); err != nil && err != unix.ENOENT {
			return fmt.Errorf("remove %s/%s: %w", name, f, err)
		}
	}
	var now unix.Stat_t
	if err := unix.Fstatat(pfd, name, &now, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("remove %s: %w", name, err)
	}
	if now.Dev != st.Dev || now.Ino != st.Ino {
		return fmt.Errorf("remove %s: %w: replaced while removed", name, ErrBadFile)
	}
	if err := unix.Unlinkat(pfd, name, unix.AT_REMOVEDIR); err != nil {
		return fmt.Errorf("remove %s: %w", name, err)
	}
	return nil
}
