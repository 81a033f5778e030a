package bench

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"github.com/gpuwarden/gpuwarden/cmd/gpuwarden/internal/simmachine"
	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
	"github.com/gpuwarden/gpuwarden/enforcer/hostcgroup"
)

func init() { suites["agent"] = suite{order: 40, run: benchAgent} }

const benchContainers = 1000

// The agent's budget at 1,000 containers (docs/agent.md): a scrape
// under 100 ms, under 100 MiB resident and under 2% of a core, scraped every
// 15 s. It holds with the enforcer off and on (on is the default).
const (
	budgetScrapeMs   = 100
	budgetRSSMiB     = 100
	budgetCorePct    = 2
	benchScrapeEvery = 15 * time.Second
	benchIdleWindow  = 10 * time.Second
	benchScrapes     = 3
)

// benchAgent measures the agent at 1,000 containers: each a real cgroup
// with a live process and an interposer ledger (copies of one real
// process's ledger, pointed at its cgroup and its process, so the agent
// verifies every claim), NVML and eBPF on. It prints the scrape time, the
// agent's RSS, and its CPU at a 15 s scrape interval, with the enforcer off
// and on, and whether each is within the budget.
func benchAgent(o options, stdout io.Writer) error {
	if os.Geteuid() != 0 {
		return errors.New("needs root (cgroups and eBPF)")
	}
	m, err := simmachine.New(1, "80Gi")
	if err != nil {
		return err
	}
	defer m.Close()
	_, stop, err := benchContainersOn(m, benchContainers)
	defer stop()
	if err != nil {
		return err
	}

	if err := benchObservation(m, stdout); err != nil {
		return err
	}
	return benchEnforcement(m, stdout)
}

// benchObservation: the agent with the enforcer off.
func benchObservation(m *simmachine.Machine, stdout io.Writer) error {
	agent, addr, err := m.StartAgent("127.0.0.1:0", "GPUWARDEN_ENFORCEMENT_ENABLED=false", profilesOn)
	if err != nil {
		return err
	}
	defer simmachine.StopProcess(agent)
	// GPUWARDEN_BENCH_PROFILE=FILE saves a CPU profile of the agent while it
	// is scraped (and FILE.enforcing one while it enforces).
	profiled := make(chan error, 1)
	if out := os.Getenv("GPUWARDEN_BENCH_PROFILE"); out != "" {
		go func() { profiled <- saveProfile(addr, out, 8) }()
	} else {
		profiled <- nil
	}
	// The collector serves a view for up to a second: scrapes further apart
	// than that each build a new one.
	var times []float64
	var series int
	for i := 0; i < 8; i++ {
		time.Sleep(1100 * time.Millisecond)
		start := time.Now()
		n, err := scrapeSeries(addr, "gpuwarden_container_gpu_memory_used_bytes")
		if err != nil {
			return err
		}
		times = append(times, float64(time.Since(start).Microseconds())/1000)
		series = n
	}
	if series < benchContainers {
		return fmt.Errorf("the agent reported %d containers, want %d", series, benchContainers)
	}
	if err := <-profiled; err != nil {
		return err
	}
	sort.Float64s(times)
	idle, scrape, err := agentCPU(agent.Process.Pid, addr)
	if err != nil {
		return err
	}
	rss, err := rssMiB(agent.Process.Pid)
	if err != nil {
		return err
	}
	scrapeMs := times[len(times)/2]
	fmt.Fprintf(stdout, "BENCH agent_scrape_ms_1000 %.1f ms\n", scrapeMs)
	fmt.Fprintf(stdout, "BENCH agent_scrape_within_budget %d bool\n", b2i(scrapeMs < budgetScrapeMs))
	printAgentCost(stdout, "agent", idle, scrape, rss)
	return nil
}

// benchEnforcement: the same containers with the enforcer on, every one of
// them scheduled on the one GPU.
func benchEnforcement(m *simmachine.Machine, stdout io.Writer) error {
	agent, addr, err := m.StartAgent("127.0.0.1:0", "GPUWARDEN_ENFORCEMENT_ENABLED=true", profilesOn)
	if err != nil {
		return err
	}
	defer simmachine.StopProcess(agent)
	// Taking a container on costs more than holding it: the figures are
	// taken once every container has its target share.
	for start := time.Now(); ; {
		time.Sleep(1100 * time.Millisecond)
		n, err := scrapeSeries(addr, "gpuwarden_container_compute_limit_ratio")
		if err != nil {
			return err
		}
		if n >= benchContainers {
			break
		}
		if time.Since(start) > 2*time.Minute {
			return fmt.Errorf("the enforcer took on %d containers in 2 minutes, want %d", n, benchContainers)
		}
	}
	time.Sleep(2 * time.Second) // the last ones' first plans
	profiled := make(chan error, 1)
	if out := os.Getenv("GPUWARDEN_BENCH_PROFILE"); out != "" {
		go func() { profiled <- saveProfile(addr, out+".enforcing", int(benchIdleWindow/time.Second)) }()
	} else {
		profiled <- nil
	}
	idle, scrape, err := agentCPU(agent.Process.Pid, addr)
	if err != nil {
		return err
	}
	if err := <-profiled; err != nil {
		return err
	}
	rss, err := rssMiB(agent.Process.Pid)
	if err != nil {
		return err
	}
	printAgentCost(stdout, "agent_enforcing", idle, scrape, rss)
	return nil
}

// agentCPU measures the agent's CPU: the share of a core it uses between
// scrapes, and the CPU time a scrape adds (scrapes 1.1 s apart, each
// building a new view, less the idle CPU of that time).
func agentCPU(pid int, addr string) (idlePct float64, scrape time.Duration, err error) {
	idle, err := cpuOver(pid, benchIdleWindow, nil)
	if err != nil {
		return 0, 0, err
	}
	idlePct = idle.Seconds() / benchIdleWindow.Seconds() * 100
	start := time.Now()
	total, err := cpuOver(pid, 0, func() error {
		for i := 0; i < benchScrapes; i++ {
			time.Sleep(1100 * time.Millisecond)
			if _, err := scrapeSeries(addr, "gpuwarden_build_info"); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, 0, err
	}
	scrape = (total - time.Duration(float64(time.Since(start))*idlePct/100)) / benchScrapes
	return idlePct, max(scrape, 0), nil
}

// printAgentCost prints the CPU and RSS rows of one agent and whether each
// is within the budget (CPU: between scrapes, plus a scrape every 15 s).
func printAgentCost(stdout io.Writer, name string, idlePct float64, scrape time.Duration, rss float64) {
	at15 := idlePct + scrape.Seconds()/benchScrapeEvery.Seconds()*100
	fmt.Fprintf(stdout, "BENCH %s_rss_mib_1000 %.1f MiB\n", name, rss)
	fmt.Fprintf(stdout, "BENCH %s_rss_within_budget %d bool\n", name, b2i(rss < budgetRSSMiB))
	fmt.Fprintf(stdout, "BENCH %s_cpu_idle_core_percent_1000 %.2f percent\n", name, idlePct)
	fmt.Fprintf(stdout, "BENCH %s_cpu_per_scrape_ms_1000 %.1f ms\n", name, float64(scrape.Microseconds())/1000)
	fmt.Fprintf(stdout, "BENCH %s_cpu_core_percent_1000_at_15s %.2f percent\n", name, at15)
	fmt.Fprintf(stdout, "BENCH %s_cpu_within_budget %d bool\n", name, b2i(at15 < budgetCorePct))
}

// benchContainersOn makes n containers on m: each a cgroup with a live
// process and a ledger naming both. It returns their cgroup paths and what
// removes them (to call even after an error).
func benchContainersOn(m *simmachine.Machine, n int) (rels []string, stop func(), err error) {
	stop = func() {}
	parent, rels, err := makeBenchCgroups(n)
	if err != nil {
		return nil, stop, err
	}
	sleepers, err := startSleepers(parent, rels)
	stop = func() {
		stopSleepers(sleepers)
		removeBenchCgroups(parent, rels)
	}
	if err != nil {
		return nil, stop, err
	}
	return rels, stop, fillLedgers(m, m.ControlDir(), parent, rels, sleepers)
}

func makeBenchCgroups(n int) (string, []string, error) {
	mnt, err := hostcgroup.Mount("/proc/self/mountinfo")
	if err != nil {
		return "", nil, err
	}
	parent := fmt.Sprintf("/gpuwarden-bench-%d", os.Getpid())
	var rels []string
	for i := 0; i < n; i++ {
		rel := fmt.Sprintf("%s/c%04d", parent, i)
		if err := os.MkdirAll(filepath.Join(mnt, rel), 0o755); err != nil {
			return "", nil, fmt.Errorf("make cgroup: %w", err)
		}
		rels = append(rels, rel)
	}
	return filepath.Join(mnt, parent), rels, nil
}

func removeBenchCgroups(parent string, rels []string) {
	for _, rel := range rels {
		_ = os.Remove(filepath.Join(filepath.Dir(parent), rel))
	}
	_ = os.Remove(parent)
}

// startSleepers starts one idle process in each cgroup: the process a
// container's ledger names in its slot.
func startSleepers(parent string, rels []string) ([]*exec.Cmd, error) {
	mnt := filepath.Dir(parent)
	var cmds []*exec.Cmd
	for _, rel := range rels {
		fd, err := syscall.Open(filepath.Join(mnt, rel), syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
		if err != nil {
			return cmds, err
		}
		cmd := exec.Command("sleep", "3600")
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
		err = cmd.Start()
		syscall.Close(fd)
		if err != nil {
			return cmds, fmt.Errorf("start a container's process: %w", err)
		}
		cmds = append(cmds, cmd)
	}
	return cmds, nil
}

func stopSleepers(cmds []*exec.Cmd) {
	for _, c := range cmds {
		_ = c.Process.Kill()
		_ = c.Wait()
	}
}

// fillLedgers runs one process under the interposer for a template ledger,
// then writes a copy for every cgroup, naming that cgroup, its process (in
// a live slot) and memory held on the device.
func fillLedgers(m *simmachine.Machine, ctl, parent string, rels []string, procs []*exec.Cmd) error {
	fd, err := syscall.Open(filepath.Join(filepath.Dir(parent), rels[0]), syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	cmd := m.Workload("--alloc", "256Mi", "--steps", "1")
	cmd.Env = append(cmd.Env, "LD_PRELOAD="+filepath.Join(m.Bin, "libgpuwarden.so"), "GPUWARDEN_CONTROL_DIR="+ctl,
		"GPUWARDEN_MEMORY_LIMIT=8Gi")
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("template workload: %w: %s", err, out)
	}
	tmpl, err := os.ReadFile(controlblock.UsagePath(ctl, controlblock.ContainerKey(rels[0])))
	if err != nil {
		return fmt.Errorf("template ledger: %w", err)
	}
	mnt := filepath.Dir(parent)
	for i, rel := range rels {
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join(mnt, rel), &st); err != nil {
			return err
		}
		b := append([]byte(nil), tmpl...)
		u := (*controlblock.Usage)(unsafe.Pointer(&b[0]))
		u.CgroupID = st.Ino
		u.CgroupPath = [controlblock.CgroupPathMax]byte{}
		copy(u.CgroupPath[:], rel)
		u.ReservedBytes[0] = uint64(i%8+1) << 28
		start, err := controlblock.StartTime("/proc", procs[i].Process.Pid)
		if err != nil {
			return err
		}
		u.Slots[0] = controlblock.Slot{State: controlblock.SlotLive, Pid: int32(procs[i].Process.Pid), StartTime: start}
		key := controlblock.ContainerKey(rel)
		if err := os.MkdirAll(filepath.Join(ctl, key), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(controlblock.UsagePath(ctl, key), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// scrapeSeries scrapes /metrics and counts the series of one metric.
func scrapeSeries(addr, metric string) (int, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, fmt.Errorf("scrape: %w", err)
	}
	defer resp.Body.Close()
	n := 0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), metric+"{") {
			n++
		}
	}
	return n, sc.Err()
}

// cpuOver returns the CPU time a process used over d, or while f ran.
func cpuOver(pid int, d time.Duration, f func() error) (time.Duration, error) {
	before, err := cpuTime(pid)
	if err != nil {
		return 0, err
	}
	if f != nil {
		if err := f(); err != nil {
			return 0, err
		}
	} else {
		time.Sleep(d)
	}
	after, err := cpuTime(pid)
	return after - before, err
}

// cpuTime is the CPU time a process used itself (utime and stime, fields
// 14 and 15 of /proc/PID/stat).
func cpuTime(pid int) (time.Duration, error) { return statTicks(pid, 11) }

// reapedCPUTime is the CPU time of the children a process waited for
// (cutime and cstime, fields 16 and 17).
func reapedCPUTime(pid int) (time.Duration, error) { return statTicks(pid, 13) }

// statTicks sums two adjacent clock-tick fields of /proc/PID/stat, from
// field at (counted after the command's closing parenthesis).
func statTicks(pid, at int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	if len(f) <= at+1 {
		return 0, fmt.Errorf("/proc/%d/stat has %d fields", pid, len(f))
	}
	a, _ := strconv.ParseUint(f[at], 10, 64)
	c, _ := strconv.ParseUint(f[at+1], 10, 64)
	return time.Duration(a+c) * 10 * time.Millisecond, nil // USER_HZ is 100
}

func rssMiB(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024, nil
		}
	}
	return 0, errors.New("no VmRSS")
}

// profilesOn serves the profiles saveProfile reads.
const profilesOn = "GPUWARDEN_HTTP_PPROF=true"

func saveProfile(addr, out string, seconds int) error {
	resp, err := http.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, seconds))
	if err != nil {
		return fmt.Errorf("profile the agent: %w", err)
	}
	defer resp.Body.Close()
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(f, resp.Body)
	return err
}
