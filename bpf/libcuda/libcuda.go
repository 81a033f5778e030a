// Package libcuda finds the libcuda files a node's processes use: the one
// the host's dynamic linker knows (ldconfig), and any mapped by a running
// process, whatever its path or mount namespace. Each file is known by its
// device and inode, so a bind mount of the host's file is the same file.
package libcuda

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// DefaultSoname is the library the host's driver installs.
const DefaultSoname = "libcuda.so.1"

// FileID identifies a file: its device and inode.
type FileID struct {
	Dev, Ino uint64
}

func (f FileID) String() string { return fmt.Sprintf("%d:%d", f.Dev, f.Ino) }

// Identify stats path (following links) and returns its FileID.
func Identify(path string) (FileID, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return FileID{}, fmt.Errorf("stat %s: %w", path, err)
	}
	return FileID{Dev: uint64(st.Dev), Ino: st.Ino}, nil
}

// FromLdconfig returns where the dynamic linker finds soname, per `ldconfig -p`,
// for this machine's word size (x86-64). None found is no error.
func FromLdconfig(ctx context.Context, soname string) ([]string, error) {
	out, err := exec.CommandContext(ctx, "ldconfig", "-p").Output()
	if err != nil {
		// Debian keeps ldconfig in /sbin, not always on a user's PATH.
		out, err = exec.CommandContext(ctx, "/sbin/ldconfig", "-p").Output()
		if err != nil {
			return nil, fmt.Errorf("run ldconfig -p: %w", err)
		}
	}
	return ParseLdconfig(bytes.NewReader(out), soname), nil
}

// ParseLdconfig reads `ldconfig -p` output: lines like
// "	libcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1".
// Only 64-bit x86 entries count (the probes are built for x86-64).
func ParseLdconfig(r io.Reader, soname string) []string {
	var paths []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		name, rest, ok := strings.Cut(strings.TrimSpace(sc.Text()), " ")
		if !ok || name != soname {
			continue
		}
		attrs, path, ok := strings.Cut(rest, "=>")
		if !ok || !strings.Contains(attrs, "x86-64") {
			continue
		}
		paths = append(paths, strings.TrimSpace(path))
	}
	return paths
}

// Mapping is a libcuda file mapped by a process.
type Mapping struct {
	PID      int
	Path     string // as the process's maps show it (inside its mount namespace)
	OpenPath string // a path the agent can open it by: /proc/<pid>/map_files/<range> or /proc/<pid>/root/<path>
	File     FileID
}

// IsLibcuda tells whether a mapped path is a libcuda (libcuda.so, .so.1, .so.550.54.15).
func IsLibcuda(path string) bool {
	base := filepath.Base(strings.TrimSuffix(path, " (deleted)"))
	return base == "libcuda.so" || strings.HasPrefix(base, "libcuda.so.")
}

// MapsEntry is one line of /proc/<pid>/maps that maps a libcuda file.
type MapsEntry struct {
	Range string // "7f12a0000000-7f12a0200000"
	Path  string
}

// ParseMaps returns the first mapping of each distinct libcuda path in a
// /proc/<pid>/maps file.
func ParseMaps(data []byte) []MapsEntry {
	if !bytes.Contains(data, []byte("libcuda.so")) {
		return nil
	}
	var out []MapsEntry
	seen := map[string]bool{}
	for line := range bytes.Lines(data) {
		if !bytes.Contains(line, []byte("libcuda.so")) {
			continue
		}
		// range perms offset dev inode path
		f := strings.Fields(string(line))
		if len(f) < 6 {
			continue
		}
		path := strings.Join(f[5:], " ")
		if !IsLibcuda(path) || seen[path] {
			continue
		}
		seen[path] = true
		out = append(out, MapsEntry{Range: f[0], Path: path})
	}
	return out
}

// Scan reads every process's maps under procRoot (normally /proc) and
// returns one Mapping per distinct libcuda file (by the first process found
// mapping it), each time reading every other file's ELF symbols anew:
// a Scanner remembers them.
func Scan(procRoot string) (map[FileID]Mapping, error) {
	return NewScanner(procRoot).Scan()
}

// Scanner finds the libcuda files processes map: by name, and by what they
// export (a renamed copy). It remembers, by device and inode, which other
// executable files are drivers, so each file's symbols are read once; and
// what each process mapped, so a process whose mappings did not change is
// not read again.
type Scanner struct {
	procRoot string
	driver   map[string]bool // "dev inode" as maps shows them
	procs    map[int]*procMaps
	passes   int
	changes  Changes
	gens     uint64 // processes read so far: each new one's generation
}

// Changes names the processes (by pid under the scanner's procRoot) that may
// have mapped new code, or exited, since it was last called; all: it cannot
// tell. A process it does not name keeps what it mapped when last read,
// without its statm being read (the eBPF probes' kprobes on mmap and
// mprotect, probes.Changed).
type Changes func() (pids map[int]bool, all bool, err error)

// SetChanges makes every scan ask c which known processes to look at again.
func (s *Scanner) SetChanges(c Changes) { s.changes = c }

// procMaps is what one process mapped when its maps were last read.
type procMaps struct {
	statm *os.File        // its /proc/<pid>/statm, kept open: a read fails once the process is gone
	size  uint64          // its virtual size then, in pages
	found []Mapping       // its libcuda files
	files map[string]bool // its other executable files, and whether each is a driver
	gen   uint64          // tells it from a later process with its pid
}

// recheckEvery: every so many scans (30 s at the default interval) each
// process's maps are read, whatever its size says: a library mapped in
// place of one of the same size leaves the virtual size alone. Processes
// take turns by pid, so a scan reads a few, not all. Meanwhile NVML's
// per-process view still sees such a process use a GPU.
const recheckEvery = 60

// recheckListings: with the changes known (they name an mmap in place),
// turns are a net only, taken on listing passes: each process every so
// many listings (5 min at the default interval).
const recheckListings = 30

// onTurn says whether pid's maps are read on this pass whatever its size.
func onTurn(pid, pass int, all bool) bool {
	if all {
		return (pid+pass)%recheckEvery == 0
	}
	return (pid+pass/listEvery)%recheckListings == 0
}

// NewScanner scans the processes under procRoot.
func NewScanner(procRoot string) *Scanner {
	return &Scanner{procRoot: procRoot, driver: map[string]bool{}, procs: map[int]*procMaps{}}
}

// Scan returns one Mapping per distinct libcuda file (by the first process
// found mapping it). The calling process is left out: the agent maps every
// container's control block, and its maps would cost more to read than all
// the others'.
func (s *Scanner) Scan() (map[FileID]Mapping, error) {
	pass := s.passes
	s.passes++
	changed, all := map[int]bool(nil), true
	if s.changes != nil {
		var err error
		if changed, all, err = s.changes(); err != nil {
			changed, all = nil, true // read every process's size, as without changes
		}
	}
	self, _ := os.Readlink(filepath.Join(s.procRoot, "self")) // our pid as procRoot numbers it
	if !all && pass%listEvery != 0 {
		s.rescan(changed, self)
		return s.found(), nil
	}
	names, err := readNames(s.procRoot)
	if err != nil {
		return nil, fmt.Errorf("scan processes: %w", err)
	}
	known := make(map[string]bool, len(s.driver))
	procs := make(map[int]*procMaps, len(s.procs))
	for _, name := range names {
		pid, err := strconv.Atoi(name)
		if err != nil || pid <= 0 || name == self {
			continue
		}
		recheck := onTurn(pid, pass, all)
		p := s.procs[pid]
		switch {
		case all || p == nil:
			p = s.process(pid, recheck, known)
		case changed[pid] || recheck: // an mprotect leaves the size alone
			p = s.process(pid, true, known)
		} // else: no mmap, mprotect, exec or exit since it was read
		if p == nil {
			continue // gone, or a kernel thread
		}
		procs[pid] = p
		delete(s.procs, pid)
		for f, is := range p.files {
			known[f] = is
		}
	}
	for _, gone := range s.procs { // processes no longer listed
		gone.close()
	}
	s.driver = known // files no process maps any more are forgotten
	s.procs = procs
	return s.found(), nil
}

// listEvery: with the changes known, /proc is listed only every so many
// scans (10 s at the default interval). A new process maps its libraries
// after exec, which names it among the changes; the listing is the net for
// anything else (a forked child maps only its parent's files).
const listEvery = 20

// rescan reads again the processes the changes name, known or new,
// without listing /proc or taking turns (the changes name an mmap in place
// too): on a node of a thousand idle containers a scan reads nothing.
func (s *Scanner) rescan(changed map[int]bool, self string) {
	for pid := range changed {
		if strconv.Itoa(pid) == self {
			continue
		}
		p := s.process(pid, s.procs[pid] != nil, s.driver)
		if p == nil {
			delete(s.procs, pid) // gone, or a kernel thread
			continue
		}
		s.procs[pid] = p
		for f, is := range p.files {
			s.driver[f] = is
		}
	}
}

// found is every libcuda file the known processes map, each as the
// lowest pid maps it (whatever order the processes were read in).
func (s *Scanner) found() map[FileID]Mapping {
	found := map[FileID]Mapping{}
	for _, p := range s.procs {
		for _, mp := range p.found {
			if had, dup := found[mp.File]; !dup || mp.PID < had.PID {
				found[mp.File] = mp
			}
		}
	}
	return found
}

// User is a process that maps libcuda files.
type User struct {
	Gen   uint64 // differs for a later process with the same pid
	Files []FileID
}

// Users is every process known to map a libcuda file at the last Scan, by
// pid as procRoot numbers them.
func (s *Scanner) Users() map[int]User {
	out := map[int]User{}
	for pid, p := range s.procs {
		for _, mp := range p.found {
			u := out[pid]
			u.Gen = p.gen
			if !slices.Contains(u.Files, mp.File) {
				u.Files = append(u.Files, mp.File)
			}
			out[pid] = u
		}
	}
	return out
}

// readNames lists a directory unsorted (os.ReadDir sorts, and makes an
// entry of each name).
func readNames(dir string) ([]string, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.Readdirnames(-1)
}

// process is what pid maps: as last read while its virtual size is
// unchanged (a pread of its open statm file costs a fraction of reading its
// maps, and fails once the process is gone, so a reused pid is a new
// process), else, or when recheck, read anew. nil when the process is gone
// or maps nothing readable.
func (s *Scanner) process(pid int, recheck bool, known map[string]bool) *procMaps {
	dir := filepath.Join(s.procRoot, strconv.Itoa(pid))
	p := s.procs[pid]
	if p != nil {
		size, ok := readSize(p.statm)
		if ok && !recheck && size == p.size {
			return p
		}
		if !ok { // gone: a new process may have its pid
			p.close()
			p = nil
		} else {
			p.size = size
		}
	}
	data, err := os.ReadFile(filepath.Join(dir, "maps"))
	if err != nil {
		if p != nil {
			p.close()
		}
		return nil
	}
	if p == nil {
		s.gens++
		p = &procMaps{size: ^uint64(0), gen: s.gens} // no statm yet: read again next time
		if f, err := os.Open(filepath.Join(dir, "statm")); err == nil {
			p.statm = f
			if v, ok := readSize(f); ok {
				p.size = v
			}
		}
	}
	p.found, p.files = nil, map[string]bool{}
	for _, m := range append(ParseMaps(data), s.renamed(pid, data, known, p.files)...) {
		if mp, ok := open(s.procRoot, pid, m); ok {
			p.found = append(p.found, mp)
		}
	}
	return p
}

func (p *procMaps) close() {
	if p.statm != nil {
		p.statm.Close()
		p.statm = nil
	}
}

// readSize reads a process's virtual size in pages, the first field of its
// open statm file (the kernel writes it cheaper than stat, which sums every
// thread's times).
func readSize(f *os.File) (uint64, bool) {
	if f == nil {
		return 0, false
	}
	var buf [128]byte
	n, err := f.ReadAt(buf[:], 0)
	if n == 0 || (err != nil && err != io.EOF) {
		return 0, false
	}
	field, _, ok := bytes.Cut(buf[:n], []byte{' '})
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseUint(string(field), 10, 64)
	return v, err == nil
}

// renamed returns the executable mappings of a process that are driver
// libraries under another name, reading a file's symbols only the first
// time it is seen; files records each of its files' verdicts.
func (s *Scanner) renamed(pid int, data []byte, known, files map[string]bool) []MapsEntry {
	var out []MapsEntry
	for _, m := range execMappings(data) {
		is, ok := known[m.file]
		if !ok {
			if is, ok = s.driver[m.file]; !ok {
				if mp, opened := open(s.procRoot, pid, m.MapsEntry); opened {
					is = ExportsDriver(mp.OpenPath)
				}
			}
			known[m.file] = is
		}
		files[m.file] = is
		if is {
			out = append(out, m.MapsEntry)
		}
	}
	return out
}

// open finds a path the agent can open the mapped file by: the map_files
// link (works for deleted files and any mount namespace; needs
// CAP_SYS_ADMIN), else the path under the process's root.
func open(procRoot string, pid int, m MapsEntry) (Mapping, bool) {
	for _, p := range []string{
		filepath.Join(procRoot, strconv.Itoa(pid), "map_files", m.Range),
		filepath.Join(procRoot, strconv.Itoa(pid), "root", strings.TrimSuffix(m.Path, " (deleted)")),
	} {
		if id, err := Identify(p); err == nil {
			return Mapping{PID: pid, Path: m.Path, OpenPath: p, File: id}, true
		}
	}
	return Mapping{}, false
}
