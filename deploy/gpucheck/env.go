package gpucheck

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/agentapi"
	"github.com/gpuwarden/gpuwarden/enforcer/hostcgroup"
)

// simMemory is the simulated device's size: room for an 8 GiB quota and more.
const simMemory = "16Gi"

// env is the machine the check runs on: the bundle's programs, a work
// directory removed at the end, and the cgroups and processes the parts
// start, all undone by close.
type env struct {
	o       Options
	work    string
	cgRoot  string // the cgroup v2 mount; "" with cgErr when there is none
	cgErr   error
	cgDir   string // this run's parent cgroup, made on first use
	cgOwn   bool   // cgRoot is a cgroup2 mount the run made (unmounted by close)
	libcuda string // NVIDIA's libcuda.so.1, when ldconfig does not know it
	cgroups []*cgroup
	procs   []*proc
	dirs    int
}

func newEnv(o Options) (*env, error) {
	if _, err := os.Stat(filepath.Join(o.Bundle, "bin", "gpuwarden")); err != nil {
		return nil, fmt.Errorf("%s is not a gpu-check bundle (make gpu-check builds one): %w", o.Bundle, err)
	}
	work, err := os.MkdirTemp("", "gpuwarden-check-")
	if err != nil {
		return nil, fmt.Errorf("make work directory: %w", err)
	}
	e := &env{o: o, work: work}
	e.cgRoot, e.cgErr = hostcgroup.Mount("/proc/self/mountinfo")
	if e.cgErr != nil && os.Geteuid() == 0 {
		e.mountCgroup2()
	}
	if !o.Simulate {
		e.libcuda = unlistedLibcuda()
	}
	return e, nil
}

// mountCgroup2 mounts the cgroup v2 hierarchy where a bare machine has
// none, so the parts that need containers can run; close unmounts it.
func (e *env) mountCgroup2() {
	dir := filepath.Join(e.work, "cgroup2")
	if err := os.Mkdir(dir, 0o755); err != nil {
		return
	}
	if err := syscall.Mount("none", dir, "cgroup2", 0, ""); err != nil {
		e.cgErr = fmt.Errorf("%w; mounting one failed: %v", e.cgErr, err)
		return
	}
	e.cgRoot, e.cgErr, e.cgOwn = dir, nil, true
}

// unlistedLibcuda finds NVIDIA's libcuda.so.1 in the usual driver folders
// when ldconfig's cache lacks it (container images often mount the driver
// without running ldconfig); "" when ldconfig has it or nothing is found.
func unlistedLibcuda() string {
	if out, err := exec.Command("ldconfig", "-p").Output(); err == nil && strings.Contains(string(out), "libcuda.so.1 ") {
		return ""
	}
	for _, d := range []string{"/usr/local/nvidia/lib64", "/usr/local/nvidia/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"} {
		if p := filepath.Join(d, "libcuda.so.1"); fileExists(p) {
			return p
		}
	}
	return ""
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// close stops every process the run started, removes its cgroups and its
// work directory: the machine is left as it was found.
func (e *env) close() {
	for _, p := range e.procs {
		p.stop()
	}
	for _, c := range e.cgroups {
		c.remove()
	}
	if e.cgDir != "" {
		_ = os.Remove(e.cgDir)
	}
	if e.cgOwn {
		_ = syscall.Unmount(e.cgRoot, 0)
	}
	_ = os.RemoveAll(e.work)
}

func (e *env) mode() string {
	if e.o.Simulate {
		return "simulation mode, on simgpu"
	}
	return "NVIDIA's driver"
}

// describeMachine names the GPU, its driver, the kernel and the headers, as
// far as the machine tells.
func (e *env) describeMachine() []string {
	var out []string
	if e.o.Simulate {
		out = append(out, "GPU: simgpu, one simulated device of "+simMemory)
	} else if b, err := exec.Command("nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader").Output(); err == nil {
		out = append(out, "GPU (nvidia-smi): "+strings.TrimSpace(string(b)))
	} else {
		out = append(out, fmt.Sprintf("GPU: nvidia-smi did not answer (%v)", err))
	}
	var u syscall.Utsname
	if syscall.Uname(&u) == nil {
		out = append(out, "kernel: "+utsString(u.Release[:]))
	}
	switch {
	case e.cgErr != nil:
		out = append(out, fmt.Sprintf("cgroup v2: none (%v)", e.cgErr))
	case e.cgOwn:
		out = append(out, "cgroup v2: none mounted; the check mounted one at "+e.cgRoot)
	default:
		out = append(out, "cgroup v2: "+e.cgRoot)
	}
	if e.libcuda != "" {
		out = append(out, "libcuda.so.1: "+e.libcuda+" (not in ldconfig's cache: added to LD_LIBRARY_PATH)")
	}
	out = append(out, "CPUs: "+describeCPUs("/sys/devices/system/cpu", runtime.NumCPU()))
	if !e.o.Simulate {
		if v, err := exec.Command(e.python(), "-c", "import torch,torchvision;print(torch.__version__, torchvision.__version__, torch.version.cuda)").Output(); err == nil {
			out = append(out, "PyTorch, torchvision, CUDA runtime: "+strings.TrimSpace(string(v)))
		}
	}
	return out
}

// describeCPUs says what part 4's host row depends on: how many CPUs, which
// share a core with cpu1 (the first trainer's), and how the kernel clocks
// and idles them, from sysfs at root.
func describeCPUs(root string, n int) string {
	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			return ""
		}
		return strings.TrimSpace(string(b))
	}
	or := func(s, none string) string {
		if s == "" {
			return none
		}
		return s
	}
	freq := "none"
	if d := read("cpu0/cpufreq/scaling_driver"); d != "" {
		freq = d + ", governor " + or(read("cpu0/cpufreq/scaling_governor"), "unknown")
	}
	var states []string
	for i := 0; ; i++ {
		name := read(fmt.Sprintf("cpu0/cpuidle/state%d/name", i))
		if name == "" {
			break
		}
		if lat := read(fmt.Sprintf("cpu0/cpuidle/state%d/latency", i)); lat != "" {
			name += " (" + lat + " µs)"
		}
		states = append(states, name)
	}
	return fmt.Sprintf("%d, cpu1's core runs CPUs %s; cpufreq %s; cpuidle driver %s, governor %s, states %s", n,
		or(read("cpu1/topology/thread_siblings_list"), "unknown"), freq, or(read("cpuidle/current_driver"), "unknown"),
		or(read("cpuidle/current_governor"), or(read("cpuidle/current_governor_ro"), "unknown")), or(strings.Join(states, ", "), "none"))
}

func utsString(b []int8) string {
	var s strings.Builder
	for _, c := range b {
		if c == 0 {
			break
		}
		s.WriteByte(byte(c))
	}
	return s.String()
}

func (e *env) python() string {
	if e.o.Python != "" {
		return e.o.Python
	}
	return "python3"
}

// baseEnv is the environment of a process that runs on the driver without
// gpuwarden: nothing of the caller's gpuwarden, cGPU or simgpu settings
// leaks in. In simulation mode it points the process at simgpu.
func (e *env) baseEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		for _, p := range []string{"GPUWARDEN_", "ALIYUN_COM_GPU_", "SIMGPU_", "LD_PRELOAD=", "PYTORCH_CUDA_ALLOC_CONF="} {
			if strings.HasPrefix(kv, p) {
				kv = ""
				break
			}
		}
		if kv != "" && !((e.o.Simulate || e.libcuda != "") && strings.HasPrefix(kv, "LD_LIBRARY_PATH=")) {
			out = append(out, kv)
		}
	}
	if e.libcuda != "" {
		out = append(out, "LD_LIBRARY_PATH="+strings.Trim(filepath.Dir(e.libcuda)+":"+os.Getenv("LD_LIBRARY_PATH"), ":"))
	}
	if e.o.Simulate {
		out = append(out, "LD_LIBRARY_PATH="+e.bundlePath("simgpu"),
			"SIMGPU_STATE="+filepath.Join(e.work, "simgpu.state"), "SIMGPU_DEVICES=1", "SIMGPU_MEMORY="+simMemory)
	}
	return out
}

// newDir makes a fresh directory in the work directory.
func (e *env) newDir(name string) string {
	e.dirs++
	d := filepath.Join(e.work, fmt.Sprintf("%s-%d", name, e.dirs))
	_ = os.MkdirAll(d, 0o755)
	return d
}

// preloaded is baseEnv with the interposer preloaded and its control
// blocks in controlDir, plus settings (GPUWARDEN_* variables).
func (e *env) preloaded(controlDir string, settings ...string) []string {
	return append(e.baseEnv(), append([]string{"LD_PRELOAD=" + e.bundlePath("lib", "libgpuwarden.so"),
		"GPUWARDEN_CONTROL_DIR=" + controlDir}, settings...)...)
}

// command is a program with environment env.
func (e *env) command(ctx context.Context, env []string, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = env
	cmd.WaitDelay = 2 * time.Second // a child left holding its output does not hold the check
	return cmd
}

// proc is a process the run started. Only its own goroutine waits for it,
// so stopping it from elsewhere never races a second Wait.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// start starts cmd, inside cg if not nil, with each line of its output
// passed to onLine; close stops it if it still runs then.
func (e *env) start(cmd *exec.Cmd, cg *cgroup, onLine func(string)) (*proc, error) {
	pr, pw := io.Pipe()
	cmd.Stdout = pw
	var err error
	if cg != nil {
		err = cg.start(cmd)
	} else {
		err = cmd.Start()
	}
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", filepath.Base(cmd.Path), err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	read := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			onLine(sc.Text())
		}
		_, _ = io.Copy(io.Discard, pr)
		close(read)
	}()
	go func() {
		_ = cmd.Wait()
		_ = pw.Close()
		<-read
		close(p.done)
	}()
	e.procs = append(e.procs, p)
	return p, nil
}

// stop kills the process (if it still runs) and waits for it.
func (p *proc) stop() {
	select {
	case <-p.done:
	default:
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// wait waits up to timeout for the process to end by itself.
func (p *proc) wait(timeout time.Duration) bool {
	select {
	case <-p.done:
		return true
	case <-time.After(timeout):
		return false
	}
}

// cgroup is a cgroup v2 group the run made: a "container".
type cgroup struct {
	path string // absolute
	rel  string // as /proc/<pid>/cgroup shows it
}

// cgroup makes a container cgroup for this run, under one parent named for
// the run's process.
func (e *env) cgroup(name string) (*cgroup, error) {
	if e.cgErr != nil {
		return nil, fmt.Errorf("no cgroup v2 mount: %w", e.cgErr)
	}
	parentRel := fmt.Sprintf("/gpuwarden-check-%d", os.Getpid())
	if e.cgDir == "" {
		if err := os.MkdirAll(filepath.Join(e.cgRoot, parentRel), 0o755); err != nil {
			return nil, fmt.Errorf("make cgroup: %w", err)
		}
		e.cgDir = filepath.Join(e.cgRoot, parentRel)
	}
	c := &cgroup{path: filepath.Join(e.cgDir, name), rel: parentRel + "/" + name}
	if err := os.Mkdir(c.path, 0o755); err != nil {
		return nil, fmt.Errorf("make cgroup: %w", err)
	}
	e.cgroups = append(e.cgroups, c)
	return c, nil
}

// start runs cmd inside the cgroup from its first instruction.
func (c *cgroup) start(cmd *exec.Cmd) error {
	fd, err := syscall.Open(c.path, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open cgroup: %w", err)
	}
	defer syscall.Close(fd)
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
	return cmd.Start()
}

// remove kills what is left in the cgroup and removes it.
func (c *cgroup) remove() {
	for i := 0; i < 50; i++ {
		b, _ := os.ReadFile(filepath.Join(c.path, "cgroup.procs"))
		pids := strings.Fields(string(b))
		if len(pids) == 0 {
			break
		}
		for _, p := range pids {
			var pid int
			if _, err := fmt.Sscan(p, &pid); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = os.Remove(c.path)
}

// steered is a bundle program driven line by line on stdin (cuda-alloc):
// each command answers one line.
type steered struct {
	p     *proc
	in    io.WriteCloser
	lines chan string
}

// startSteered starts tools/cuda-alloc with env, in cg if not nil, and
// waits for its "ready".
func (e *env) startSteered(ctx context.Context, env []string, cg *cgroup) (*steered, error) {
	cmd := e.command(ctx, env, e.bundlePath("tools", "cuda-alloc"))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	s := &steered{in: in, lines: make(chan string, 64)}
	if s.p, err = e.start(cmd, cg, func(l string) { s.lines <- l }); err != nil {
		return nil, err
	}
	if line, err := s.next(60 * time.Second); err != nil || line != "ready" {
		s.p.stop()
		return nil, fmt.Errorf("cuda-alloc did not start: %q %v %s", line, err, strings.TrimSpace(stderr.String()))
	}
	return s, nil
}

func (s *steered) next(timeout time.Duration) (string, error) {
	select {
	case l := <-s.lines:
		return l, nil
	case <-s.p.done:
		select {
		case l := <-s.lines:
			return l, nil
		default:
			return "", errors.New("the program exited")
		}
	case <-time.After(timeout):
		return "", fmt.Errorf("no answer in %s", timeout)
	}
}

// do sends one command and returns its answer ("ok ..." or "err N").
func (s *steered) do(line string) string {
	if _, err := fmt.Fprintln(s.in, line); err != nil {
		return "err write: " + err.Error()
	}
	l, err := s.next(2 * time.Minute)
	if err != nil {
		return "err " + err.Error()
	}
	return l
}

// quit ends the program and waits for it.
func (s *steered) quit() {
	_, _ = fmt.Fprintln(s.in, "quit")
	_ = s.in.Close()
	if !s.p.wait(10 * time.Second) {
		s.p.stop()
	}
}

// agent is a `gpuwarden agent` the run started.
type agent struct {
	p     *proc
	addr  string
	token string
	log   string
}

// startAgent runs the bundle's agent on a free loopback port, its control
// blocks in controlDir and its files in the work directory; settings are
// GPUWARDEN_* variables that override the defaults here. It returns once the
// agent is ready.
func (e *env) startAgent(ctx context.Context, controlDir string, settings ...string) (*agent, error) {
	dir := e.newDir("agent")
	a := &agent{token: filepath.Join(dir, "token"), log: filepath.Join(dir, "agent.log")}
	env := append(e.baseEnv(), "GPUWARDEN_CONTROL_DIR="+controlDir, "GPUWARDEN_EBPF_PIN_DIR=",
		"GPUWARDEN_KUBELET_POD_RESOURCES_SOCKET=", "GPUWARDEN_ENFORCEMENT_API_TOKEN_FILE="+a.token,
		"GPUWARDEN_ENFORCEMENT_STATE_FILE="+filepath.Join(dir, "settings.json"))
	if e.o.TimeSlice > 0 {
		env = append(env, "GPUWARDEN_ENFORCEMENT_TIME_SLICE="+e.o.TimeSlice.String())
	}
	if e.o.Simulate {
		env = append(env, "GPUWARDEN_NVML_LIBRARY="+e.bundlePath("simgpu", "libnvidia-ml.so.1"),
			"GPUWARDEN_EBPF_LIBRARIES="+e.bundlePath("simgpu", "libcuda.so.1"), "GPUWARDEN_EBPF_LDCONFIG_SONAME=")
	} else if e.libcuda != "" {
		env = append(env, "GPUWARDEN_EBPF_LIBRARIES="+e.libcuda)
	}
	cmd := e.command(context.WithoutCancel(ctx), append(env, settings...), e.bundlePath("bin", "gpuwarden"), "agent", "--listen", "127.0.0.1:0")
	logf, err := os.Create(a.log)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd.Stderr = logf
	ready, err := agentapi.AwaitReady(cmd)
	if err != nil {
		return nil, err
	}
	if a.p, err = e.start(cmd, nil, func(string) {}); err != nil {
		ready.Close()
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if a.addr, err = ready.Wait(wctx, func() string { b, _ := os.ReadFile(a.log); return string(b) }); err != nil {
		a.stop()
		return nil, err
	}
	return a, nil
}

// stop ends the agent with SIGTERM (SIGKILL after 10 s).
func (a *agent) stop() {
	_ = a.p.cmd.Process.Signal(syscall.SIGTERM)
	if !a.p.wait(10 * time.Second) {
		a.p.stop()
	}
}

// stopFor ends the agent at the end of a part, and fails the part where it
// had ended by itself before: what the part measured after that, it
// measured without an agent (launches at the pace a silent agent leaves).
func (a *agent) stopFor(r *Result) {
	if err := a.exited(); err != nil {
		r.Fail("agent", "%v", err)
		return
	}
	a.stop()
}

// exited says, with the agent's last words, whether it has ended by itself.
func (a *agent) exited() error {
	select {
	case <-a.p.done:
		return fmt.Errorf("the agent exited (%v): %s", a.p.cmd.ProcessState, a.crash())
	default:
		return nil
	}
}

// keepLog copies the agent's log to path, beside the report, where its
// warnings explain what a part measured.
func (a *agent) keepLog(path string) {
	if b, err := os.ReadFile(a.log); err == nil {
		_ = os.WriteFile(path, b, 0o644)
	}
}

// tail is the end of the agent's log, for a failed check's detail.
func (a *agent) tail() string {
	b, _ := os.ReadFile(a.log)
	if len(b) > 1500 {
		b = b[len(b)-1500:]
	}
	return strings.TrimSpace(string(b))
}

// crash is the agent's log from its panic on, or its tail where it has none.
func (a *agent) crash() string {
	b, _ := os.ReadFile(a.log)
	i := strings.Index(string(b), "\npanic: ")
	if i < 0 {
		return a.tail()
	}
	return strings.TrimSpace(string(b[i+1 : min(len(b), i+1+1500)]))
}

var httpClient = &http.Client{Timeout: 10 * time.Second}

// get decodes the agent's JSON answer at path into v.
func (a *agent) get(path string, v any) error {
	resp, err := httpClient.Get("http://" + a.addr + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(v)
}

// ctl runs `gpuwarden ctl` against this agent.
func (e *env) ctl(a *agent, args ...string) (string, error) {
	out, err := exec.Command(e.bundlePath("bin", "gpuwarden"), append([]string{"ctl", "--agent", a.addr, "--token-file", a.token}, args...)...).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// waitFor polls f every 200 ms until it returns nil, ctx ends or timeout
// passes, and returns f's last error.
func waitFor(ctx context.Context, timeout time.Duration, f func() error) error {
	end := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil || time.Now().After(end) || ctx.Err() != nil {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
}
