package gpucheck

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// launchCore is the core part 5 pins its launching processes to, and why:
// the last core this run may use (core 0 takes more of the machine's
// interrupts), among those local to GPU 0 when its PCI device says which.
func (e *env) launchCore() (int, string) {
	var allowed unix.CPUSet
	if err := unix.SchedGetaffinity(0, &allowed); err != nil {
		return 0, fmt.Sprintf("the run's own cores unknown: %v", err)
	}
	local, where := e.gpuLocalCPUs()
	last, lastLocal := -1, -1
	for c := 0; c < len(allowed)*64; c++ {
		if allowed.IsSet(c) {
			last = c
			if local[c] {
				lastLocal = c
			}
		}
	}
	switch {
	case lastLocal >= 0:
		return lastLocal, "the last core this run may use that is local to GPU 0, by " + where
	case where != "":
		return last, "the last core this run may use; none of them is local to GPU 0 by " + where
	default:
		return last, "the last core this run may use"
	}
}

// gpuLocalCPUs is the set of cores local to GPU 0 (nvidia-smi's order),
// from its PCI device's local_cpulist, and the file read; nil in
// simulation mode or when the machine does not say.
func (e *env) gpuLocalCPUs() (map[int]bool, string) {
	if e.o.Simulate {
		return nil, ""
	}
	out, err := exec.Command("nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader", "-i", "0").Output()
	id := strings.ToLower(strings.TrimSpace(string(out)))
	if err != nil || len(id) < 12 {
		return nil, ""
	}
	// nvidia-smi writes an 8-digit PCI domain, sysfs a 4-digit one.
	file := filepath.Join("/sys/bus/pci/devices", id[len(id)-12:], "local_cpulist")
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, ""
	}
	set, err := parseCPUList(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, ""
	}
	return set, file
}

// parseCPUList reads a kernel CPU list such as "0-47,96-143".
func parseCPUList(s string) (map[int]bool, error) {
	set := map[int]bool{}
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return nil, fmt.Errorf("cpu list %q: %w", s, err)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil {
				return nil, fmt.Errorf("cpu list %q: %w", s, err)
			}
		}
		for c := a; c <= b; c++ {
			set[c] = true
		}
	}
	return set, nil
}

// pinProcess pins every thread process pid has to core; threads it makes
// later inherit the mask from the thread that makes them.
func pinProcess(pid, core int) error {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return err
	}
	var set unix.CPUSet
	set.Set(core)
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := unix.SchedSetaffinity(tid, &set); err != nil && err != unix.ESRCH {
			return fmt.Errorf("thread %d: %w", tid, err)
		}
	}
	// What the kernel now says of the process's main thread.
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Cpus_allowed_list:"); ok && strings.TrimSpace(v) != strconv.Itoa(core) {
			return fmt.Errorf("allowed cores are %s after pinning", strings.TrimSpace(v))
		}
	}
	return nil
}

// mapsPreload checks that process pid has loaded the library env preloads,
// if any.
func mapsPreload(pid int, env []string) error {
	var lib string
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "LD_PRELOAD="); ok {
			lib = v
		}
	}
	if lib == "" {
		return nil
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return err
	}
	if !strings.Contains(string(b), lib) {
		return fmt.Errorf("%s is preloaded but not loaded", lib)
	}
	return nil
}
