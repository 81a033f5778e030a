package controlblock

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// FileID names a file as /proc/PID/maps does: its device and inode.
type FileID struct{ Dev, Ino uint64 }

// FileOf is the FileID of a stat result.
func FileOf(st *unix.Stat_t) FileID { return FileID{Dev: st.Dev, Ino: st.Ino} }

// StatFile is the FileID of the file at path (links followed), and
// whether there is one: it tells a file, a socket say, from the one made
// before it at the same path.
func StatFile(path string) (FileID, bool) {
	var st unix.Stat_t
	if unix.Stat(path, &st) != nil {
		return FileID{}, false
	}
	return FileOf(&st), true
}

// MappedFiles returns which of want a process maps. The interposer keeps its
// container's control files mapped for the life of the process, in whatever
// mount namespace, and maps names them by device and inode, so this tells
// who holds a ledger whatever path it was opened by (procRoot must be of the
// caller's pid namespace: the host's, under hostPID).
func MappedFiles(procRoot string, pid int, want map[FileID]bool) (map[FileID]bool, error) {
	f, err := os.Open(filepath.Join(procRoot, strconv.Itoa(pid), "maps"))
	if err != nil {
		return nil, fmt.Errorf("read maps of pid %d: %w", pid, err)
	}
	defer f.Close()
	var out map[FileID]bool
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// "7f2a1c000000-7f2a1c009000 rw-s 00000000 fd:01 1234567 /run/gpuwarden/root/usage"
		fields := bytes.Fields(sc.Bytes())
		if len(fields) < 5 {
			continue
		}
		if id, ok := parseFileID(fields[3], fields[4]); ok && want[id] {
			if out == nil {
				out = map[FileID]bool{}
			}
			out[id] = true
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read maps of pid %d: %w", pid, err)
	}
	return out, nil
}

// parseFileID reads maps' "major:minor" (hex) and inode (decimal).
func parseFileID(dev, ino []byte) (FileID, bool) {
	majS, minS, ok := bytes.Cut(dev, []byte{':'})
	if !ok {
		return FileID{}, false
	}
	maj, err1 := strconv.ParseUint(string(majS), 16, 32)
	mnr, err2 := strconv.ParseUint(string(minS), 16, 32)
	n, err3 := strconv.ParseUint(string(ino), 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return FileID{}, false
	}
	return FileID{Dev: unix.Mkdev(uint32(maj), uint32(mnr)), Ino: n}, true
}
