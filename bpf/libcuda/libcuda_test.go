package libcuda

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

func TestParseLdconfig(t *testing.T) {
	out := `612 libs found in cache ` + "`/etc/ld.so.cache'" + `
	libcudart.so.12 (libc6,x86-64) => /usr/local/cuda/lib64/libcudart.so.12
	libcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1
	libcuda.so.1 (libc6) => /usr/lib/i386-linux-gnu/libcuda.so.1
	libcuda.so (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so
`
	got := ParseLdconfig(strings.NewReader(out), "libcuda.so.1")
	want := []string{"/usr/lib/x86_64-linux-gnu/libcuda.so.1"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ParseLdconfig = %v, want %v", got, want)
	}
}

func TestParseMaps(t *testing.T) {
	maps := `55d4c0a00000-55d4c0a02000 r--p 00000000 fe:00 131 /usr/bin/python3
7f1200000000-7f1200100000 r--p 00000000 fe:00 4242 /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
7f1200100000-7f1200900000 r-xp 00100000 fe:00 4242 /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
7f1300000000-7f1300010000 r-xp 00000000 fe:00 77 /tmp/my dir/libcuda.so.1 (deleted)
7f1400000000-7f1400010000 r-xp 00000000 fe:00 78 /opt/libcudart.so.12
7f1500000000-7f1500010000 rw-p 00000000 00:00 0 
`
	got := ParseMaps([]byte(maps))
	want := []MapsEntry{
		{Range: "7f1200000000-7f1200100000", Path: "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"},
		{Range: "7f1300000000-7f1300010000", Path: "/tmp/my dir/libcuda.so.1 (deleted)"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ParseMaps = %+v, want %+v", got, want)
	}
	if ParseMaps([]byte("7f-80 r-xp 0 0:0 1 /lib/libc.so.6\n")) != nil {
		t.Error("a maps file without libcuda gave entries")
	}
}

func TestIsLibcuda(t *testing.T) {
	for path, want := range map[string]bool{
		"/usr/lib/libcuda.so":            true,
		"/usr/lib/libcuda.so.1":          true,
		"/usr/lib/libcuda.so.550.54.15":  true,
		"/x/libcuda.so.1 (deleted)":      true,
		"/usr/lib/libcudart.so.12":       false,
		"/usr/lib/libcuda.so.1.bak/file": false,
		"/usr/lib/libcudadebugger.so.1":  false,
	} {
		if got := IsLibcuda(path); got != want {
			t.Errorf("IsLibcuda(%q) = %v, want %v", path, got, want)
		}
	}
}

// fakeProcess lays out proc/<pid> for a process that maps path (a file
// under its root/ with that inode number in maps) and returns the file.
func fakeProcess(t *testing.T, proc, pid, path string, inode int) string {
	t.Helper()
	lib := filepath.Join(proc, pid, "root", path)
	if err := os.MkdirAll(filepath.Dir(lib), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(lib, []byte("ELF"), 0o644); err != nil {
		t.Fatal(err)
	}
	maps := fmt.Sprintf("7f00-7f10 r-xp 00000000 fe:00 %d %s\n", inode, path)
	if err := os.WriteFile(filepath.Join(proc, pid, "maps"), []byte(maps), 0o644); err != nil {
		t.Fatal(err)
	}
	return lib
}

// Scan over a fake proc root: the maps file names the library, and the
// root/ path leads to it (map_files is absent in the fixture).
func TestScanFixture(t *testing.T) {
	proc := t.TempDir()
	lib := fakeProcess(t, proc, "42", "/opt/libcuda.so.1", 9)
	// The scanning process (proc/self) is left out, whatever it maps.
	fakeProcess(t, proc, "43", "/opt/libcuda.so.2", 10)
	if err := os.Symlink("43", filepath.Join(proc, "self")); err != nil {
		t.Fatal(err)
	}
	found, err := Scan(proc)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := Identify(lib)
	m, ok := found[id]
	if len(found) != 1 || !ok || m.PID != 42 || m.OpenPath != lib || m.Path != "/opt/libcuda.so.1" {
		t.Errorf("Scan = %+v, want one mapping of %s by pid 42", found, lib)
	}
}

// A renamed copy of the driver, loaded by a real process, is found by what
// it exports; the interposer, which exports the same entry points to hook
// them, is not taken for a driver.
func TestScanFindsRenamedDriver(t *testing.T) {
	copyPath := filepath.Join(t.TempDir(), "libtotally-not-cuda.so")
	b, err := os.ReadFile(simtest.Bin(t, "simgpu/libcuda.so.1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(copyPath, b, 0o755); err != nil {
		t.Fatal(err)
	}
	m := simtest.NewMachine(t, 1, "1Gi")
	start := func(preload string) int {
		cmd := m.Command("sleep", "30")
		cmd.Env = append(cmd.Env, "LD_PRELOAD="+preload)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd.Process.Pid
	}
	renamed := start(copyPath)
	start(simtest.Bin(t, "libgpuwarden.so"))
	time.Sleep(200 * time.Millisecond) // the dynamic linker maps the preloads
	interposer, err := Identify(simtest.Bin(t, "libgpuwarden.so"))
	if err != nil {
		t.Fatal(err)
	}

	s := NewScanner("/proc")
	for round := 0; round < 2; round++ { // the second scan answers from what the first learnt
		found, err := s.Scan()
		if err != nil {
			t.Fatal(err)
		}
		id, _ := Identify(copyPath)
		if got, ok := found[id]; !ok || got.PID != renamed || got.Path != copyPath {
			t.Errorf("scan %d: the renamed driver was not found: %+v", round, got)
		}
		// Other processes of the machine may map other libraries: only
		// this interposer's file is looked for.
		if mp, ok := found[interposer]; ok {
			t.Errorf("scan %d: the interposer was taken for a driver: %+v", round, mp)
		}
	}
}

func TestExportsDriver(t *testing.T) {
	for path, want := range map[string]bool{
		simtest.Bin(t, "simgpu/libcuda.so.1"):      true,
		simtest.Bin(t, "libgpuwarden.so"):          false,
		simtest.Bin(t, "remote/libcuda.so.1"):      false, // the remote client: no GPU behind it
		simtest.Bin(t, "simgpu/libnvidia-ml.so.1"): false,
		filepath.Join(t.TempDir(), "absent.so"):    false,
	} {
		if got := ExportsDriver(path); got != want {
			t.Errorf("ExportsDriver(%s) = %v, want %v", path, got, want)
		}
	}
}

// writeStatm gives a fake process a statm file with this virtual size.
func writeStatm(t *testing.T, proc, pid string, pages uint64) {
	t.Helper()
	line := fmt.Sprintf("%d 300 200 10 0 150 0\n", pages)
	if err := os.WriteFile(filepath.Join(proc, pid, "statm"), []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
}

// A process whose virtual size is unchanged is not read again, except
// once every recheckEvery scans; one whose size changed is.
func TestScanRereadsChangedProcesses(t *testing.T) {
	proc := t.TempDir()
	first := fakeProcess(t, proc, "42", "/opt/libcuda.so.1", 9)
	writeStatm(t, proc, "42", 256)
	s := NewScanner(proc)
	has := func(lib string) bool { return scanFinds(t, s, lib) }
	if !has(first) {
		t.Fatal("first scan: the library was not found")
	}
	// The process now maps another copy, its size unchanged: the scan
	// answers from what it read before.
	second := fakeProcess(t, proc, "42", "/opt/other/libcuda.so.1", 11)
	if !has(first) || has(second) {
		t.Fatal("an unchanged process was read again")
	}
	writeStatm(t, proc, "42", 512) // it grew: read again
	if !has(second) {
		t.Fatal("a process whose size changed was not read again")
	}
	third := fakeProcess(t, proc, "42", "/opt/third/libcuda.so.1", 12)
	seen := false
	scans := 0
	for ; scans < recheckEvery && !seen; scans++ {
		seen = has(third)
	}
	if !seen || scans < 2 {
		t.Fatalf("the mapping was seen after %d scans, want 2 to %d", scans, recheckEvery)
	}
}

// With Changes, a known process is read again only when named (whatever
// its size says), or on its turn at a listing; a new one at once when named, else at the
// next listing of /proc; all reads every process's size as without Changes.
func TestScanAsksChanges(t *testing.T) {
	proc := t.TempDir()
	first := fakeProcess(t, proc, "42", "/opt/libcuda.so.1", 9)
	writeStatm(t, proc, "42", 256)
	s := NewScanner(proc)
	var named map[int]bool
	all := false
	s.SetChanges(func() (map[int]bool, bool, error) { return named, all, nil })
	has := func(lib string) bool { return scanFinds(t, s, lib) }
	if !has(first) {
		t.Fatal("a new process was not read")
	}
	// Another copy and another size, but not named: answered from before.
	second := fakeProcess(t, proc, "42", "/opt/other/libcuda.so.1", 11)
	writeStatm(t, proc, "42", 512)
	if !has(first) || has(second) {
		t.Fatal("a process the changes do not name was read again")
	}
	// Named, its size unchanged (an mprotect): read again.
	named = map[int]bool{42: true}
	if !has(second) {
		t.Fatal("a process the changes name was not read again")
	}
	named = nil
	third := fakeProcess(t, proc, "42", "/opt/third/libcuda.so.1", 12)
	writeStatm(t, proc, "42", 1024)
	all = true // the changes cannot tell: its size decides
	if !has(third) {
		t.Fatal("with all, a process whose size changed was not read again")
	}
	all = false
	fourth := fakeProcess(t, proc, "42", "/opt/fourth/libcuda.so.1", 13)
	scans := 0
	for seen := false; !seen; scans++ {
		if scans > listEvery*recheckListings {
			t.Fatalf("not read on its turn in %d scans", scans)
		}
		seen = has(fourth)
	}
	if scans < 2 {
		t.Fatal("a process not named was read at once")
	}
	// A new process is read at once when named (its exec maps libraries).
	fifth := fakeProcess(t, proc, "43", "/opt/fifth/libcuda.so.1", 14)
	named = map[int]bool{43: true}
	if !has(fifth) {
		t.Fatal("a new process the changes name was not read")
	}
	named = nil
	// One they do not name (a forked child) is found by the next listing.
	sixth := fakeProcess(t, proc, "44", "/opt/sixth/libcuda.so.1", 15)
	scans = 0
	for seen := false; !seen; scans++ {
		if scans > listEvery {
			t.Fatalf("a new process the changes do not name was not read in %d scans", scans)
		}
		seen = has(sixth)
	}
}

// The statm file the scanner keeps open stops reading once its process is
// gone: a pid used again is a new process, read anew.
func TestReadSizeOfDeadProcess(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/statm", cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, ok := readSize(f); !ok {
		t.Fatal("cannot read a live process's statm")
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if v, ok := readSize(f); ok {
		t.Errorf("a dead process's statm still reads (size %d)", v)
	}
}

func TestReadSize(t *testing.T) {
	proc := t.TempDir()
	if err := os.MkdirAll(filepath.Join(proc, "7"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeStatm(t, proc, "7", 678910)
	f, err := os.Open(filepath.Join(proc, "7", "statm"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if v, ok := readSize(f); !ok || v != 678910 {
		t.Errorf("readSize = %d, %v", v, ok)
	}
	self, err := os.Open("/proc/self/statm")
	if err != nil {
		t.Fatal(err)
	}
	defer self.Close()
	if v, ok := readSize(self); !ok || v == 0 {
		t.Errorf("readSize(/proc/self/statm) = %d, %v", v, ok)
	}
}

// scanFinds runs one scan and says whether it found the library at lib.
func scanFinds(t *testing.T, s *Scanner, lib string) bool {
	t.Helper()
	found, err := s.Scan()
	if err != nil {
		t.Fatal(err)
	}
	id, _ := Identify(lib)
	_, ok := found[id]
	return ok
}
