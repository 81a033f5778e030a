package cgroups

import (
	"fmt"
	"io/fs"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/hostcgroup"
)

// Resolver maps cgroup ids to paths by walking the cgroup2 tree: a cgroup's
// id is its directory's inode. It walks again on a miss, at most once per
// minWalk, so an unknown id costs nothing when asked about repeatedly. A
// known id is checked again (one stat) when its last check is older than
// recheck, so a removed cgroup stops resolving within that time.
//
// Ids are handed out in increasing order and never reused (kernfs), so an
// id below the highest a walk found, and not found, belongs to a removed
// cgroup: it is not walked for again for gone (the eBPF view keeps removed
// containers' ids for a while). An id above it may be a cgroup made after
// the walk, or one a container names in its ledger ahead of time: it is
// walked for again, so no container can make a future id unresolvable.
type Resolver struct {
	root                   string
	minWalk, recheck, gone time.Duration

	mu       sync.Mutex
	byID     map[uint64]known
	lastWalk time.Time
	maxID    uint64               // the highest id the last walk found
	removed  map[uint64]time.Time // ids below maxID a walk did not find, and when
}

type known struct {
	path    string
	checked time.Time
}

// NewResolver resolves ids under root, the cgroup2 mount.
func NewResolver(root string) *Resolver {
	return &Resolver{root: root, minWalk: time.Second, recheck: 3 * time.Second, gone: time.Minute, byID: map[uint64]known{},
		removed: map[uint64]time.Time{}}
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
	if at, ok := r.removed[id]; ok && now.Sub(at) < r.gone {
		return "", false
	}
	if now.Sub(r.lastWalk) < r.minWalk {
		return "", false
	}
	r.walkLocked()
	k, ok := r.byID[id]
	if !ok && id < r.maxID {
		r.removed[id] = r.lastWalk
	}
	return k.path, ok
}

// ID returns the cgroup id of a cgroup path.
func (r *Resolver) ID(path string) (uint64, error) {
	var st syscall.Stat_t
	// Paths are absolute, from the kernel or the walk: at a thousand
	// cgroups, Join's cleaning costs more than the stat.
	full := r.root + path
	if !strings.HasPrefix(path, "/") {
		full = filepath.Join(r.root, path)
	}
	if err := syscall.Stat(full, &st); err != nil {
		return 0, fmt.Errorf("stat cgroup %s: %w", path, err)
	}
	return st.Ino, nil
}

// Paths walks the tree now and returns every cgroup's path ("/" first).
func (r *Resolver) Paths() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.walkLocked()
	out := make([]string, 0, len(r.byID))
	for _, k := range r.byID {
		out = append(out, k.path)
	}
	sort.Strings(out)
	return out
}

func (r *Resolver) walkLocked() {
	r.lastWalk = time.Now()
	byID := make(map[uint64]known, len(r.byID))
	var maxID uint64
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
		maxID = max(maxID, st.Ino)
		return nil
	})
	byID[r.rootID()] = known{"/", r.lastWalk}
	r.byID, r.maxID = byID, maxID
	for id, at := range r.removed {
		if _, ok := byID[id]; ok || r.lastWalk.Sub(at) >= r.gone {
			delete(r.removed, id)
		}
	}
}

func (r *Resolver) rootID() uint64 {
	var st syscall.Stat_t
	if syscall.Stat(r.root, &st) != nil {
		return 0
	}
	return st.Ino
}

// NamespaceRoot finds the host path of the caller's cgroup namespace root:
// the cgroup2 mount of the caller's own view (its namespace's root) looked
// up in r, the resolver of the host's tree. Outside a namespace it is "/".
func NamespaceRoot(r *Resolver, ownMountinfo string) (string, error) {
	own, err := hostcgroup.Mount(ownMountinfo)
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

// CheckPlaced says whether r can place the node's GPU users in its tree:
// pids (NVML's processes, those eBPF found mapping libcuda), read through
// procRoot, their paths relative to nsRoot. A process that is gone counts
// for nothing; when some were reported and none is placed, the tree is the
// wrong one (a hybrid host's v1 directory, a bad paths.cgroup) and every
// container goes unseen, which the error says.
func (r *Resolver) CheckPlaced(procRoot, nsRoot string, pids []int) error {
	tried := 0
	var first error
	for _, pid := range pids {
		p, err := hostcgroup.Of(procRoot, pid)
		if err != nil {
			continue
		}
		tried++
		_, err = r.ID(hostcgroup.HostPath(nsRoot, p))
		if err == nil {
			return nil
		}
		if first == nil {
			first = err
		}
	}
	if tried == 0 {
		return nil
	}
	return fmt.Errorf("none of %d GPU processes is in the cgroup v2 tree at %s: %w", tried, r.root, first)
}
