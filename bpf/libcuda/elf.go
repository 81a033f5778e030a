package libcuda

import (
	"bytes"
	"debug/elf"
	"strings"
)

// driverExports are what every CUDA driver library exports: a copy renamed
// to anything is still found by them.
var driverExports = []string{"cuInit", "cuMemAlloc_v2"}

// ExportsDriver says whether the ELF file at path defines the driver's
// entry points itself. The interposer defines them too, to hook them; its
// symbols carry its version node (GPUWARDEN_*), and it is not a driver.
func ExportsDriver(path string) bool {
	f, err := elf.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	syms, err := f.DynamicSymbols()
	if err != nil {
		return false
	}
	found := 0
	for _, s := range syms {
		if s.Section == elf.SHN_UNDEF || elf.ST_TYPE(s.Info) != elf.STT_FUNC || !isDriverExport(s.Name) {
			continue
		}
		if strings.HasPrefix(s.Version, "GPUWARDEN") {
			return false
		}
		found++
	}
	return found == len(driverExports)
}

func isDriverExport(name string) bool {
	for _, n := range driverExports {
		if name == n {
			return true
		}
	}
	return false
}

// execMapping is an executable file mapping of a maps line.
type execMapping struct {
	MapsEntry
	file string // "dev inode" as maps shows them: the file, in any namespace
}

// execMappings returns the first executable mapping of each distinct file
// in a maps file, other than those ParseMaps finds by name. It reads each
// line with a few byte searches: every process's maps are read each scan.
func execMappings(data []byte) []execMapping {
	var out []execMapping
	seen := map[string]bool{}
	for line := range bytes.Lines(data) {
		line = bytes.TrimSuffix(line, []byte("\n"))
		// range perms offset dev inode path
		sp := bytes.IndexByte(line, ' ')
		if sp < 0 || len(line) < sp+4 || line[sp+3] != 'x' {
			continue
		}
		slash := bytes.IndexByte(line, '/')
		if slash < 0 {
			continue // anonymous, [vdso] and the like
		}
		f := strings.Fields(string(line[sp+1 : slash]))
		if len(f) != 4 {
			continue
		}
		path := string(line[slash:])
		file := f[2] + " " + f[3]
		if seen[file] || IsLibcuda(path) {
			continue
		}
		seen[file] = true
		out = append(out, execMapping{MapsEntry{Range: string(line[:sp]), Path: path}, file})
	}
	return out
}
