package controlblock

import (
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"
)

// LimitsConfig is the part of the limits file the agent sets as a whole,
// under the seqlock.
type LimitsConfig struct {
	MemLimit       [MaxDevices]uint64 // bytes per device ordinal; 0 = no limit
	GateMask       uint32             // bit d: launches on device d wait for grants
	ContextReserve uint64             // bytes per context; 0 = DefaultContextReserve
	GraceNs        uint64             // silent agent lifts the gate after this; 0 = DefaultGraceNs
	NDev           uint32
}

// MemoryLimits is the memory quota a container is held to, per CUDA
// ordinal (0: none): its limits file's when it has one (limits; the agent
// or the device plugin made it), else what its environment claims in its
// ledger. ok is false when neither sets one.
func MemoryLimits(limits *LimitsConfig, u *UsageSnapshot) (quota [MaxDevices]uint64, ok bool) {
	switch {
	case limits != nil:
		return limits.MemLimit, true
	case u != nil && u.ClaimMemorySet:
		return u.ClaimMemLimit, true
	}
	return quota, false
}

// LimitsFile is the agent's read-write mapping of one container's limits.
// One writer per file: the agent.
type LimitsFile struct {
	path string
	mem  []byte
	l    *Limits
	mu   sync.Mutex
}

// limitsRule: limits are the agent's alone (it maps them read-write): a
// file of another owner, linked elsewhere or writable by others is not one
// the agent wrote, and is never mapped.
var limitsRule = fileRule{size: int64(LimitsSize), agentOwned: true}

// ErrNotLimits says a file is not gpuwarden limits of this ABI.
var ErrNotLimits = errors.New("not gpuwarden ABI 1 limits")

// CreateLimits writes a new limits file and maps it. It adopts the
// directory first (AdoptDir), then writes the file aside (mode 0644,
// no link followed) and renames it into place, so the interposer never maps
// a half-written one. Later changes go through Update, in place.
func CreateLimits(path string, cfg LimitsConfig) (*LimitsFile, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return nil, fmt.Errorf("create limits: %w", err)
	}
	if err := AdoptDir(dir); err != nil {
		return nil, fmt.Errorf("create limits: %w", err)
	}
	var l Limits
	l.Magic, l.ABIMajor, l.ABIMinor, l.Size = LimitsMagic, ABIMajor, ABIMinor, uint32(LimitsSize)
	l.Generation = 1
	l.MemLimit, l.GateMask, l.ContextReserve, l.GraceNs, l.NDev = cfg.MemLimit, cfg.GateMask, cfg.ContextReserve, cfg.GraceNs, cfg.NDev
	l.HeartbeatNs = MonotonicNs()
	if err := replaceInDir(dir, filepath.Base(path), unsafe.Slice((*byte)(unsafe.Pointer(&l)), LimitsSize), 0o644); err != nil {
		return nil, fmt.Errorf("create limits: %w", err)
	}
	return OpenLimits(path)
}

// AdoptLimits puts a container's limits under the agent: it adopts the
// directory (AdoptDir) and maps the limits there, replacing, with a new
// file made from cfg, a missing file or one the agent did not write (a
// container's own, or garbage).
func AdoptLimits(path string, cfg LimitsConfig) (*LimitsFile, error) {
	if err := AdoptDir(filepath.Dir(path)); err != nil {
		return nil, fmt.Errorf("adopt limits: %w", err)
	}
	lf, err := OpenLimits(path)
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, ErrBadFile) || errors.Is(err, ErrNotLimits) {
		return CreateLimits(path, cfg)
	}
	return lf, err
}

// replaceInDir writes b to a new file in dir and renames it over name. The
// directory is opened once without following a link, and both steps are
// made relative to it.
func replaceInDir(dir, name string, b []byte, mode uint32) error {
	dfd, err := syscall.Open(dir, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer syscall.Close(dfd)
	var rnd [8]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return err
	}
	tmp := fmt.Sprintf(".%s-%x", name, rnd)
	fd, err := syscall.Openat(dfd, tmp, syscall.O_WRONLY|syscall.O_CREAT|syscall.O_EXCL|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, mode)
	if err != nil {
		return &os.PathError{Op: "create", Path: filepath.Join(dir, tmp), Err: err}
	}
	f := os.NewFile(uintptr(fd), filepath.Join(dir, tmp))
	_, werr := f.Write(b)
	if werr == nil {
		werr = f.Chmod(os.FileMode(mode)) // not the umask's mode
	}
	if err := f.Close(); werr == nil {
		werr = err
	}
	if werr == nil {
		werr = syscall.Renameat(dfd, tmp, dfd, name)
	}
	if werr != nil {
		_ = syscall.Unlinkat(dfd, tmp)
		return fmt.Errorf("write %s: %w", filepath.Join(dir, name), werr)
	}
	return nil
}

// OpenLimits maps an existing limits file read-write, opened as a control
// file the agent wrote (openControlFile), and checks its header.
func OpenLimits(path string) (*LimitsFile, error) {
	fd, err := openControlFile(path, syscall.O_RDWR, limitsRule)
	if err != nil {
		return nil, fmt.Errorf("open limits: %w", err)
	}
	defer syscall.Close(fd)
	mem, err := syscall.Mmap(fd, 0, LimitsSize, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map limits %s: %w", path, err)
	}
	l := (*Limits)(unsafe.Pointer(&mem[0]))
	if l.Magic != LimitsMagic || l.ABIMajor != ABIMajor || l.Size < uint32(LimitsSize) {
		syscall.Munmap(mem)
		return nil, fmt.Errorf("limits %s: %w", path, ErrNotLimits)
	}
	return &LimitsFile{path: path, mem: mem, l: l}, nil
}

// Close unmaps the file.
func (f *LimitsFile) Close() error {
	if f.mem == nil {
		return nil
	}
	err := syscall.Munmap(f.mem)
	f.mem, f.l = nil, nil
	return err
}

// Config returns the current config.
func (f *LimitsFile) Config() LimitsConfig {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.configLocked()
}

func (f *LimitsFile) configLocked() LimitsConfig {
	var c LimitsConfig
	for d := range c.MemLimit {
		c.MemLimit[d] = atomic.LoadUint64(&f.l.MemLimit[d])
	}
	c.GateMask = atomic.LoadUint32(&f.l.GateMask)
	c.ContextReserve = atomic.LoadUint64(&f.l.ContextReserve)
	c.GraceNs = atomic.LoadUint64(&f.l.GraceNs)
	c.NDev = atomic.LoadUint32(&f.l.NDev)
	return c
}

// Update changes the config under the seqlock and raises the generation; the
// interposer applies it on its next managed call. It returns the new generation.
func (f *LimitsFile) Update(change func(*LimitsConfig)) uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.configLocked()
	change(&c)
	atomic.AddUint64(&f.l.Seq, 1) // odd: readers retry
	for d := range c.MemLimit {
		atomic.StoreUint64(&f.l.MemLimit[d], c.MemLimit[d])
	}
	atomic.StoreUint32(&f.l.GateMask, c.GateMask)
	atomic.StoreUint64(&f.l.ContextReserve, c.ContextReserve)
	atomic.StoreUint64(&f.l.GraceNs, c.GraceNs)
	atomic.StoreUint32(&f.l.NDev, c.NDev)
	gen := atomic.AddUint64(&f.l.Generation, 1)
	atomic.AddUint64(&f.l.Seq, 1) // even: consistent again
	f.wakeAll()
	return gen
}

// Generation is the config number the agent last wrote.
func (f *LimitsFile) Generation() uint64 { return atomic.LoadUint64(&f.l.Generation) }

// Grant returns device dev's grant.
func (f *LimitsFile) Grant(dev int) uint64 { return atomic.LoadUint64(&f.l.Gate[dev].Grant) }

// RaiseGrant lets launches with tickets up to grant run on device dev (it
// never lowers the grant: CloseGrant does) and wakes the launches waiting
// for it.
func (f *LimitsFile) RaiseGrant(dev int, grant uint64) error {
	if dev < 0 || dev >= MaxDevices {
		return errors.New("raise grant: no such device")
	}
	g := &f.l.Gate[dev]
	for {
		cur := atomic.LoadUint64(&g.Grant)
		if grant <= cur || atomic.CompareAndSwapUint64(&g.Grant, cur, grant) {
			break
		}
	}
	atomic.AddUint32(&g.Wake, 1)
	return futexWake(&g.Wake)
}

// CloseGrant takes back device dev's grant beyond the tickets taken so far
// (issued): launches from the next ticket on wait, so released work left
// unused at the end of a time slice cannot run in another container's. It
// never raises the grant: launches already waiting keep waiting. It then
// counts the close, at which tickets a thread took ahead of its launches
// lapse (they are among issued, but their launches had not begun).
func (f *LimitsFile) CloseGrant(dev int, issued uint64) error {
	if dev < 0 || dev >= MaxDevices {
		return errors.New("close grant: no such device")
	}
	g := &f.l.Gate[dev]
	for {
		cur := atomic.LoadUint64(&g.Grant)
		if issued >= cur || atomic.CompareAndSwapUint64(&g.Grant, cur, issued) {
			break
		}
	}
	atomic.AddUint64(&g.Closes, 1)
	return nil
}

// Heartbeat tells the interposers the agent is alive; a gate whose agent is
// silent longer than GraceNs lets launches through.
func (f *LimitsFile) Heartbeat() { atomic.StoreUint64(&f.l.HeartbeatNs, MonotonicNs()) }

// HeartbeatAt is Heartbeat at a time read once for many files (MonotonicNs).
func (f *LimitsFile) HeartbeatAt(ns uint64) { atomic.StoreUint64(&f.l.HeartbeatNs, ns) }

func (f *LimitsFile) wakeAll() {
	for d := range f.l.Gate {
		atomic.AddUint32(&f.l.Gate[d].Wake, 1)
		_ = futexWake(&f.l.Gate[d].Wake)
	}
}

// futexWake wakes every waiter on a futex word in a shared mapping.
func futexWake(word *uint32) error {
	const futexWakeOp = 1 // FUTEX_WAKE, not private: the word is in a shared file mapping
	_, _, e := syscall.Syscall6(syscall.SYS_FUTEX, uintptr(unsafe.Pointer(word)), futexWakeOp, 1<<30, 0, 0, 0)
	if e != 0 {
		return fmt.Errorf("futex wake: %w", e)
	}
	return nil
}

// MonotonicNs is CLOCK_MONOTONIC in nanoseconds, the clock of HeartbeatNs.
func MonotonicNs() uint64 {
	var ts syscall.Timespec
	const clockMonotonic = 1
	syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockMonotonic, uintptr(unsafe.Pointer(&ts)), 0)
	return uint64(ts.Sec)*1e9 + uint64(ts.Nsec)
}
