package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/gpuwarden/gpuwarden/cmd/gpuwarden/internal/simmachine"
	"github.com/gpuwarden/gpuwarden/enforcer/agentapi"
	"github.com/gpuwarden/gpuwarden/enforcer/hostcgroup"
)

// demoContainer is one "container" of the demo: a cgroup and a workload.
type demoContainer struct {
	name   string
	env    []string // the interposer's settings; nil: runs without it
	args   []string
	note   string
	cgroup string // absolute path, when made
	rel    string
	cmd    *exec.Cmd
}

// The demo's containers follow cGPU's example: quotas of 6 and 8 GiB on a
// 15 GiB device, weights 1:2, and one over-quota allocation attempt; a third
// runs without the interposer, to show that gpuwarden sees it anyway.
func demoContainers() []*demoContainer {
	train := []string{"--seconds", "1000000", "--kernels", "8", "--kernel-ns", "1000000", "--batch", "32"}
	return []*demoContainer{
		{name: "demo-a", env: []string{"GPUWARDEN_MEMORY_LIMIT=6Gi", "GPUWARDEN_COMPUTE_WEIGHT=1"},
			args: append([]string{"--label", "a", "--alloc", "4Gi", "--try-alloc", "4Gi"}, train...),
			note: "6 GiB quota, weight 1; holds 4 GiB and asks for 4 GiB more (over its quota)"},
		{name: "demo-b", env: []string{"GPUWARDEN_MEMORY_LIMIT=8Gi", "GPUWARDEN_COMPUTE_WEIGHT=2"},
			args: append([]string{"--label", "b", "--alloc", "6Gi"}, train...),
			note: "8 GiB quota, weight 2; holds 6 GiB"},
		{name: "demo-c", args: []string{"--label", "c", "--alloc", "512Mi", "--hold"},
			note: "no interposer (a bypass); holds 512 MiB"},
	}
}

// runDemo starts simgpu, the agent and three containers, prints what
// gpuwarden sees, and runs until --duration passes or Ctrl-C.
func runDemo(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	duration := fs.Duration("duration", 0, "stop after this long (0: run until Ctrl-C)")
	listen := fs.String("listen", "127.0.0.1:9477", "the agent's HTTP address")
	every := fs.Duration("every", 5*time.Second, "how often to print the shares")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(stop)
	var deadline <-chan time.Time
	if *duration > 0 {
		deadline = time.After(*duration)
	}
	if err := demo(*listen, *every, stop, deadline, stdout); err != nil {
		fmt.Fprintf(stderr, "gpuwarden demo: %v\n", err)
		return 1
	}
	return 0
}

func demo(listen string, every time.Duration, stop <-chan os.Signal, deadline <-chan time.Time, out io.Writer) error {
	root := os.Geteuid() == 0
	m, err := simmachine.New(1, "15Gi")
	if err != nil {
		return err
	}
	defer m.Close()
	ctl := m.ControlDir()
	fmt.Fprintf(out, "simulated GPU: 1 device, 15 GiB (simgpu state in %s)\n", m.Dir)
	if !root {
		fmt.Fprintln(out, "note: not root, so no eBPF and no cgroups: the workloads share one cgroup, so each runs the"+
			" interposer standalone (its quota holds, its weight does not), and the agent sees them as one"+
			" unenforced cgroup through NVML; run `sudo make demo` for the whole picture")
	}

	agent, addr, err := m.StartAgent(listen, fmt.Sprintf("GPUWARDEN_EBPF_ENABLED=%v", root))
	if err != nil {
		return err
	}
	defer simmachine.StopProcess(agent)
	fmt.Fprintf(out, "agent: http://%s (metrics: http://%s/metrics, API: http://%s/api/v1/containers)\n", addr, addr, addr)
	if root {
		fmt.Fprintf(out, "try: bin/gpuwarden smi --agent %s; bin/gpuwarden ctl --agent %s --token-file %s set /gpuwarden-demo-%d/demo-a --weight 3\n",
			addr, addr, filepath.Join(m.Dir, "token"), os.Getpid())
	}
	fmt.Fprintln(out)

	containers := demoContainers()
	defer func() {
		for _, c := range containers {
			c.stop()
		}
	}()
	for _, c := range containers {
		if err := c.start(m, ctl, root); err != nil {
			return err
		}
		fmt.Fprintf(out, "started %s: %s\n", c.name, c.note)
	}

	time.Sleep(3 * time.Second) // let the agent see a few seconds of work
	waitJudged(addr, containers, 10*time.Second)
	fmt.Fprintln(out)
	if err := relay(out, exec.Command(filepath.Join(m.Bin, "gpuwarden"), "smi", "--agent", addr)); err != nil {
		return err
	}
	prev := readDemoLaunches(addr)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			fmt.Fprintln(out, "\nstopping")
			return nil
		case <-deadline:
			fmt.Fprintln(out, "\ndone")
			return nil
		case <-tick.C:
			cur := readDemoLaunches(addr)
			printShares(out, containers, prev, cur)
			prev = cur
		}
	}
}

func (c *demoContainer) start(m *simmachine.Machine, ctl string, root bool) error {
	c.cmd = m.Workload(c.args...)
	if c.env != nil {
		if !root {
			// Without cgroups every workload is in the same cgroup, which
			// would make them one container sharing one quota: each gets a
			// control directory of its own (the interposer's standalone mode).
			ctl = filepath.Join(filepath.Dir(ctl), "standalone-"+c.name)
		}
		c.cmd.Env = append(c.cmd.Env, "LD_PRELOAD="+filepath.Join(m.Bin, "libgpuwarden.so"), "GPUWARDEN_CONTROL_DIR="+ctl)
		c.cmd.Env = append(c.cmd.Env, c.env...)
	}
	if root {
		mnt, err := hostcgroup.Mount("/proc/self/mountinfo")
		if err != nil {
			return err
		}
		c.rel = fmt.Sprintf("/gpuwarden-demo-%d/%s", os.Getpid(), c.name)
		c.cgroup = filepath.Join(mnt, c.rel)
		if err := os.MkdirAll(c.cgroup, 0o755); err != nil {
			return fmt.Errorf("make cgroup: %w", err)
		}
		fd, err := syscall.Open(c.cgroup, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer syscall.Close(fd)
		c.cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
	}
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := c.cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", c.name, err)
	}
	lines := bufio.NewScanner(stdout)
	for lines.Scan() {
		if strings.HasPrefix(lines.Text(), "try-alloc ") {
			c.note += " -> " + strings.TrimPrefix(lines.Text(), "try-alloc ")
		}
		if strings.HasPrefix(lines.Text(), "ready") {
			go func() { _, _ = io.Copy(io.Discard, stdout) }()
			return nil
		}
	}
	_ = c.cmd.Wait()
	return fmt.Errorf("%s exited before it was ready", c.name)
}

func (c *demoContainer) stop() {
	if c.cmd != nil && c.cmd.Process != nil {
		_ = c.cmd.Process.Kill()
		_ = c.cmd.Wait()
	}
	if c.cgroup != "" {
		_ = os.Remove(c.cgroup)
		_ = os.Remove(filepath.Dir(c.cgroup)) // the demo's parent, once empty
	}
}

func relay(out io.Writer, cmd *exec.Cmd) error {
	cmd.Stdout, cmd.Stderr = out, out
	return cmd.Run()
}

// demoLaunches is each container's launch counter at a time.
type demoLaunches struct {
	at     time.Time
	byName map[string]agentapi.ContainerDevice
}

func readDemoLaunches(addr string) demoLaunches {
	d := demoLaunches{at: time.Now(), byName: map[string]agentapi.ContainerDevice{}}
	var resp agentapi.ContainersResponse
	src := &smiSource{agent: &url.URL{Scheme: "http", Host: addr}, client: &http.Client{Timeout: 5 * time.Second}}
	if err := src.get(context.Background(), "/api/v1/containers", &resp); err != nil {
		return d
	}
	for _, c := range resp.Containers {
		d.byName[c.Container] = c
	}
	return d
}

// waitJudged waits, at most for limit, until the agent holds the demo's
// bypass in breach: a bypass is one once a second view sees it, so the
// first table shows what the agent decided.
func waitJudged(addr string, cs []*demoContainer, limit time.Duration) {
	for end := time.Now().Add(limit); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
		d := readDemoLaunches(addr)
		judged := true
		for _, c := range cs {
			if c.rel == "" {
				continue // no cgroup of its own (not root): the agent cannot tell it apart
			}
			e, ok := d.byName[c.rel]
			judged = judged && ok && (c.env != nil || len(e.Breaches) > 0)
		}
		if judged {
			return
		}
	}
}

// printShares prints a table like cGPU's: each container's rate in images/s
// (from its exact launch counter: 8 launches a step, 32 images a step), its
// measured share and its target.
func printShares(out io.Writer, cs []*demoContainer, prev, cur demoLaunches) {
	dt := cur.at.Sub(prev.at).Seconds()
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "\ncontainer\tmemory used\tquota\timages/s\tshare\ttarget\tenforced\t\n")
	var rows []string
	for _, c := range cs {
		key := c.rel
		e, ok := cur.byName[key]
		if !ok {
			continue
		}
		p := prev.byName[key]
		rate := "-"
		if e.LaunchesExact && dt > 0 {
			rate = fmt.Sprintf("%.0f", (e.Launches-p.Launches)/dt/8*32)
		}
		target, quota := "-", "-"
		if e.ComputeLimit > 0 {
			target = fmt.Sprintf("%.0f%%", e.ComputeLimit*100)
		}
		if e.MemoryLimitBytes > 0 {
			quota = fmt.Sprintf("%dMiB", e.MemoryLimitBytes>>20)
		}
		enforced := "yes"
		if len(e.Breaches) > 0 {
			enforced = "NO (" + e.Breaches[0].Reason + ")"
		}
		rows = append(rows, fmt.Sprintf("%s\t%dMiB\t%s\t%s\t%.0f%%\t%s\t%s\t", c.name, e.MemoryUsedBytes>>20, quota, rate,
			e.ComputeShare*100, target, enforced))
	}
	sort.Strings(rows)
	for _, r := range rows {
		fmt.Fprintln(w, r)
	}
	_ = w.Flush()
}
