package claims

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// File names a file as /proc/PID/maps does: its device and inode.
type File struct{ Dev, Ino uint64 }

// Maps returns which of want the process maps (the interposer keeps its
// container's ledger mapped for the process's life). It is how a ledger's
// writer is told from the processes its slots merely name: a container can
// write anyone's pid into its own ledger, but it cannot make another
// container's process map the file.
func Maps(procRoot string, pid int, want map[File]bool) (map[File]bool, error) {
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "maps"))
	if err != nil {
		return nil, fmt.Errorf("read maps of pid %d: %w", pid, err)
	}
	var out map[File]bool
	for line := range bytes.Lines(b) {
		// range perms offset dev inode [path]
		f := bytes.Fields(line)
		if len(f) < 5 || f[4][0] == '0' && len(f[4]) == 1 {
			continue // anonymous
		}
		file, ok := parseFile(f[3], f[4])
		if ok && want[file] {
			if out == nil {
				out = map[File]bool{}
			}
			out[file] = true
		}
	}
	return out, nil
}

// parseFile reads maps' "major:minor" (hex) and inode (decimal).
func parseFile(dev, ino []byte) (File, bool) {
	majS, minS, ok := bytes.Cut(dev, []byte{':'})
	if !ok {
		return File{}, false
	}
	maj, err1 := strconv.ParseUint(string(majS), 16, 32)
	mnr, err2 := strconv.ParseUint(string(minS), 16, 32)
	n, err3 := strconv.ParseUint(string(ino), 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return File{}, false
	}
	return File{Dev: unix.Mkdev(uint32(maj), uint32(mnr)), Ino: n}, true
}
