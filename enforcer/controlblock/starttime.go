package controlblock

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// StartTime reads a process's start time (stat field 22, clock ticks since
// boot) as a ledger slot records it (ProcUsage.StartTime; the interposer's
// gw_proc_start_time reads the same field): with the pid it tells a process
// from a later one that reused the pid. procRoot is normally "/proc".
func StartTime(procRoot string, pid int) (uint64, error) {
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, fmt.Errorf("read stat of pid %d: %w", pid, err)
	}
	// comm (field 2) may hold spaces and parentheses: count from the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("stat of pid %d: no command", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	const startField = 22 - 3 // fields after comm start at 3
	if len(f) <= startField {
		return 0, fmt.Errorf("stat of pid %d: %d fields", pid, len(f)+2)
	}
	st, err := strconv.ParseUint(f[startField], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("stat of pid %d: start time: %w", pid, err)
	}
	return st, nil
}
