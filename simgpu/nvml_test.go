package simgpu_test

import (
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

// simgpu's libraries read SIMGPU_STATE once per process, so every NVML test
// in this test binary shares one machine, set up in TestMain before anything
// loads the library. Tests leave it as they found it: no process of theirs
// outlives them.
const (
	nvmlDevices = 2
	nvmlMemory  = 8 << 30
	gib         = 1 << 30
)

var (
	nvmlMachine *simtest.Machine
	nvmlTmp     string // holds the state file and the helper programs
)

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	dir, err := os.MkdirTemp("", "simgpu-nvml-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "simgpu tests:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	nvmlTmp = dir
	nvmlMachine = &simtest.Machine{
		State:   filepath.Join(dir, "simgpu.state"),
		Devices: nvmlDevices,
		Memory:  "8Gi", // nvmlMemory
	}
	// Into this process's own environment, which libnvidia-ml.so.1 reads at
	// its first nvmlInit; tests that make their own machines pass theirs
	// explicitly, and a command's later values win.
	for _, kv := range nvmlMachine.Env() {
		k, v, _ := strings.Cut(kv, "=")
		os.Setenv(k, v)
	}
	return m.Run()
}

var (
	nvmlOnce sync.Once
	nvmlLib  nvml.Interface
)

// nvmlLibrary returns the path of simgpu's libnvidia-ml.so.1, building it
// with make when it is missing.
func nvmlLibrary(t *testing.T) string {
	t.Helper()
	root := simtest.Root(t)
	rel := "bin/simgpu/libnvidia-ml.so.1"
	path := filepath.Join(root, rel)
	if _, err := os.Stat(path); err == nil {
		return path
	}
	if exec.Command("make", "-C", root, "-n", rel).Run() != nil {
		t.Fatalf("%s is missing and there is no make target for it: run `make build` first", path)
	}
	if out, err := exec.Command("make", "-C", root, rel).CombinedOutput(); err != nil {
		t.Fatalf("make %s: %v\n%s", rel, err, out)
	}
	return path
}

// initNVML loads simgpu's NVML through go-nvml, as the agent does, and
// initializes it for the length of the test.
func initNVML(t *testing.T) nvml.Interface {
	t.Helper()
	path := nvmlLibrary(t)
	nvmlOnce.Do(func() { nvmlLib = nvml.New(nvml.WithLibraryPath(path)) })
	if ret := nvmlLib.Init(); ret != nvml.SUCCESS {
		t.Fatalf("nvml.Init with %s: %v", path, ret)
	}
	t.Cleanup(func() {
		if ret := nvmlLib.Shutdown(); ret != nvml.SUCCESS {
			t.Errorf("nvml.Shutdown: %v", ret)
		}
	})
	return nvmlLib
}

func device(t *testing.T, lib nvml.Interface, i int) nvml.Device {
	t.Helper()
	d, ret := lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		t.Fatalf("DeviceGetHandleByIndex(%d): %v", i, ret)
	}
	return d
}

var helperOnce sync.Map // program name -> *helperBuild

type helperBuild struct {
	once sync.Once
	path string
	out  []byte
	err  error
}

// buildHelper compiles one of simgpu/tests/nvml_*.c into the shared temp dir, once.
func buildHelper(t *testing.T, name string) string {
	t.Helper()
	root := simtest.Root(t)
	lib := nvmlLibrary(t) // before once.Do: a t.Fatal inside it would leave it done
	v, _ := helperOnce.LoadOrStore(name, &helperBuild{})
	b := v.(*helperBuild)
	b.once.Do(func() {
		b.path = filepath.Join(nvmlTmp, name)
		args := []string{"-std=gnu11", "-O2", "-g", "-Wall", "-Wextra", "-Werror", "-pthread",
			"-o", b.path, filepath.Join(root, "simgpu/tests", name+".c")}
		switch name {
		case "nvml_api": // an NVML client built against simgpu's header
			args = append(args, "-I"+filepath.Join(root, "simgpu/include"), lib,
				"-Wl,-rpath,"+filepath.Dir(lib))
		}
		b.out, b.err = exec.Command("gcc", args...).CombinedOutput()
	})
	if b.err != nil {
		t.Fatalf("gcc %s: %v\n%s", name, b.err, b.out)
	}
	return b.path
}

// contextBytes is what a CUDA context itself holds on simgpu's device.
const contextBytes = 64 << 20

// startUser starts simgpu's workload on the shared machine, through the real
// libcuda.so.1: it holds alloc bytes (plus its context) on device dev and,
// when busy, keeps the device busy with 10 ms kernels until killed. It
// returns once the memory is held.
func startUser(t *testing.T, dev int, alloc uint64, busy bool) *simtest.Proc {
	t.Helper()
	args := []string{"--device", fmt.Sprint(dev), "--alloc", fmt.Sprint(alloc), "--hold"}
	if busy {
		args = []string{"--device", fmt.Sprint(dev), "--alloc", fmt.Sprint(alloc), "--seconds", "100000",
			"--kernels", "4", "--kernel-ns", "10000000"}
	}
	p := simtest.Start(t, nvmlMachine.Command(simtest.Bin(t, "simgpu/workload"), args...))
	p.WaitLine(t, "ready", 20*time.Second)
	return p
}

// kill SIGKILLs p, as the OOM killer would, and reaps it.
func kill(t *testing.T, p *simtest.Proc) {
	t.Helper()
	if err := p.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_, _ = p.Wait()
}

var uuidRe = regexp.MustCompile(`^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

func cString(b [32]int8) string {
	var s []byte
	for _, c := range b {
		if c == 0 {
			break
		}
		s = append(s, byte(c))
	}
	return string(s)
}

func TestNVMLSystem(t *testing.T) {
	lib := initNVML(t)
	// go-nvml picks the newest version of each entry point the library
	// exports; these are the ones simgpu provides and tests.
	for _, sym := range []string{"nvmlInit_v2", "nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex_v2",
		"nvmlDeviceGetHandleByPciBusId_v2", "nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetComputeRunningProcesses_v3"} {
		if err := lib.Extensions().LookupSymbol(sym); err != nil {
			t.Errorf("go-nvml cannot find %s: %v", sym, err)
		}
	}
	if v, ret := lib.SystemGetDriverVersion(); ret != nvml.SUCCESS || !regexp.MustCompile(`^\d+\.\d+`).MatchString(v) {
		t.Errorf("SystemGetDriverVersion = %q, %v; want a version such as 570.124.06", v, ret)
	}
	if v, ret := lib.SystemGetCudaDriverVersion(); ret != nvml.SUCCESS || v != 12080 {
		t.Errorf("SystemGetCudaDriverVersion = %d, %v; want 12080", v, ret)
	}
	if v, ret := lib.SystemGetCudaDriverVersion_v2(); ret != nvml.SUCCESS || v != 12080 {
		t.Errorf("SystemGetCudaDriverVersion_v2 = %d, %v; want 12080", v, ret)
	}
	if n, ret := lib.DeviceGetCount(); ret != nvml.SUCCESS || n != nvmlDevices {
		t.Fatalf("DeviceGetCount = %d, %v; want %d (SIMGPU_DEVICES)", n, ret, nvmlDevices)
	}
	// Once loaded, go-nvml's error texts are the library's own.
	if s := nvml.ERROR_NOT_FOUND.Error(); s != "Not Found" {
		t.Errorf("ERROR_NOT_FOUND reads %q, want NVIDIA's %q", s, "Not Found")
	}
}

func TestNVMLDevices(t *testing.T) {
	lib := initNVML(t)
	seen := map[string]int{}
	for i := range nvmlDevices {
		d := device(t, lib, i)
		name, ret := d.GetName()
		if ret != nvml.SUCCESS || name == "" {
			t.Errorf("device %d: GetName = %q, %v", i, name, ret)
		}
		uuid, ret := d.GetUUID()
		if ret != nvml.SUCCESS || !uuidRe.MatchString(uuid) {
			t.Fatalf("device %d: GetUUID = %q, %v; want GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", i, uuid, ret)
		}
		if j, dup := seen[uuid]; dup {
			t.Errorf("devices %d and %d share UUID %s", j, i, uuid)
		}
		seen[uuid] = i

		byUUID, ret := lib.DeviceGetHandleByUUID(uuid)
		if ret != nvml.SUCCESS {
			t.Fatalf("DeviceGetHandleByUUID(%s): %v", uuid, ret)
		}
		if idx, ret := byUUID.GetIndex(); ret != nvml.SUCCESS || idx != i {
			t.Errorf("DeviceGetHandleByUUID(%s) gave device %d (%v), want %d", uuid, idx, ret, i)
		}
		pci, ret := d.GetPciInfo()
		if ret != nvml.SUCCESS {
			t.Fatalf("device %d: GetPciInfo: %v", i, ret)
		}
		byBus, ret := lib.DeviceGetHandleByPciBusId(cString(pci.BusId))
		if ret != nvml.SUCCESS {
			t.Fatalf("DeviceGetHandleByPciBusId(%s): %v", cString(pci.BusId), ret)
		}
		if idx, _ := byBus.GetIndex(); idx != i {
			t.Errorf("DeviceGetHandleByPciBusId(%s) gave device %d, want %d", cString(pci.BusId), idx, i)
		}
		if minor, ret := d.GetMinorNumber(); ret != nvml.SUCCESS || minor != i {
			t.Errorf("device %d: GetMinorNumber = %d, %v", i, minor, ret)
		}

		mem, ret := d.GetMemoryInfo()
		if ret != nvml.SUCCESS || mem.Total != nvmlMemory || mem.Free+mem.Used != mem.Total {
			t.Errorf("device %d: GetMemoryInfo = %+v, %v; want total %d (SIMGPU_MEMORY) = free + used", i, mem, ret, uint64(nvmlMemory))
		}
		mem2, ret := d.GetMemoryInfo_v2()
		if ret != nvml.SUCCESS || mem2.Total != nvmlMemory || mem2.Reserved != 0 || mem2.Free+mem2.Used != mem2.Total {
			t.Errorf("device %d: GetMemoryInfo_v2 = %+v, %v; want total %d = free + used, nothing reserved", i, mem2, ret, uint64(nvmlMemory))
		}
	}
}

func TestNVMLErrors(t *testing.T) {
	lib := initNVML(t)
	lookup := func(f func(string) (nvml.Device, nvml.Return), arg string) func() nvml.Return {
		return func() nvml.Return { _, ret := f(arg); return ret }
	}
	byIndex := func(i int) func() nvml.Return {
		return func() nvml.Return { _, ret := lib.DeviceGetHandleByIndex(i); return ret }
	}
	for _, tc := range []struct {
		name string
		call func() nvml.Return
		want nvml.Return
	}{
		{"index past the last device", byIndex(nvmlDevices), nvml.ERROR_INVALID_ARGUMENT},
		{"index far out", byIndex(1000), nvml.ERROR_INVALID_ARGUMENT},
		{"unknown UUID", lookup(lib.DeviceGetHandleByUUID, "GPU-00000000-0000-0000-0000-000000000000"), nvml.ERROR_NOT_FOUND},
		{"empty UUID", lookup(lib.DeviceGetHandleByUUID, ""), nvml.ERROR_NOT_FOUND},
		{"unknown bus id", lookup(lib.DeviceGetHandleByPciBusId, "00000000:7F:00.0"), nvml.ERROR_NOT_FOUND},
		{"malformed bus id", lookup(lib.DeviceGetHandleByPciBusId, "bus seven"), nvml.ERROR_INVALID_ARGUMENT},
	} {
		if got := tc.call(); got != tc.want {
			t.Errorf("%s: got %d (%v), want %d (%v)", tc.name, int32(got), got, int32(tc.want), tc.want)
		}
	}
}

// The C-level contract: NULL pointers, short buffers, stray handles, the
// init reference count, v1 entry points (see simgpu/tests/nvml_api.c).
func TestNVMLCAPI(t *testing.T) {
	api := buildHelper(t, "nvml_api")
	out, err := nvmlMachine.Command(api, "api", fmt.Sprint(nvmlDevices)).CombinedOutput()
	if err != nil {
		t.Fatalf("nvml_api api: %v\n%s", err, out)
	}
}

// findProcess returns the process entry for pid, if the device lists it.
func findProcess(t *testing.T, d nvml.Device, pid int) (nvml.ProcessInfo, bool) {
	t.Helper()
	procs, ret := d.GetComputeRunningProcesses()
	if ret != nvml.SUCCESS {
		t.Fatalf("GetComputeRunningProcesses: %v", ret)
	}
	for _, p := range procs {
		if int(p.Pid) == pid {
			return p, true
		}
	}
	return nvml.ProcessInfo{}, false
}

func usedMemory(t *testing.T, d nvml.Device) uint64 {
	t.Helper()
	m, ret := d.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		t.Fatalf("GetMemoryInfo: %v", ret)
	}
	return m.Used
}

func TestNVMLProcessMemory(t *testing.T) {
	lib := initNVML(t)
	dev0, dev1 := device(t, lib, 0), device(t, lib, 1)
	base0, base1 := usedMemory(t, dev0), usedMemory(t, dev1)

	user := startUser(t, 0, gib, false)
	const held = gib + contextBytes
	pid := user.Cmd.Process.Pid
	p, ok := findProcess(t, dev0, pid)
	if !ok {
		t.Fatalf("pid %d holds 1 GiB on device 0 but is not among its compute processes", pid)
	}
	if p.UsedGpuMemory != held {
		t.Errorf("pid %d: UsedGpuMemory = %d, want %d", pid, p.UsedGpuMemory, held)
	}
	if p.GpuInstanceId != 0xFFFFFFFF || p.ComputeInstanceId != 0xFFFFFFFF {
		t.Errorf("pid %d: instance ids %#x/%#x, want 0xFFFFFFFF without MIG", pid, p.GpuInstanceId, p.ComputeInstanceId)
	}
	if _, ok := findProcess(t, dev1, pid); ok {
		t.Errorf("pid %d uses only device 0 but device 1 lists it", pid)
	}
	if used := usedMemory(t, dev0); used != base0+held {
		t.Errorf("device 0 used %d with the holder, want %d", used, base0+held)
	}
	if used := usedMemory(t, dev1); used != base1 {
		t.Errorf("device 1 used %d, want %d: the holder is on device 0", used, base1)
	}
	// v1, v2 and v3 agree, and follow NVIDIA's sizing protocol.
	api := buildHelper(t, "nvml_api")
	if out, err := nvmlMachine.Command(api, "procs", "0", fmt.Sprint(pid), fmt.Sprint(held)).CombinedOutput(); err != nil {
		t.Errorf("nvml_api procs: %v\n%s", err, out)
	}

	kill(t, user)
	if _, ok := findProcess(t, dev0, pid); ok {
		t.Errorf("pid %d was SIGKILLed but device 0 still lists it", pid)
	}
	if used := usedMemory(t, dev0); used != base0 {
		t.Errorf("device 0 used %d after the holder died, want %d", used, base0)
	}
}

func TestNVMLUtilization(t *testing.T) {
	lib := initNVML(t)
	dev0, dev1 := device(t, lib, 0), device(t, lib, 1)

	// Two processes that keep device 1 busy with 10 ms kernels until killed.
	a := startUser(t, 1, 64<<20, true)
	b := startUser(t, 1, 64<<20, true)
	time.Sleep(300 * time.Millisecond) // both have queued work by now
	since := uint64(time.Now().UnixMicro())
	time.Sleep(1600 * time.Millisecond)

	samples, ret := dev1.GetProcessUtilization(since)
	if ret != nvml.SUCCESS {
		t.Fatalf("GetProcessUtilization(device 1): %v", ret)
	}
	util := map[int]uint32{}
	for _, s := range samples {
		util[int(s.Pid)] = s.SmUtil
		if s.TimeStamp <= since {
			t.Errorf("pid %d: sample timestamp %d is not after lastSeenTimeStamp %d", s.Pid, s.TimeStamp, since)
		}
	}
	// Wide bounds: this must hold on a loaded 2-core machine.
	sum := uint32(0)
	for _, p := range []*simtest.Proc{a, b} {
		pid := p.Cmd.Process.Pid
		u, ok := util[pid]
		if !ok {
			t.Fatalf("pid %d kept device 1 busy but has no utilization sample: %+v", pid, samples)
		}
		if u < 25 || u > 75 {
			t.Errorf("pid %d: SmUtil %d%%, want about half (25-75)", pid, u)
		}
		sum += u
	}
	t.Logf("device 1 over %.1fs: pid %d %d%%, pid %d %d%%", time.Since(time.UnixMicro(int64(since))).Seconds(),
		a.Cmd.Process.Pid, util[a.Cmd.Process.Pid], b.Cmd.Process.Pid, util[b.Cmd.Process.Pid])
	if sum < 70 || sum > 100 {
		t.Errorf("together the processes had %d%% of device 1, want 70-100", sum)
	}
	if u, ret := dev1.GetUtilizationRates(); ret != nvml.SUCCESS || u.Gpu < 70 || u.Memory > u.Gpu {
		t.Errorf("device 1 utilization %+v, %v; want gpu >= 70%% and memory <= gpu", u, ret)
	} else {
		t.Logf("device 1 utilization: gpu %d%%, memory %d%%", u.Gpu, u.Memory)
	}
	if u, ret := dev0.GetUtilizationRates(); ret != nvml.SUCCESS || u.Gpu != 0 {
		t.Errorf("device 0 utilization %+v, %v; want 0: nothing runs there", u, ret)
	}
	if _, ret := dev0.GetProcessUtilization(since); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("GetProcessUtilization(device 0) = %v, want ERROR_NOT_FOUND: nothing ran there", ret)
	}

	kill(t, a)
	kill(t, b)
	time.Sleep(10 * time.Millisecond)
	after := uint64(time.Now().UnixMicro())
	time.Sleep(10 * time.Millisecond)
	if s, ret := dev1.GetProcessUtilization(after); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("GetProcessUtilization after both users died = %+v, %v; want ERROR_NOT_FOUND", s, ret)
	}
}

// go-nvml's copy of nvml.h wraps each opaque handle in a struct for cgo;
// NVIDIA's declares it as a pointer. restoreHandles undoes that.
var wrappedHandle = regexp.MustCompile(`typedef struct\s*\{\s*struct (\w+)\s*\*\s*handle;\s*\}\s*(\w+);`)

// nvidiaHeaderDir writes NVIDIA's nvml.h (from the go-nvml module, handles
// restored) into a temp dir and returns the dir.
func nvidiaHeaderDir(t *testing.T) string {
	t.Helper()
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/NVIDIA/go-nvml")
	cmd.Dir = simtest.Root(t)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -m github.com/NVIDIA/go-nvml: %v", err)
	}
	src, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(out)), "pkg/nvml/nvml.h"))
	if err != nil {
		t.Fatal(err)
	}
	src = wrappedHandle.ReplaceAll(src, []byte("typedef struct $1* $2;"))
	if !bytes.Contains(src, []byte("typedef struct nvmlDevice_st* nvmlDevice_t;")) {
		t.Fatal("NVIDIA's nvml.h: cannot find or restore `typedef struct nvmlDevice_st* nvmlDevice_t;`")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "nvml.h"), src, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// ourHeader is what simgpu/include/nvml.h declares, read from its text.
type ourHeader struct {
	functions []string
	structs   map[string][]string // typedef name -> fields
	ints      []string            // enum values and integer macros
	strings   []string            // string macros
}

var (
	blockComment = regexp.MustCompile(`(?s)/\*.*?\*/`)
	funcDecl     = regexp.MustCompile(`(?m)^[\w ]+?\*?\s*(nvml\w+)\(`)
	structDecl   = regexp.MustCompile(`(?s)typedef struct \w+\s*\{(.*?)\}\s*([\w\s,]+);`)
	fieldDecl    = regexp.MustCompile(`(\w+)\s*(?:\[\w+\])?\s*;`)
	enumValue    = regexp.MustCompile(`(?m)^\s*(NVML_\w+)\s*=`)
	macroDef     = regexp.MustCompile(`(?m)^#define\s+((?:NVML_|nvml)\w+)[ \t]+(.*)$`)
)

func parseOurHeader(t *testing.T) ourHeader {
	t.Helper()
	src, err := os.ReadFile(filepath.Join(simtest.Root(t), "simgpu/include/nvml.h"))
	if err != nil {
		t.Fatal(err)
	}
	text := blockComment.ReplaceAllString(string(src), "")
	h := ourHeader{structs: map[string][]string{}}
	for _, m := range funcDecl.FindAllStringSubmatch(text, -1) {
		h.functions = append(h.functions, m[1])
	}
	for _, m := range structDecl.FindAllStringSubmatch(text, -1) {
		var fields []string
		for _, f := range fieldDecl.FindAllStringSubmatch(m[1], -1) {
			fields = append(fields, f[1])
		}
		for _, name := range strings.Split(m[2], ",") {
			h.structs[strings.TrimSpace(name)] = fields
		}
	}
	for _, m := range enumValue.FindAllStringSubmatch(text, -1) {
		h.ints = append(h.ints, m[1])
	}
	for _, m := range macroDef.FindAllStringSubmatch(text, -1) {
		if strings.HasPrefix(m[2], `"`) {
			h.strings = append(h.strings, m[1])
		} else {
			h.ints = append(h.ints, m[1])
		}
	}
	// A floor, so that a parsing slip cannot make the checks below vacuous.
	for _, want := range []string{"nvmlInit_v2", "nvmlShutdown", "nvmlDeviceGetProcessUtilization"} {
		if !slices.Contains(h.functions, want) {
			t.Fatalf("found no declaration of %s in simgpu/include/nvml.h (parsed %v)", want, h.functions)
		}
	}
	for _, want := range []string{"nvmlMemory_v2_t", "nvmlProcessInfo_t", "nvmlPciInfo_t"} {
		if len(h.structs[want]) == 0 {
			t.Fatalf("found no fields of %s in simgpu/include/nvml.h", want)
		}
	}
	return h
}

// gcc runs gcc in dir and fails the test with its output on error.
func gcc(t *testing.T, dir string, args ...string) {
	t.Helper()
	cmd := exec.Command("gcc", args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("gcc %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// simgpu's nvml.h must agree with NVIDIA's: same signatures, same layouts,
// same values; and the library must export exactly what the header declares.
func TestNVMLHeaderCompat(t *testing.T) {
	root := simtest.Root(t)
	lib := nvmlLibrary(t)
	nvidia := nvidiaHeaderDir(t)
	ours := parseOurHeader(t)
	tmp := t.TempDir()

	// Compiling simgpu's sources against NVIDIA's header makes every
	// definition whose signature differs from NVIDIA's a compile error.
	// simgpu/include comes after NVIDIA's directory for the header simgpu
	// shares with the remote client (nvml_errors.h); nvml.h stays NVIDIA's.
	t.Run("signatures", func(t *testing.T) {
		srcs, _ := filepath.Glob(filepath.Join(root, "simgpu/nvml/*.c"))
		if len(srcs) == 0 {
			t.Fatal("no simgpu/nvml/*.c")
		}
		for _, src := range srcs {
			gcc(t, root, "-std=gnu11", "-fsyntax-only", "-Wall", "-Wextra", "-Werror", "-fvisibility=hidden",
				"-DNVML_NO_UNVERSIONED_FUNC_DEFS", "-I"+nvidia, "-Isimgpu/state", "-Isimgpu/include", src)
		}
	})

	// Exactly the declared functions are exported: none missing, and no
	// simgpu internals (sg_*) leaking into every NVML client's namespace.
	t.Run("exports", func(t *testing.T) {
		f, err := elf.Open(lib)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		syms, err := f.DynamicSymbols()
		if err != nil {
			t.Fatal(err)
		}
		var exported []string
		for _, s := range syms {
			if s.Section != elf.SHN_UNDEF && elf.ST_BIND(s.Info) != elf.STB_LOCAL && elf.ST_TYPE(s.Info) == elf.STT_FUNC {
				exported = append(exported, s.Name)
			}
		}
		for _, fn := range ours.functions {
			if !slices.Contains(exported, fn) {
				t.Errorf("%s does not export %s, which simgpu/include/nvml.h declares", lib, fn)
			}
		}
		for _, fn := range exported {
			if !slices.Contains(ours.functions, fn) {
				t.Errorf("%s exports %s, which simgpu/include/nvml.h does not declare", lib, fn)
			}
		}
	})

	// A client built with NVIDIA's header links against simgpu's library
	// and runs: every function we declare exists under NVIDIA's name and
	// type, and resolves at load time.
	t.Run("link", func(t *testing.T) {
		var c strings.Builder
		c.WriteString("#include <stdio.h>\n#include \"nvml.h\"\nstatic void *const fns[] = {\n")
		for _, fn := range ours.functions {
			fmt.Fprintf(&c, "    (void *)(__typeof__(%s) *)%s,\n", fn, fn)
		}
		c.WriteString("};\nint main(void) {\n" +
			"    printf(\"%zu %s\\n\", sizeof fns / sizeof fns[0], nvmlErrorString(NVML_ERROR_INSUFFICIENT_SIZE));\n" +
			"    return 0;\n}\n")
		src := filepath.Join(tmp, "link.c")
		if err := os.WriteFile(src, []byte(c.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		bin := filepath.Join(tmp, "link")
		gcc(t, tmp, "-std=gnu11", "-Wall", "-Werror", "-DNVML_NO_UNVERSIONED_FUNC_DEFS", "-I"+nvidia,
			"-o", bin, src, lib, "-Wl,-rpath,"+filepath.Dir(lib), "-Wl,-z,now")
		out, err := exec.Command(bin).CombinedOutput()
		if want := fmt.Sprintf("%d Insufficient Size\n", len(ours.functions)); err != nil || string(out) != want {
			t.Errorf("client built with NVIDIA's header: %v, printed %q, want %q", err, out, want)
		}
	})

	// The same probe, built once with each header, prints every size,
	// offset and value our header declares; the outputs must be identical.
	t.Run("layouts", func(t *testing.T) {
		var c strings.Builder
		c.WriteString("#include <stddef.h>\n#include <stdio.h>\n#include \"nvml.h\"\n" +
			"#define I(x) printf(\"%s = %lld\\n\", #x, (long long)(x))\n" +
			"#define S(x) printf(\"%s = %s\\n\", #x, x)\n" +
			"int main(void) {\n")
		names := make([]string, 0, len(ours.structs))
		for name := range ours.structs {
			names = append(names, name)
		}
		slices.Sort(names)
		c.WriteString("    I(sizeof(nvmlDevice_t));\n    I(sizeof(nvmlReturn_t));\n")
		for _, name := range names {
			fmt.Fprintf(&c, "    I(sizeof(%s));\n", name)
			for _, field := range ours.structs[name] {
				fmt.Fprintf(&c, "    I(offsetof(%s, %s));\n", name, field)
			}
		}
		for _, v := range ours.ints {
			fmt.Fprintf(&c, "    I(%s);\n", v)
		}
		for _, v := range ours.strings {
			fmt.Fprintf(&c, "    S(%s);\n", v)
		}
		c.WriteString("    return 0;\n}\n")
		src := filepath.Join(tmp, "probe.c")
		if err := os.WriteFile(src, []byte(c.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		run := func(name string, flags ...string) []string {
			bin := filepath.Join(tmp, name)
			gcc(t, tmp, append([]string{"-std=gnu11", "-Wall", "-Werror", "-o", bin, src}, flags...)...)
			out, err := exec.Command(bin).Output()
			if err != nil {
				t.Fatalf("%s: %v", bin, err)
			}
			return strings.Split(strings.TrimSpace(string(out)), "\n")
		}
		got := run("probe-simgpu", "-I"+filepath.Join(root, "simgpu/include"))
		want := run("probe-nvidia", "-DNVML_NO_UNVERSIONED_FUNC_DEFS", "-I"+nvidia)
		if len(got) != len(want) {
			t.Fatalf("probes printed %d and %d lines", len(got), len(want))
		}
		for i := range got {
			if got[i] != want[i] {
				t.Errorf("simgpu: %s; NVIDIA: %s", got[i], want[i])
			}
		}
		if !t.Failed() {
			t.Logf("%d sizes, offsets and values agree", len(got))
		}
	})
}
