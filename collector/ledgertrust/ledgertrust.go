// Package ledgertrust decides whether an interposer ledger speaks for the cgroup
// it names. A ledger is written by the container itself, so its claim is
// evidence to check, never truth. The collector and the enforcer both ask
// this package, so they cannot disagree about which ledger to trust.
package ledgertrust

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
)

// recheck is how long a verdict stands while the process that vouched
// stays in a slot; a process moved to another cgroup (which takes the
// node's privileges) is noticed within it. At 1,000 containers it costs
// about 50 file reads a second. Each directory's verdict stands a little
// more or less (recheckFor), so verdicts made together do not all fall due
// in one view.
const recheck = time.Minute

// recheckFor is dir's recheck: between 3/4 and 5/4 of it, fixed per
// directory.
func recheckFor(dir string) time.Duration {
	h := fnv.New32a()
	h.Write([]byte(dir))
	return recheck*3/4 + time.Duration(h.Sum32()%1024)*(recheck/2)/1024
}

// Resolver maps a cgroup id to its path (collector/cgroups.Resolver).
type Resolver interface {
	Path(id uint64) (string, bool)
}

// Assigned says whether the kubelet assigned a control directory to a pod
// whose cgroup is cgroupPath (the device plugin's directories); nil off
// Kubernetes.
type Assigned func(dir, cgroupPath string) bool

// Proc identifies a process across pid namespaces: its pid as its own
// namespace sees it (what the interposer writes in its slot) and its start
// time (clock ticks since boot).
type Proc struct {
	NSPid     int32
	StartTime uint64
}

// Verifier checks claims. It keeps each directory's verdict until the
// ledger's processes change or recheck passes, so a view of a thousand
// containers costs no thousand cgroup reads.
type Verifier struct {
	cgroups  Resolver
	cgroupFS string // the cgroup2 mount, for cgroup.procs
	procRoot string // /proc of the host's pid namespace

	mu      sync.Mutex
	cache   map[string]verdict // by directory
	refused map[string]refusal // by directory
}

type verdict struct {
	cgroup uint64
	by     Proc // the ledger's process found in the cgroup
	at     time.Time
}

// refusal is a claim refused, kept while the ledger claims the same with
// the same processes: a directory of junk is judged again after a wait that
// doubles each time (refusedFirst up to refusedMax), not on every read.
type refusal struct {
	claim claim
	err   error
	until time.Time
	wait  time.Duration
}

const refusedFirst, refusedMax = time.Second, 30 * time.Second

// claim is what a verdict depends on: the cgroup named and the processes
// of the slots.
type claim struct {
	cgroup uint64
	procs  uint64 // FNV-1a of the slots' (pid, start time)
}

func claimOf(u *controlblock.UsageSnapshot) claim {
	h := fnv.New64a()
	var b [12]byte
	for _, p := range u.Procs {
		binary.LittleEndian.PutUint32(b[:4], uint32(p.Pid))
		binary.LittleEndian.PutUint64(b[4:], p.StartTime)
		h.Write(b[:])
	}
	return claim{cgroup: u.CgroupID, procs: h.Sum64()}
}

// NewVerifier checks claims against cgroups under cgroupFS and processes
// under procRoot.
func NewVerifier(r Resolver, cgroupFS, procRoot string) *Verifier {
	return &Verifier{cgroups: r, cgroupFS: cgroupFS, procRoot: procRoot, cache: map[string]verdict{}, refused: map[string]refusal{}}
}

// Verify returns the cgroup path a ledger in directory dir speaks for, or
// why its claim is refused. The claim stands when
//   - the cgroup it names exists,
//   - dir is the directory derived from that cgroup's path, or one the
//     kubelet assigned to the pod that cgroup belongs to, and
//   - a live process of the ledger's slots (pid and start time) is in that
//     cgroup, so a container cannot name another's cgroup.
//
// A refusal stands, without a second look, while the ledger claims the same
// with the same processes, for a wait that grows each time it is refused
// again: a ledger that changes is judged again at once.
func (v *Verifier) Verify(dir string, u *controlblock.UsageSnapshot, assigned Assigned) (string, error) {
	c := claimOf(u)
	now := time.Now()
	v.mu.Lock()
	r, ok := v.refused[dir]
	v.mu.Unlock()
	if ok && r.claim == c && now.Before(r.until) {
		return "", r.err
	}
	path, err := v.verify(dir, u, assigned)
	v.mu.Lock()
	defer v.mu.Unlock()
	if err == nil {
		delete(v.refused, dir)
		return path, nil
	}
	wait := refusedFirst
	if ok && r.claim == c {
		wait = min(2*r.wait, refusedMax)
	}
	v.refused[dir] = refusal{claim: c, err: err, until: now.Add(wait), wait: wait}
	return "", err
}

func (v *Verifier) verify(dir string, u *controlblock.UsageSnapshot, assigned Assigned) (string, error) {
	if u.CgroupID == 0 {
		return "", errors.New("the ledger names no cgroup")
	}
	path, ok := v.cgroups.Path(u.CgroupID)
	if !ok {
		return "", fmt.Errorf("cgroup %d does not exist", u.CgroupID)
	}
	if controlblock.ContainerKey(path) != dir && (assigned == nil || !assigned(dir, path)) {
		return "", fmt.Errorf("directory %s belongs neither to cgroup %s nor to its pod", dir, path)
	}
	if v.cached(dir, u) {
		return path, nil
	}
	by, err := v.processIn(path, u.Procs)
	if err != nil {
		return "", fmt.Errorf("cgroup %s: %w", path, err)
	}
	v.mu.Lock()
	v.cache[dir] = verdict{cgroup: u.CgroupID, by: by, at: time.Now()}
	v.mu.Unlock()
	return path, nil
}

// cached says whether dir's last verdict still holds: same cgroup, the
// process that vouched still in a slot, and recent.
func (v *Verifier) cached(dir string, u *controlblock.UsageSnapshot) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	c, ok := v.cache[dir]
	if !ok || c.cgroup != u.CgroupID || time.Since(c.at) > recheckFor(dir) {
		delete(v.cache, dir)
		return false
	}
	return InSlots(c.by, u.Procs)
}

// Forget drops the verdicts of directories not in keep.
func (v *Verifier) Forget(keep map[string]bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for dir := range v.cache {
		if !keep[dir] {
			delete(v.cache, dir)
		}
	}
	for dir := range v.refused {
		if !keep[dir] {
			delete(v.refused, dir)
		}
	}
}

// processIn finds a process of the cgroup that one of the slots names.
func (v *Verifier) processIn(path string, slots []controlblock.ProcUsage) (Proc, error) {
	if len(slots) == 0 {
		return Proc{}, errors.New("no live process of the ledger vouches for it")
	}
	b, err := os.ReadFile(filepath.Join(v.cgroupFS, path, "cgroup.procs"))
	if err != nil {
		return Proc{}, fmt.Errorf("read its processes: %w", err)
	}
	for _, f := range strings.Fields(string(b)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			continue
		}
		p, err := Identify(v.procRoot, pid)
		if err == nil && InSlots(p, slots) {
			return p, nil
		}
	}
	return Proc{}, errors.New("none of the ledger's processes is in it")
}

// InSlots says whether a ledger's slots name the process.
func InSlots(p Proc, slots []controlblock.ProcUsage) bool {
	for _, s := range slots {
		if s.Pid == p.NSPid && s.StartTime == p.StartTime {
			return true
		}
	}
	return false
}

// Identify reads a host process's pid in its own namespace (the last of
// status's NSpid) and its start time.
func Identify(procRoot string, pid int) (Proc, error) {
	dir := filepath.Join(procRoot, strconv.Itoa(pid))
	start, err := controlblock.StartTime(procRoot, pid)
	if err != nil {
		return Proc{}, err
	}
	status, err := os.ReadFile(filepath.Join(dir, "status"))
	if err != nil {
		return Proc{}, fmt.Errorf("read status of pid %d: %w", pid, err)
	}
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "NSpid:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			break
		}
		ns, err := strconv.ParseInt(f[len(f)-1], 10, 32)
		if err != nil {
			return Proc{}, fmt.Errorf("status of pid %d: NSpid %q: %w", pid, rest, err)
		}
		return Proc{NSPid: int32(ns), StartTime: start}, nil
	}
	return Proc{NSPid: int32(pid), StartTime: start}, nil // a kernel without NSpid: one namespace
}
