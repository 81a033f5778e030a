package controlblock

import (
	"errors"
	"fmt"
	"hash/maphash"
	"os"
	"syscall"
	"unsafe"
)

// ledgerRule: a ledger is a regular file of the ABI's size, owned by the
// container's user (the interposer or the device plugin made it).
var ledgerRule = fileRule{size: int64(UsageSize)}

// ErrNotLaidOut says a ledger is empty and never held a ledger: the device
// plugin made it and no process of its container has run yet. It is not a
// fault; an empty ledger that held one (truncated) is ErrBadFile.
var ErrNotLaidOut = errors.New("ledger not laid out yet")

// Ledger is a container's usage file held open for repeated reads. Every
// read is one pread of UsageSize bytes into the caller's buffer, so a ledger
// that shrinks, grows or turns into something else never faults, blocks or
// grows the agent: it is an error for its container.
type Ledger struct {
	path     string
	fd       int
	dev, ino uint64
	laidOut  bool // this inode read as a ledger once

	// A thousand containers' ledgers are read every few seconds, and most
	// did nothing since: while a ledger's header (its container-wide
	// counters and claims) reads the same, the last snapshot stands, and its
	// process slots (32 of its 36 KiB) are read again only every slotsStale
	// reads. A process starting or leaving without touching a GPU changes
	// its slot alone; any allocation, launch or wait changes the header.
	last     *UsageSnapshot
	lastHead uint64 // the hash of the header last was read from
	reused   int    // reads answered from last since it was read whole
}

// headerSize is a ledger up to its process slots.
const headerSize = int(unsafe.Offsetof(Usage{}.Slots))

// slotsStale is how many reads in a row an unchanged header is answered
// from the last snapshot.
const slotsStale = 3

// headSeed keys the header hash: a container cannot craft a header that
// hashes like its last one without being equal to it.
var headSeed = maphash.MakeSeed()

// OpenLedger opens a container's ledger as hostile input (openControlFile).
func OpenLedger(path string) (*Ledger, error) {
	l := &Ledger{path: path, fd: -1}
	var st syscall.Stat_t
	if err := l.stat(&st); err != nil {
		return nil, err
	}
	if err := l.reopen(&st); err != nil {
		return nil, err
	}
	return l, nil
}

func (l *Ledger) stat(st *syscall.Stat_t) error {
	if err := syscall.Lstat(l.path, st); err != nil {
		return fmt.Errorf("open ledger: %w", &os.PathError{Op: "lstat", Path: l.path, Err: err})
	}
	if st.Dev != l.dev || st.Ino != l.ino { // another file: the device plugin's fresh one, or a swap
		l.Close()
		l.dev, l.ino, l.laidOut, l.last = st.Dev, st.Ino, false, nil
	}
	return nil
}

// reopen opens the file st describes, when it is not open.
func (l *Ledger) reopen(st *syscall.Stat_t) error {
	if err := ledgerRule.check(st); errors.Is(err, ErrEmpty) && !l.laidOut {
		return fmt.Errorf("open ledger %s: %w", l.path, ErrNotLaidOut)
	} else if err != nil {
		return fmt.Errorf("open ledger %s: %w", l.path, err)
	}
	if l.fd >= 0 {
		return nil
	}
	fd, err := openControlFile(l.path, syscall.O_RDONLY, ledgerRule)
	if err != nil {
		return fmt.Errorf("open ledger: %w", err)
	}
	var fst syscall.Stat_t
	if err := syscall.Fstat(fd, &fst); err != nil || fst.Dev != l.dev || fst.Ino != l.ino {
		syscall.Close(fd)
		return fmt.Errorf("open ledger %s: %w: replaced while opened", l.path, ErrBadFile)
	}
	l.fd = fd
	return nil
}

// Read validates the ledger as it is now, read into scratch (reused between
// reads: a ledger is 36 KiB, read for every container every few seconds). A
// ledger replaced since the last read (a new
// inode: the device plugin's fresh file, or a container's swap) is opened
// again under the same checks.
func (l *Ledger) Read(scratch *Usage) (*UsageSnapshot, error) {
	var st syscall.Stat_t
	if err := l.stat(&st); err != nil {
		return nil, err
	}
	if err := l.reopen(&st); err != nil {
		return nil, err
	}
	b := usageBytes(scratch)
	if err := l.pread(b[:headerSize], 0); err != nil {
		return nil, err
	}
	head := maphash.Bytes(headSeed, b[:headerSize])
	if l.last != nil && head == l.lastHead && l.reused < slotsStale {
		l.reused++
		return l.last, nil
	}
	if err := l.pread(b[headerSize:], int64(headerSize)); err != nil {
		return nil, err
	}
	s, err := parseUsage(scratch)
	if err != nil {
		return nil, fmt.Errorf("read ledger %s: %w", l.path, err)
	}
	l.laidOut = true
	l.last, l.lastHead, l.reused = s, head, 0
	return s, nil
}

// pread fills b from the ledger at off: a ledger shorter than the ABI's
// size is a bad file.
func (l *Ledger) pread(b []byte, off int64) error {
	n, err := syscall.Pread(l.fd, b, off)
	if err != nil {
		return fmt.Errorf("read ledger %s: %w", l.path, err)
	}
	if n != len(b) {
		return fmt.Errorf("read ledger %s: %w: %d bytes read at %d, want %d", l.path, ErrBadFile, n, off, len(b))
	}
	return nil
}

// Close closes the ledger; it may be read again (it reopens).
func (l *Ledger) Close() error {
	if l.fd < 0 {
		return nil
	}
	err := syscall.Close(l.fd)
	l.fd = -1
	return err
}

// ReadUsage reads a ledger once: open, read, close.
func ReadUsage(path string) (*UsageSnapshot, error) {
	l, err := OpenLedger(path)
	if err != nil {
		return nil, err
	}
	defer l.Close()
	return l.Read(new(Usage))
}
