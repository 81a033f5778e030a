package collector

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
)

// ledgerBytes is a ledger as the interposer lays it out, with no process.
func ledgerBytes() []byte {
	var u controlblock.Usage
	u.Magic, u.ABIMajor, u.Size = controlblock.UsageMagic, controlblock.ABIMajor, uint32(controlblock.UsageSize)
	u.MaxDevices, u.MaxSlots = controlblock.MaxDevices, controlblock.MaxSlots
	u.SlotSize = uint32(unsafe.Sizeof(controlblock.Slot{}))
	return append([]byte(nil), unsafe.Slice((*byte)(unsafe.Pointer(&u)), controlblock.UsageSize)...)
}

// TestViewNamesBadLedgers: a ledger the agent refuses is its container's
// fault, listed in the view (and not an error of the whole source); an
// empty one made for a container yet to start is not, until it held a
// ledger.
func TestViewNamesBadLedgers(t *testing.T) {
	dir := t.TempDir()
	plant := func(name string, mk func(usage string) error) string {
		t.Helper()
		if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := mk(controlblock.UsagePath(dir, name)); err != nil {
			t.Fatal(err)
		}
		return controlblock.UsagePath(dir, name)
	}
	plant("fifo", func(p string) error { return syscall.Mkfifo(p, 0o666) })
	plant("fresh", func(p string) error { return os.WriteFile(p, nil, 0o666) })
	good := plant("good", func(p string) error { return os.WriteFile(p, ledgerBytes(), 0o666) })

	c := New("node", "test", Sources{ControlDir: dir}, slog.New(slog.DiscardHandler))
	c.maxAge = 0
	view := func() map[string]bool {
		done := make(chan map[string]bool, 1)
		go func() {
			bad := map[string]bool{}
			for _, b := range c.View(context.Background()).BadLedgers {
				bad[b.Dir] = true
			}
			done <- bad
		}()
		select {
		case bad := <-done:
			return bad
		case <-time.After(10 * time.Second):
			t.Fatal("the view blocked on a ledger")
			return nil
		}
	}
	if bad := view(); !bad["fifo"] || bad["fresh"] || bad["good"] || len(bad) != 1 {
		t.Errorf("bad ledgers %v, want fifo alone", bad)
	}
	// The good ledger, truncated by its container, is now its fault.
	if err := os.Truncate(good, 0); err != nil {
		t.Fatal(err)
	}
	if bad := view(); !bad["good"] || bad["fresh"] {
		t.Errorf("bad ledgers %v, want the truncated one among them", bad)
	}
	// Gone with its directory.
	if err := os.RemoveAll(filepath.Join(dir, "fifo")); err != nil {
		t.Fatal(err)
	}
	if bad := view(); bad["fifo"] {
		t.Errorf("bad ledgers %v after the directory went", bad)
	}
}
