package controlblock

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// MappedFiles finds a file this process maps, by device and inode, and not one it
// does not.
func TestMappedFiles(t *testing.T) {
	dir := t.TempDir()
	mapped, other := filepath.Join(dir, "usage"), filepath.Join(dir, "other")
	for _, p := range []string{mapped, other} {
		if err := os.WriteFile(p, make([]byte, 4096), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.OpenFile(mapped, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	mem, err := syscall.Mmap(int(f.Fd()), 0, 4096, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(mem)
	fileOf := func(p string) FileID {
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil {
			t.Fatal(err)
		}
		return FileID{Dev: st.Dev, Ino: st.Ino}
	}
	want := map[FileID]bool{fileOf(mapped): true, fileOf(other): true}
	got, err := MappedFiles("/proc", os.Getpid(), want)
	if err != nil {
		t.Fatal(err)
	}
	if !got[fileOf(mapped)] || got[fileOf(other)] || len(got) != 1 {
		t.Errorf("MappedFiles = %v; want only %v", got, fileOf(mapped))
	}
	if _, err := MappedFiles("/proc", 1<<30, want); err == nil {
		t.Error("MappedFiles of no process gave no error")
	}
}
