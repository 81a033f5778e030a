package cgroups

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Mount returns where the cgroup v2 hierarchy is mounted, from a mountinfo
// file (normally /proc/self/mountinfo): /sys/fs/cgroup on most machines,
// /sys/fs/cgroup/unified on hybrid ones.
func Mount(mountinfo string) (string, error) {
	f, err := os.Open(mountinfo)
	if err != nil {
		return "", fmt.Errorf("read mountinfo: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// "36 35 0:31 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw"
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		fields, fstype := strings.Fields(pre), strings.Fields(post)
		if len(fields) >= 5 && len(fstype) >= 1 && fstype[0] == "cgroup2" {
			return fields[4], nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("read mountinfo: %w", err)
	}
	return "", errors.New("no cgroup2 mount in " + mountinfo)
}

// OfProcess returns a process's cgroup v2 path ("/kubepods/..."), read from
// <procRoot>/<pid>/cgroup.
func OfProcess(procRoot string, pid int) (string, error) {
	b, err := os.ReadFile(filepath.Join(procRoot, fmt.Sprint(pid), "cgroup"))
	if err != nil {
		return "", fmt.Errorf("read cgroup of pid %d: %w", pid, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "0::"); ok {
			return rest, nil
		}
	}
	return "", fmt.Errorf("pid %d has no cgroup v2 path", pid)
}

// Resolver maps cgroup ids to paths by walking the cgroup2 tree: a cgroup's
// id is its directory's inode. It walks again on a miss, at most once per
// minWalk, so an unknown id costs nothing when asked about repeatedly. A
// known id is checked again (one stat) when its last check is older than
// recheck, so a removed cgroup stops resolving within that time.
type Resolver struct {
	root             string
	minWalk, recheck time.Duration

	mu       sync.Mutex
	byID     map[uint64]known
	lastWalk time.Time
}

type known struct {
	path    string
	checked time.Time
}

// NewResolver resolves ids under root, the cgroup2 mount.
func NewResolver(root string) *Resolver {
	return &Resolver{root: root, minWalk: time.Second, recheck: 3 * time.Second, byID: map[uint64]known{}}
}

// Path returns the cgroup path ("/kubepods/...") of id, or false if no
// cgroup has it (it may have been removed).
func (r *Resolver) Path(id uint64) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	if k, ok := r.byID[id]; ok {
		if now.Sub(k.checked) < r.recheck {
			return k.path, true
		}
		if got, err := r.ID(k.path); err == nil && got == id {
			r.byID[id] = known{k.path, now}
			return k.path, true
		}
		delete(r.byID, id) // removed (or replaced) since the last walk
	}
	if now.Sub(r.lastWalk) < r.minWalk {
		return "", false
	}
	r.walkLocked()
	k, ok := r.byID[id]
	return k.path, ok
}

// ID returns the cgroup id of a cgroup path.
func (r *Resolver) ID(path string) (uint64, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(r.root, path), &st); err != nil {
		return 0, fmt.Errorf("stat cgroup %s: %w", path, err)
	}
	return st.Ino, nil
}

func (r *Resolver) walkLocked() {
	r.lastWalk = time.Now()
	byID := make(map[uint64]known, len(r.byID))
	_ = filepath.WalkDir(r.root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil // a cgroup removed mid-walk is simply gone
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		st, ok := info.Sys().(*syscall.Stat_t)
		if !ok {
			return nil
		}
		rel, _ := filepath.Rel(r.root, p)
		byID[st.Ino] = known{"/" + strings.TrimPrefix(filepath.ToSlash(rel), "."), r.lastWalk}
		return nil
	})
	byID[r.rootID()] = known{"/", r.lastWalk}
	r.byID = byID
}

func (r *Resolver) rootID() uint64 {
	var st syscall.Stat_t
	if syscall.Stat(r.root, &st) != nil {
		return 0
	}
	return st.Ino
}

// HostPath turns a process's cgroup path, as /proc/<pid>/cgroup shows it to
// a reader in its own cgroup namespace (relative to that namespace's root,
// "/../x" for what lies outside it), into the path in the host's tree, given
// the host path of the reader's namespace root ("/" outside any namespace).
func HostPath(nsRoot, p string) string {
	return path.Join("/", nsRoot, p)
}

// Within says whether cgroup p is root or lies under it.
func Within(p, root string) bool {
	p, root = path.Clean("/"+p), path.Clean("/"+root)
	return root == "/" || p == root || strings.HasPrefix(p, root+"/")
}

// NamespaceRoot finds the host path of the caller's cgroup namespace root:
// the cgroup2 mount of the caller's own view (its namespace's root) looked
// up in r, the resolver of the host's tree. Outside a namespace it is "/".
func NamespaceRoot(r *Resolver, ownMountinfo string) (string, error) {
	own, err := Mount(ownMountinfo)
	if err != nil {
		return "", err
	}
	var st syscall.Stat_t
	if err := syscall.Stat(own, &st); err != nil {
		return "", fmt.Errorf("stat %s: %w", own, err)
	}
	p, ok := r.Path(st.Ino)
	if !ok {
		return "", fmt.Errorf("the cgroup at %s is not in the host tree %s", own, r.root)
	}
	return p, nil
}
