package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpuwarden/gpuwarden/collector/kubelet"
	"github.com/gpuwarden/gpuwarden/deploy/allocation"
	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
)

// Sweeper removes the control directories nobody holds any more: those of
// allocations whose pods are gone and those the interposer made for
// cgroups that are gone, once allocation.Collector says so.
type Sweeper struct {
	ControlDir string
	ProcRoot   string // where /proc/<pid>/maps tell which processes use a directory
	// Listed returns the names (allocation.DirName) of the allocations
	// pod-resources lists; nil off Kubernetes.
	Listed func(context.Context) (map[string]bool, error)
	// Prepared returns the names (allocation.ClaimDirName) of the DRA
	// claims the driver has prepared; nil without the DRA driver.
	Prepared func() (map[string]bool, error)
	// CgroupKeys returns the key of every cgroup (controlblock.ContainerKey);
	// nil when the cgroup tree is unknown.
	CgroupKeys func() (map[string]bool, error)
	// Lock, when set, is held while directories are examined and removed:
	// the device plugin's DirLock, so a directory Allocate is writing is
	// seen changed, or made again after its removal, never half removed.
	Lock      sync.Locker
	Collector allocation.Collector
	// Release, when set, is called for each directory before it is
	// removed: the remote relay stops serving its socket and removes it.
	Release func(name string) error
}

// ListedDirs is a Sweeper's Listed from the kubelet's pod-resources API:
// the directory of every container's devices of our resources.
func ListedDirs(pr *kubelet.PodResources) func(context.Context) (map[string]bool, error) {
	return func(ctx context.Context) (map[string]bool, error) {
		as, err := pr.List(ctx, func(r string) bool {
			return r == allocation.ResourceGPU || r == allocation.ResourceMemory || r == allocation.ResourceRemote
		})
		if err != nil {
			return nil, err
		}
		out := make(map[string]bool, len(as))
		for _, a := range as {
			out[allocation.DirName(a.DeviceIDs)] = true
		}
		return out, nil
	}
}

// Sweep removes what is dead at now and returns the names removed. Sources
// that fail claim what they would have named, so a failure keeps
// directories, never removes them.
func (s *Sweeper) Sweep(ctx context.Context, now time.Time) ([]string, error) {
	var errs []error
	listed, kubeletKnown := map[string]bool{}, false
	if s.Listed != nil {
		l, err := s.Listed(ctx)
		if err == nil {
			listed, kubeletKnown = l, true
		}
		errs = append(errs, err)
	}
	keys, keysKnown := map[string]bool{}, false
	if s.CgroupKeys != nil {
		k, err := s.CgroupKeys()
		if err == nil {
			keys, keysKnown = k, true
		}
		errs = append(errs, err)
	}
	if s.Lock != nil {
		s.Lock.Lock()
		defer s.Lock.Unlock()
	}
	// Read under the lock: a claim being prepared is seen with its directory.
	prepared, preparedKnown := map[string]bool{}, s.Prepared == nil
	if s.Prepared != nil {
		p, err := s.Prepared()
		if err == nil {
			prepared, preparedKnown = p, true
		}
		errs = append(errs, err)
	}
	entries, err := os.ReadDir(s.ControlDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, errors.Join(errs...)
	}
	if err != nil {
		return nil, errors.Join(append(errs, fmt.Errorf("sweep control directory: %w", err))...)
	}
	dirs := make([]allocation.Dir, 0, len(entries))
	for _, e := range entries {
		if !e.IsDir() { // a symlink is no directory here: it is never followed
			continue
		}
		var st unix.Stat_t
		if unix.Lstat(filepath.Join(s.ControlDir, e.Name()), &st) != nil {
			continue
		}
		dirs = append(dirs, allocation.Dir{Name: e.Name(), Modified: time.Unix(st.Mtim.Unix()),
			Listed: listed[e.Name()], Prepared: prepared[e.Name()] || !preparedKnown, Cgroup: keys[e.Name()] || !keysKnown})
	}
	dead := s.Collector.Dead(now, dirs, kubeletKnown, func(names []string) map[string]bool {
		return mappedBy(s.ProcRoot, s.ControlDir, names)
	})
	var removed []string
	for _, name := range dead {
		if s.Release != nil {
			if err := s.Release(name); err != nil {
				errs = append(errs, err)
				continue
			}
		}
		if err := controlblock.RemoveDir(s.ControlDir, name, allocation.ControlFiles...); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, name)
	}
	return removed, errors.Join(errs...)
}

// mappedBy returns which of the directories' files a live process maps
// (controlblock.MappedFiles). A process that is not readable counts as
// using nothing; one that lists a directory's inode counts, whatever it
// says its ledger holds.
func mappedBy(procRoot, controlDir string, names []string) map[string]bool {
	owner := map[controlblock.FileID]string{}
	want := map[controlblock.FileID]bool{}
	for _, name := range names {
		for _, f := range allocation.ControlFiles {
			var st unix.Stat_t
			if unix.Lstat(filepath.Join(controlDir, name, f), &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFREG {
				id := controlblock.FileOf(&st)
				owner[id], want[id] = name, true
			}
		}
	}
	used := map[string]bool{}
	if len(owner) == 0 {
		return used
	}
	procs, _ := os.ReadDir(procRoot)
	for _, p := range procs {
		// The agent maps the files of every ledger it reads: its own
		// mappings say nothing of the container's.
		pid, err := strconv.Atoi(p.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		mapped, _ := controlblock.MappedFiles(procRoot, pid, want)
		for id := range mapped {
			used[owner[id]] = true
		}
	}
	return used
}
