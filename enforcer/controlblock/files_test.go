package controlblock

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

// Offsets of device 0's counters, for edits of a valid ledger.
var (
	offReserved0 = int(unsafe.Offsetof(Usage{}.ReservedBytes))
	offIssued0   = int(unsafe.Offsetof(Usage{}.LaunchesIssued))
)

// hostile makes path the kind of file a container could leave as its ledger.
type hostile func(t testing.TB, path string)

var hostileLedgers = map[string]hostile{
	"symlink to /dev/zero": func(t testing.TB, p string) { must(t, os.Symlink("/dev/zero", p)) },
	"symlink to a valid ledger": func(t testing.TB, p string) {
		must(t, os.WriteFile(p+".real", validLedger(), 0o666))
		must(t, os.Symlink(p+".real", p))
	},
	"FIFO":          func(t testing.TB, p string) { must(t, syscall.Mkfifo(p, 0o666)) },
	"directory":     func(t testing.TB, p string) { must(t, os.Mkdir(p, 0o755)) },
	"empty file":    func(t testing.TB, p string) { must(t, os.WriteFile(p, nil, 0o666)) },
	"short file":    func(t testing.TB, p string) { must(t, os.WriteFile(p, validLedger()[:4096], 0o666)) },
	"huge file":     func(t testing.TB, p string) { writeSized(t, p, validLedger(), 1<<40) },
	"one byte more": func(t testing.TB, p string) { writeSized(t, p, validLedger(), int64(UsageSize)+1) },
	"unix socket": func(t testing.TB, p string) {
		fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
		must(t, err)
		t.Cleanup(func() { syscall.Close(fd) })
		must(t, syscall.Bind(fd, &syscall.SockaddrUnix{Name: p}))
	},
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// writeSized writes b and sets the file's size (sparse beyond b).
func writeSized(t testing.TB, p string, b []byte, size int64) {
	t.Helper()
	must(t, os.WriteFile(p, b, 0o666))
	must(t, os.Truncate(p, size))
}

// within fails the test when f does not return in time: a read that blocks
// on a FIFO is the bug, not a slow machine.
func within(t testing.TB, d time.Duration, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("blocked for %v", d)
	}
}

func TestReadUsageRefusesHostileFiles(t *testing.T) {
	for name, mk := range hostileLedgers {
		t.Run(name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "usage")
			mk(t, p)
			within(t, 10*time.Second, func() {
				if _, err := ReadUsage(p); err == nil {
					t.Error("ReadUsage accepted it")
				}
				if u, err := OpenUsage(p); err == nil {
					u.Close()
					t.Error("OpenUsage accepted it")
				}
			})
		})
	}
}

func TestReadUsageRefusesDeviceNode(t *testing.T) {
	simtest.RequirePrivileged(t, "mknod")
	p := filepath.Join(t.TempDir(), "usage")
	must(t, syscall.Mknod(p, syscall.S_IFCHR|0o666, 1<<8|5)) // 1:5, /dev/zero
	within(t, 10*time.Second, func() {
		if _, err := ReadUsage(p); !errors.Is(err, ErrBadFile) {
			t.Errorf("ReadUsage of a device node: %v, want ErrBadFile", err)
		}
	})
}

// openValidLedger writes a valid ledger and opens it.
func openValidLedger(t *testing.T) (string, *Ledger) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "usage")
	must(t, os.WriteFile(p, validLedger(), 0o666))
	l, err := OpenLedger(p)
	must(t, err)
	t.Cleanup(func() { l.Close() })
	return p, l
}

func TestLedgerReadsThroughChanges(t *testing.T) {
	p, l := openValidLedger(t)
	buf := new(Usage)
	if s, err := l.Read(buf); err != nil || s.ReservedBytes[0] != 3<<30 {
		t.Fatalf("read: %v %+v", err, s)
	}
	// Truncated while open: an error, and a read again once it is whole.
	must(t, os.Truncate(p, 100))
	if _, err := l.Read(buf); !errors.Is(err, ErrBadFile) {
		t.Errorf("truncated ledger: %v, want ErrBadFile", err)
	}
	must(t, os.WriteFile(p, validLedger(), 0o666))
	if _, err := l.Read(buf); err != nil {
		t.Errorf("restored ledger: %v", err)
	}
	// Emptied after it held a ledger: a fault, not a ledger to come.
	must(t, os.Truncate(p, 0))
	if _, err := l.Read(buf); !errors.Is(err, ErrBadFile) || errors.Is(err, ErrNotLaidOut) {
		t.Errorf("emptied ledger: %v, want ErrBadFile", err)
	}
	// A new empty file (the device plugin's) is a ledger to come.
	must(t, os.WriteFile(p+".new", nil, 0o666))
	must(t, os.Rename(p+".new", p))
	if _, err := l.Read(buf); !errors.Is(err, ErrNotLaidOut) {
		t.Errorf("fresh empty ledger: %v, want ErrNotLaidOut", err)
	}
	// Replaced by a new file: the new one is read.
	b := validLedger()
	b[offReserved0] = 1
	must(t, os.WriteFile(p+".new", b, 0o666))
	must(t, os.Rename(p+".new", p))
	if s, err := l.Read(buf); err != nil || s.ReservedBytes[0] != 3<<30|1 {
		t.Errorf("replaced ledger: %v, reserved %d", err, s.ReservedBytes[0])
	}
	// Replaced by a FIFO: refused without blocking.
	must(t, os.Remove(p))
	must(t, syscall.Mkfifo(p, 0o666))
	within(t, 10*time.Second, func() {
		if _, err := l.Read(buf); !errors.Is(err, ErrBadFile) {
			t.Errorf("FIFO: %v, want ErrBadFile", err)
		}
	})
}

// A ledger whose header reads the same is answered from its last read,
// slots included, for at most slotsStale reads; a changed header is read
// whole at once. While it reads the same it is the same snapshot.
func TestLedgerRereadsSlots(t *testing.T) {
	p, l := openValidLedger(t)
	buf := new(Usage)
	read := func() *UsageSnapshot {
		t.Helper()
		s, err := l.Read(buf)
		must(t, err)
		return s
	}
	first := read()
	for i := 0; i <= slotsStale; i++ { // the last one reads it whole
		if s := read(); s != first {
			t.Fatalf("read %d of an unchanged ledger made a new snapshot", i+2)
		}
	}
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	must(t, err)
	defer f.Close()
	slotPid := int64(unsafe.Offsetof(Usage{}.Slots)) + 3*int64(unsafe.Sizeof(Slot{})) + int64(unsafe.Offsetof(Slot{}.Pid))
	_, err = f.WriteAt([]byte{43}, slotPid) // slot 3's process is now 43
	must(t, err)
	reads := 0
	for s := read(); s.Procs[0].Pid != 43; s = read() {
		if s != first {
			t.Fatal("a snapshot that reads as before is a new one")
		}
		if reads++; reads > slotsStale {
			t.Fatalf("a slot's change was not read in %d reads", reads)
		}
	}
	if reads != slotsStale {
		t.Errorf("a slot's change was read after %d reads, want %d (an unchanged header is answered from the last read)", reads, slotsStale)
	}
	_, err = f.WriteAt([]byte{44}, slotPid)
	must(t, err)
	_, err = f.WriteAt([]byte{1}, int64(offReserved0))
	must(t, err)
	if s := read(); s.Procs[0].Pid != 44 || s.ReservedBytes[0] != 3<<30|1 {
		t.Errorf("after a header change: pid %d, reserved %d; want 44 and %d at once", s.Procs[0].Pid, s.ReservedBytes[0], uint64(3<<30|1))
	}
}

// TestLedgerHeaderCutUnderItsMapping: a ledger truncated between its stat
// and its read faults in the mapped header; the fault is the container's
// bad file, not the agent's death.
func TestLedgerHeaderCutUnderItsMapping(t *testing.T) {
	p, l := openValidLedger(t)
	buf := new(Usage)
	if _, err := l.Read(buf); err != nil {
		t.Fatal(err)
	}
	must(t, os.Truncate(p, 0))
	if err := l.pread(usageBytes(buf)[:usageHeader], 0); !errors.Is(err, ErrBadFile) {
		t.Errorf("header read of a truncated ledger: %v, want ErrBadFile", err)
	}
	if _, err := l.Read(buf); !errors.Is(err, ErrBadFile) {
		t.Errorf("read of a truncated ledger: %v, want ErrBadFile", err)
	}
}

// TestUsageFileSurvivesTruncation: a mapped ledger truncated under the
// agent reads as zero and says so, where it used to kill the agent with
// SIGBUS; laid out again, it reads again.
func TestUsageFileSurvivesTruncation(t *testing.T) {
	p := filepath.Join(t.TempDir(), "usage")
	b := validLedger()
	b[offIssued0] = 7
	must(t, os.WriteFile(p, b, 0o666))
	u, err := OpenUsage(p)
	must(t, err)
	defer u.Close()
	if u.Issued(0) != 7 || u.Reserved(0) != 3<<30 || u.ReservedAll()[0] != 3<<30 {
		t.Fatalf("issued %d reserved %d, all %v", u.Issued(0), u.Reserved(0), u.ReservedAll())
	}
	must(t, os.Truncate(p, 0))
	if u.Issued(0) != 0 || u.Reserved(0) != 0 || u.ReservedAll() != [MaxDevices]uint64{} {
		t.Error("a truncated ledger reads other than zero")
	}
	if _, err := u.Snapshot(); !errors.Is(err, ErrLedgerShrank) {
		t.Errorf("snapshot of a truncated ledger: %v", err)
	}
	must(t, os.WriteFile(p, b, 0o666))
	if s, err := u.Snapshot(); err != nil || u.Issued(0) != 7 || s.ReservedBytes[0] != 3<<30 {
		t.Errorf("ledger laid out again: %v, issued %d", err, u.Issued(0))
	}
}

// TestUsageFileSnapshotOfCutLedger: a ledger cut short after its header
// still reads its counters (the mapped header), but its snapshot, which
// needs the slots, says it shrank.
func TestUsageFileSnapshotOfCutLedger(t *testing.T) {
	p := filepath.Join(t.TempDir(), "usage")
	b := validLedger()
	b[offIssued0] = 7
	must(t, os.WriteFile(p, b, 0o666))
	u, err := OpenUsage(p)
	must(t, err)
	defer u.Close()
	must(t, os.Truncate(p, int64(usageHeader)+100))
	if _, err := u.Snapshot(); !errors.Is(err, ErrLedgerShrank) {
		t.Errorf("snapshot of a ledger cut after its header: %v", err)
	}
	if u.Issued(0) != 7 {
		t.Errorf("issued %d, want 7 from the header", u.Issued(0))
	}
}

// FuzzLedgerFile: whatever a container leaves as its ledger (kind, size,
// bytes), reading it returns, never panics, blocks or faults, and accepts
// only a regular file of the ABI's size.
func FuzzLedgerFile(f *testing.F) {
	f.Add(byte(0), int64(UsageSize), validLedger())
	f.Add(byte(0), int64(0), validLedger())
	f.Add(byte(0), int64(1)<<40, []byte("x"))
	f.Add(byte(1), int64(0), []byte(nil))
	f.Add(byte(2), int64(0), []byte(nil))
	f.Add(byte(3), int64(0), []byte(nil))
	f.Add(byte(4), int64(100), validLedger())
	f.Fuzz(func(t *testing.T, kind byte, size int64, b []byte) {
		p := filepath.Join(t.TempDir(), "usage")
		size = max(0, size%(1<<40))
		regular := false
		switch kind % 5 {
		case 0:
			writeSized(t, p, b, size)
			regular = true
		case 1:
			must(t, syscall.Mkfifo(p, 0o666))
		case 2:
			must(t, os.Symlink("/dev/zero", p))
		case 3:
			must(t, os.Mkdir(p, 0o755))
		case 4: // mapped whole, then truncated to size under the mapping
			must(t, os.WriteFile(p, validLedger(), 0o666))
			u, err := OpenUsage(p)
			must(t, err)
			defer u.Close()
			writeSized(t, p, b, size)
			within(t, 10*time.Second, func() {
				_, _ = u.Snapshot()
				_ = u.Issued(int(size % MaxDevices))
			})
			return
		}
		within(t, 10*time.Second, func() {
			_, err := ReadUsage(p)
			if err == nil && (!regular || size != int64(UsageSize)) {
				t.Fatalf("accepted kind %d of %d bytes", kind%5, size)
			}
		})
	})
}

// TestAdoptDir: a container's directory becomes the agent's, 0755; a
// symlink or a file in its place is refused and left alone.
func TestAdoptDir(t *testing.T) {
	simtest.RequirePrivileged(t, "chown")
	root := t.TempDir()
	dir := filepath.Join(root, "ctr")
	must(t, os.Mkdir(dir, 0o777))
	must(t, os.Chmod(dir, 0o777))
	must(t, os.Chown(dir, 65534, 65534))
	must(t, AdoptDir(dir))
	var st syscall.Stat_t
	must(t, syscall.Lstat(dir, &st))
	if int(st.Uid) != os.Geteuid() || st.Mode&0o7777 != 0o755 {
		t.Errorf("adopted: uid %d mode %#o, want uid %d mode 0755", st.Uid, st.Mode&0o7777, os.Geteuid())
	}

	elsewhere := filepath.Join(root, "elsewhere")
	must(t, os.Mkdir(elsewhere, 0o777))
	must(t, os.Chmod(elsewhere, 0o777))
	must(t, os.Symlink(elsewhere, filepath.Join(root, "link")))
	must(t, os.WriteFile(filepath.Join(root, "file"), nil, 0o644))
	for _, name := range []string{"link", "file"} {
		if err := AdoptDir(filepath.Join(root, name)); !errors.Is(err, ErrBadFile) {
			t.Errorf("AdoptDir(%s): %v, want ErrBadFile", name, err)
		}
	}
	must(t, syscall.Lstat(elsewhere, &st))
	if st.Mode&0o7777 != 0o777 {
		t.Errorf("the symlink's target was changed: mode %#o", st.Mode&0o7777)
	}
}

// TestAdoptLimitsReplacesForeignFiles: limits the agent did not write
// (another user's, a symlink, the wrong size) are never mapped: a new file
// from the agent's config replaces them.
func TestAdoptLimitsReplacesForeignFiles(t *testing.T) {
	simtest.RequirePrivileged(t, "chown")
	valid := func(p string) {
		lf, err := CreateLimits(p, LimitsConfig{NDev: 1})
		must(t, err)
		lf.Close()
	}
	for name, plant := range map[string]func(p string){
		"another user's":  func(p string) { valid(p); must(t, os.Chown(p, 65534, 65534)) },
		"writable by all": func(p string) { valid(p); must(t, os.Chmod(p, 0o666)) },
		"symlink": func(p string) {
			valid(p + ".real")
			must(t, os.Symlink(p+".real", p))
		},
		"short":      func(p string) { must(t, os.WriteFile(p, make([]byte, 100), 0o644)) },
		"not limits": func(p string) { must(t, os.WriteFile(p, make([]byte, LimitsSize), 0o644)) },
	} {
		t.Run(name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "ctr", "limits")
			must(t, os.MkdirAll(filepath.Dir(p), 0o755))
			plant(p)
			lf, err := AdoptLimits(p, LimitsConfig{NDev: 1, MemLimit: [MaxDevices]uint64{1 << 30}})
			must(t, err)
			defer lf.Close()
			if c := lf.Config(); c.MemLimit[0] != 1<<30 {
				t.Errorf("kept the planted file: limit %d", c.MemLimit[0])
			}
			var st syscall.Stat_t
			must(t, syscall.Lstat(p, &st))
			if st.Mode&syscall.S_IFMT != syscall.S_IFREG || int(st.Uid) != os.Geteuid() || st.Mode&0o777 != 0o644 {
				t.Errorf("limits now: mode %#o uid %d", st.Mode, st.Uid)
			}
		})
	}
	// The agent's own limits are kept as they are.
	p := filepath.Join(t.TempDir(), "ctr", "limits")
	lf, err := CreateLimits(p, LimitsConfig{NDev: 1, MemLimit: [MaxDevices]uint64{2 << 30}})
	must(t, err)
	lf.Close()
	lf, err = AdoptLimits(p, LimitsConfig{NDev: 1, MemLimit: [MaxDevices]uint64{1 << 30}})
	must(t, err)
	defer lf.Close()
	if c := lf.Config(); c.MemLimit[0] != 2<<30 {
		t.Errorf("the agent's own limits were replaced: limit %d", c.MemLimit[0])
	}
}

// TestPrepareControlDir: the control directory is the agent's, and sticky
// wherever others may write it, so no container can move another's
// directory (or its own, once adopted).
func TestPrepareControlDir(t *testing.T) {
	simtest.RequirePrivileged(t, "chown")
	root := t.TempDir()
	shared, private, fresh := filepath.Join(root, "shared"), filepath.Join(root, "private"), filepath.Join(root, "fresh")
	must(t, os.Mkdir(shared, 0o777))
	must(t, os.Chmod(shared, 0o777))
	must(t, os.Chown(shared, 65534, 65534))
	must(t, os.Mkdir(private, 0o755))
	for dir, want := range map[string]uint32{shared: 0o1777, private: 0o755, fresh: 0o1777} {
		must(t, PrepareControlDir(dir))
		var st syscall.Stat_t
		must(t, syscall.Lstat(dir, &st))
		if int(st.Uid) != os.Geteuid() || st.Mode&0o7777 != want {
			t.Errorf("%s: uid %d mode %#o, want uid %d mode %#o", filepath.Base(dir), st.Uid, st.Mode&0o7777, os.Geteuid(), want)
		}
	}
}

// RemoveDir unlinks links, never what they point to, and refuses a
// directory that is a symlink or holds files it was not told of.
func TestRemoveDir(t *testing.T) {
	control, outside := t.TempDir(), t.TempDir()
	target := filepath.Join(outside, "precious")
	must(t, os.WriteFile(target, []byte("keep"), 0o644))
	files := []string{"limits", "usage", "ld.so.preload"}

	links := filepath.Join(control, "links")
	must(t, os.Mkdir(links, 0o777))
	must(t, os.Symlink(target, filepath.Join(links, "limits")))
	must(t, os.Symlink(outside, filepath.Join(links, "usage")))
	must(t, os.WriteFile(filepath.Join(links, "ld.so.preload"), nil, 0o644))
	if err := RemoveDir(control, "links", files...); err != nil {
		t.Errorf("a directory of links: %v", err)
	}
	if _, err := os.Lstat(links); !os.IsNotExist(err) {
		t.Errorf("the directory is still there: %v", err)
	}

	dirLink := filepath.Join(control, "dirlink")
	must(t, os.Symlink(outside, dirLink))
	if err := RemoveDir(control, "dirlink", "precious"); err == nil {
		t.Error("a symlink to a directory was taken for the directory")
	}

	extra := filepath.Join(control, "extra")
	must(t, os.Mkdir(extra, 0o755))
	must(t, os.WriteFile(filepath.Join(extra, "usage"), nil, 0o666))
	must(t, os.WriteFile(filepath.Join(extra, "other"), nil, 0o666))
	if err := RemoveDir(control, "extra", files...); err == nil {
		t.Error("a directory with a file it was not told of was removed")
	}
	if _, err := os.Stat(filepath.Join(extra, "other")); err != nil {
		t.Errorf("a file it was not told of: %v", err)
	}

	for _, name := range []string{"..", ".", "a/b", ""} {
		if err := RemoveDir(control, name, files...); err == nil {
			t.Errorf("RemoveDir(%q) took it for a directory name", name)
		}
	}
	if b, err := os.ReadFile(target); err != nil || string(b) != "keep" {
		t.Errorf("the link's target: %q, %v", b, err)
	}
	if _, err := os.Stat(outside); err != nil {
		t.Errorf("the linked directory: %v", err)
	}
}
