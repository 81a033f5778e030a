package controlblock

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// ledgerRule: a ledger is a regular file of the ABI's size, owned by the
// container's user (the interposer or the device plugin made it).
var ledgerRule = fileRule{size: int64(UsageSize)}

// ErrNotLaidOut says a ledger is empty and never held a ledger: the device
// plugin made it and no process of its container has run yet. It is not a
// fault; an empty ledger that held one (truncated) is ErrBadFile.
var ErrNotLaidOut = errors.New("ledger not laid out yet")

// Ledger is a container's usage file held open for repeated reads. Every
// read copies into the caller's buffer: the header from a read-only
// mapping under a fault guard, then the slots with pread unless
// snapshotCache answers. So a ledger that shrinks, grows or turns into
// something else never kills, blocks or grows the agent: it is an error
// for its container.
type Ledger struct {
	path string
	ledgerFile
	dev, ino uint64
	laidOut  bool // this inode read as a ledger once
	cache    snapshotCache
}

// OpenLedger opens a container's ledger as hostile input (openControlFile).
func OpenLedger(path string) (*Ledger, error) {
	l := &Ledger{path: path, ledgerFile: ledgerFile{fd: -1}}
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
		l.dev, l.ino, l.laidOut, l.cache = st.Dev, st.Ino, false, snapshotCache{}
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
	if l.mem != nil {
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
	lf, err := mapLedger(fd, l.path)
	if err != nil {
		return err
	}
	l.ledgerFile = lf
	return nil
}

// Read validates the ledger as it is now, read into scratch (reused between
// reads: a ledger is 36 KiB, read for every container every few seconds). A
// ledger replaced since the last read (a new inode: the device plugin's
// fresh file, or a container's swap) is opened again under the same checks.
func (l *Ledger) Read(scratch *Usage) (*UsageSnapshot, error) {
	var st syscall.Stat_t
	if err := l.stat(&st); err != nil {
		return nil, err
	}
	if err := l.reopen(&st); err != nil {
		return nil, err
	}
	s, err := l.cache.read(scratch, l.pread)
	if err != nil {
		return nil, fmt.Errorf("read ledger %s: %w", l.path, err)
	}
	l.laidOut = true
	return s, nil
}

// pread fills b from the ledger at off: a ledger shorter than the ABI's
// size is a bad file.
func (l *Ledger) pread(b []byte, off int64) error {
	err := l.copyAt(b, off)
	if errors.Is(err, ErrLedgerShrank) {
		return fmt.Errorf("%w: shorter than the ABI's size", ErrBadFile)
	}
	return err
}

// Close closes the ledger; it may be read again (it reopens).
func (l *Ledger) Close() error { return l.close() }

// File is the file last read, as a process that maps the ledger shows it
// in its /proc/PID/maps.
func (l *Ledger) File() FileID { return FileID{Dev: l.dev, Ino: l.ino} }

// ReadUsage reads a ledger once: open, read, close.
func ReadUsage(path string) (*UsageSnapshot, error) {
	l, err := OpenLedger(path)
	if err != nil {
		return nil, err
	}
	defer l.Close()
	return l.Read(new(Usage))
}
