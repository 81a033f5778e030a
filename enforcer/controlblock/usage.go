package controlblock

import (
	"bytes"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"unicode/utf8"
	"unsafe"

	"github.com/gpuwarden/gpuwarden/enforcer/vocab"
)

// MaxPlausibleBytes bounds any byte count read from a ledger: more than any
// device holds (256 TiB). A larger value is garbage.
const MaxPlausibleBytes = 1 << 48

// UsageSnapshot is a validated copy of a container's ledger. The ledger is
// written by the container's processes and is untrusted: a field that fails
// validation is dropped (zeroed, the slot skipped) and named in Problems.
type UsageSnapshot struct {
	ABIMinor          uint16
	NDev              int
	ReservedBytes     [MaxDevices]uint64
	LaunchesIssued    [MaxDevices]uint64
	AllocFailures     [MaxDevices]uint64
	ClaimMemLimit     [MaxDevices]uint64
	ClaimWeight       uint32
	ClaimComputeLimit uint32
	ClaimPriority     uint32
	ClaimMemorySet    bool
	CgroupID          uint64
	CgroupPath        string
	DevUUID           [MaxDevices][16]byte
	// Minor 1 (zero in older ledgers): launches whose device was known
	// and time launches waited, by device ordinal, container-wide.
	LaunchesDev    [MaxDevices]uint64
	ThrottledNsDev [MaxDevices]uint64
	// Minor 2 (zero in older ledgers): gated launches whose device the
	// interposer had wrong (a context made current behind its hooks).
	DevMismatches uint64
	Procs         []ProcUsage
	Problems      []string
}

// ProcUsage is one live process of the container.
type ProcUsage struct {
	Slot          int
	Pid           int32
	StartTime     uint64
	Bytes         [MaxDevices]uint64
	Launches      uint64
	ThrottledNs   uint64
	AllocFailures uint64
	// Minor 1 (zero in older ledgers): of Launches and ThrottledNs, what
	// is also counted in LaunchesDev and ThrottledNsDev.
	LaunchesPlaced    uint64
	ThrottledPlacedNs uint64
}

// PerDevice says the ledger counts launches and throttled time per device
// (minor 1 on).
func (s *UsageSnapshot) PerDevice() bool { return s.ABIMinor >= 1 }

// ErrNotLedger says the bytes are not a gpuwarden ledger of this ABI.
var ErrNotLedger = errors.New("not a gpuwarden ABI 1 ledger")

// ParseUsage validates a ledger's bytes. It never panics, whatever b holds.
func ParseUsage(b []byte) (*UsageSnapshot, error) {
	if len(b) < UsageSize {
		return nil, fmt.Errorf("%w: %d bytes, want %d", ErrNotLedger, len(b), UsageSize)
	}
	var u Usage
	copy(usageBytes(&u), b)
	return parseUsage(&u)
}

func usageBytes(u *Usage) []byte { return unsafe.Slice((*byte)(unsafe.Pointer(u)), UsageSize) }

// parseUsage validates a copy of a ledger.
func parseUsage(u *Usage) (*UsageSnapshot, error) {
	switch {
	case u.Magic != UsageMagic:
		return nil, fmt.Errorf("%w: bad magic %#x", ErrNotLedger, u.Magic)
	case u.ABIMajor != ABIMajor:
		return nil, fmt.Errorf("%w: ABI major %d", ErrNotLedger, u.ABIMajor)
	case u.Size != uint32(UsageSize) || u.MaxDevices != MaxDevices || u.MaxSlots != MaxSlots ||
		u.SlotSize != uint32(unsafe.Sizeof(Slot{})):
		return nil, fmt.Errorf("%w: layout %d/%d/%d/%d", ErrNotLedger, u.Size, u.MaxDevices, u.MaxSlots, u.SlotSize)
	}
	s := &UsageSnapshot{ABIMinor: u.ABIMinor, CgroupID: u.CgroupID, DevUUID: u.DevUUID}
	if s.PerDevice() {
		s.LaunchesDev, s.ThrottledNsDev = u.LaunchesDev, u.ThrottledNsDev
	}
	if s.ABIMinor >= 2 {
		s.DevMismatches = u.DevMismatches
	}
	bad := func(format string, a ...any) { s.Problems = append(s.Problems, fmt.Sprintf(format, a...)) }
	if u.NDev > MaxDevices {
		bad("ndev %d", u.NDev)
	} else {
		s.NDev = int(u.NDev)
	}
	for d := 0; d < MaxDevices; d++ {
		if v := u.ReservedBytes[d]; v > MaxPlausibleBytes {
			bad("device %d: reserved %d bytes", d, v)
		} else {
			s.ReservedBytes[d] = v
		}
		if v := u.ClaimMemLimit[d]; v > MaxPlausibleBytes {
			bad("device %d: claimed limit %d bytes", d, v)
		} else {
			s.ClaimMemLimit[d] = v
		}
		s.LaunchesIssued[d] = u.LaunchesIssued[d]
		s.AllocFailures[d] = u.AllocFailures[d]
	}
	if u.ClaimWeight > vocab.MaxWeight {
		bad("claimed weight %d", u.ClaimWeight)
	} else {
		s.ClaimWeight = u.ClaimWeight
	}
	if u.ClaimComputeLimit > 100 {
		bad("claimed compute limit %d", u.ClaimComputeLimit)
	} else {
		s.ClaimComputeLimit = u.ClaimComputeLimit
	}
	if u.ClaimPriority > PriorityHigh {
		bad("claimed priority %d", u.ClaimPriority)
	} else {
		s.ClaimPriority = u.ClaimPriority
	}
	s.ClaimMemorySet = u.ClaimFlags&ClaimMemorySet != 0
	if i := bytes.IndexByte(u.CgroupPath[:], 0); i < 0 || !utf8.Valid(u.CgroupPath[:i]) {
		bad("cgroup path not a NUL-terminated UTF-8 string")
	} else {
		s.CgroupPath = string(u.CgroupPath[:i])
	}
	for i := range u.Slots {
		sl := &u.Slots[i]
		switch sl.State {
		case SlotFree, SlotClaiming, SlotReaping:
			continue
		case SlotLive:
		default:
			bad("slot %d: state %d", i, sl.State)
			continue
		}
		if sl.Pid <= 0 {
			bad("slot %d: pid %d", i, sl.Pid)
			continue
		}
		p := ProcUsage{Slot: i, Pid: sl.Pid, StartTime: sl.StartTime, Launches: sl.Launches,
			ThrottledNs: sl.ThrottledNs, AllocFailures: sl.AllocFailures}
		if s.PerDevice() {
			p.LaunchesPlaced, p.ThrottledPlacedNs = sl.LaunchesPlaced, sl.ThrottledPlacedNs
		}
		ok := true
		for d, v := range sl.Bytes {
			if v > MaxPlausibleBytes {
				bad("slot %d: device %d: %d bytes", i, d, v)
				ok = false
				break
			}
			p.Bytes[d] = v
		}
		if ok {
			s.Procs = append(s.Procs, p)
		}
	}
	return s, nil
}

// UsageFile is a container's ledger as the scheduler reads it: its header
// (the counters, read every tick) mapped read-only, and the file kept open
// for Snapshot, which copies the whole ledger (the slots with pread: mapped,
// at 1,000 containers their pages would add 32 MiB to the agent's resident
// memory). The container can truncate the file under the mapping: every
// read of it is guarded, and a fault reads as zero (Snapshot:
// ErrLedgerShrank) instead of killing the agent with SIGBUS.
type UsageFile struct {
	ledgerFile
	cache snapshotCache
}

// ErrLedgerShrank says a ledger was truncated under the agent.
var ErrLedgerShrank = errors.New("ledger shrank under its mapping")

// usageHeader is the part of a ledger that is mapped: everything before the
// slots.
const usageHeader = int(unsafe.Offsetof(Usage{}.Slots))

// ledgerFile is an open ledger and its header mapped read-only: what both
// readers hold, the collector's Ledger and the scheduler's UsageFile.
type ledgerFile struct {
	fd  int
	mem []byte // nil: not open
}

// mapLedger maps the header of the ledger open as fd; on failure it closes
// fd.
func mapLedger(fd int, path string) (ledgerFile, error) {
	mem, err := syscall.Mmap(fd, 0, usageHeader, syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		syscall.Close(fd)
		return ledgerFile{fd: -1}, fmt.Errorf("map ledger %s: %w", path, err)
	}
	return ledgerFile{fd: fd, mem: mem}, nil
}

// copyAt fills b from the ledger at off: the header from the mapping, which
// costs no system call, the rest with pread. ErrLedgerShrank when the file
// is shorter than that (truncated); a read that fails is its error.
func (f ledgerFile) copyAt(b []byte, off int64) error {
	if off == 0 && len(b) <= len(f.mem) {
		return copyMapped(b, f.mem)
	}
	for n := 0; n < len(b); {
		m, err := syscall.Pread(f.fd, b[n:], off+int64(n))
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if m == 0 {
			return ErrLedgerShrank
		}
		n += m
	}
	return nil
}

// close unmaps and closes the ledger, if open.
func (f *ledgerFile) close() error {
	if f.mem == nil {
		return nil
	}
	err := errors.Join(syscall.Munmap(f.mem), syscall.Close(f.fd))
	f.mem, f.fd = nil, -1
	return err
}

// OpenUsage opens a ledger as hostile input (openControlFile) and maps its
// header read-only; its header is checked by Snapshot.
func OpenUsage(path string) (*UsageFile, error) {
	fd, err := openControlFile(path, syscall.O_RDONLY, ledgerRule)
	if err != nil {
		return nil, fmt.Errorf("open ledger: %w", err)
	}
	lf, err := mapLedger(fd, path)
	if err != nil {
		return nil, err
	}
	return &UsageFile{ledgerFile: lf}, nil
}

// scratches are buffers for Snapshot: the scheduler reads hundreds of
// ledgers a second, and a snapshot keeps nothing of its buffer.
var scratches = sync.Pool{New: func() any { return new(Usage) }}

// Snapshot copies and validates the ledger as it is now (snapshotCache).
func (f *UsageFile) Snapshot() (*UsageSnapshot, error) {
	u := scratches.Get().(*Usage)
	defer scratches.Put(u)
	return f.cache.read(u, f.readAt)
}

// readAt fills b from the ledger at off; ErrLedgerShrank when it is
// shorter than the ABI's size (truncated) or cannot be read.
func (f *UsageFile) readAt(b []byte, off int64) error {
	if f.copyAt(b, off) != nil {
		return ErrLedgerShrank
	}
	return nil
}

// Reserved reads device dev's container-wide reserved bytes (unvalidated).
func (f *UsageFile) Reserved(dev int) uint64 {
	return f.load(counter(unsafe.Offsetof(Usage{}.ReservedBytes), dev))
}

// ReservedAll reads every device's reserved bytes (unvalidated) under one
// fault guard; a ledger that shrank reads zero from where it ends.
func (f *UsageFile) ReservedAll() (out [MaxDevices]uint64) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer recoverFault()
	base := unsafe.Offsetof(Usage{}.ReservedBytes)
	for d := range out {
		out[d] = atomic.LoadUint64((*uint64)(unsafe.Pointer(&f.mem[base+8*uintptr(d)])))
	}
	return out
}

// Issued reads device dev's gate tickets taken (unvalidated), which the
// agent adds its budget to when it raises the grant.
func (f *UsageFile) Issued(dev int) uint64 {
	return f.load(counter(unsafe.Offsetof(Usage{}.LaunchesIssued), dev))
}

// counter is the offset of device dev's word of a per-device field.
func counter(field uintptr, dev int) uintptr {
	if uint(dev) >= MaxDevices {
		panic(fmt.Sprintf("controlblock: no device %d", dev))
	}
	return field + 8*uintptr(dev)
}

// load reads the word at off. The address is made here, from the slice
// (no access to the mapping before the guard is on: a field address would
// touch it in a nil check).
func (f *UsageFile) load(off uintptr) uint64 {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer recoverFault()
	return atomic.LoadUint64((*uint64)(unsafe.Pointer(&f.mem[off])))
}

// copyMapped copies mapped bytes into b under a fault guard: a ledger
// truncated under its mapping is ErrLedgerShrank (err keeps that value when
// recoverFault ends the copy's fault).
func copyMapped(b, mem []byte) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	err = ErrLedgerShrank
	defer recoverFault()
	copy(b, mem)
	return nil
}

// recoverFault ends a memory fault (the panic SetPanicOnFault makes of
// it), leaving the reader's results zero; any other panic goes on.
func recoverFault() {
	if r := recover(); r != nil {
		if _, fault := r.(interface{ Addr() uintptr }); !fault {
			panic(r)
		}
	}
}

// Close unmaps and closes the ledger.
func (f *UsageFile) Close() error { return f.close() }

// Mark reads device dev's latest completion mark (minor 3; none in older
// ledgers) if it speaks for every ticket up to ticket: done is when the
// work launched before it was seen run, 0 while pending; ok is false when
// there is no such mark. Unvalidated beyond order (a mark done before it
// was recorded is none): the caller bounds done by its own clock.
func (f *UsageFile) Mark(dev int, ticket uint64) (done uint64, ok bool) {
	recAt := counter(unsafe.Offsetof(Usage{}.MarkRecNs), dev)
	rec := f.load(recAt)
	done = f.load(counter(unsafe.Offsetof(Usage{}.MarkDoneNs), dev))
	t := f.load(counter(unsafe.Offsetof(Usage{}.MarkTicket), dev))
	if rec == 0 || t < ticket || (done != 0 && done < rec) {
		return 0, false
	}
	if f.load(recAt) != rec { // a new mark, recorded between the loads: pending
		return 0, true
	}
	return done, true
}
