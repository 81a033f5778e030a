package bench

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gpuwarden/gpuwarden/bpf/probes"
	"github.com/gpuwarden/gpuwarden/cmd/gpuwarden/internal/simmachine"
)

func init() { suites["probes"] = suite{order: 20, run: benchProbes} }

// benchProbes measures what the eBPF probes cost: one probe hit (a launch
// loop with the launch probe attached for good, against none); a training
// run's throughput under the interposer, with the agent observing it and
// without, in alternating rounds; and which of the agent's eBPF programs
// that cost is spent in, for a process that keeps a ledger and for one that
// bypasses it (programCosts).
func benchProbes(o options, stdout io.Writer) error {
	if os.Geteuid() != 0 {
		return errors.New("needs root: it loads eBPF programs and attaches uprobes")
	}
	raisePriority()
	m, err := simmachine.New(1, "16Gi")
	if err != nil {
		return err
	}
	defer m.Close()
	lib := filepath.Join(m.Bin, "simgpu", "libcuda.so.1")

	// One probe hit: the launch loop's cost per call with and without the
	// launch probe, alternating, medians of three.
	hit, err := probeHitNS(m, lib, min(o.launches, 20000))
	if err != nil {
		return fmt.Errorf("probe hit: %w", err)
	}
	fmt.Fprintf(stdout, "BENCH uprobe_hit_ns %.0f ns\n", hit)

	// Each workload runs in a cgroup of its own: a container.
	parent, rels, err := makeBenchCgroups(2)
	if err != nil {
		return err
	}
	defer removeBenchCgroups(parent, rels)
	t := probesTraining{m: m, secs: max(o.seconds, 10), ledgered: filepath.Join(filepath.Dir(parent), rels[0]),
		bypassing: filepath.Join(filepath.Dir(parent), rels[1])}

	// Throughput: rounds with the agent at its defaults (eBPF on) and with
	// its eBPF off, alternating, the first of each pair taking turns.
	const rounds = 3
	var ratios []float64
	for i := 0; i < rounds; i++ {
		steps := map[bool]float64{}
		for _, probed := range []bool{i%2 == 0, i%2 != 0} {
			v, err := t.round(probed)
			if err != nil {
				return fmt.Errorf("training round %d: %w", i+1, err)
			}
			steps[probed] = v
		}
		ratios = append(ratios, steps[true]/steps[false])
		fmt.Fprintf(stdout, "BENCH probes_training_round%d_on_steps_per_sec %.2f steps/s\n", i+1, steps[true])
		fmt.Fprintf(stdout, "BENCH probes_training_round%d_off_steps_per_sec %.2f steps/s\n", i+1, steps[false])
		fmt.Fprintf(stdout, "BENCH probes_training_round%d_ratio %.4f ratio\n", i+1, steps[true]/steps[false])
	}
	ratio := mean(ratios)
	fmt.Fprintf(stdout, "BENCH probes_training_throughput_ratio %.4f ratio\n", ratio)
	fmt.Fprintf(stdout, "BENCH probes_training_throughput_within_budget %d bool\n", b2i(ratio >= budgetProbesTraining))

	// Which program the cost is spent in, with the kernel's run-time
	// statistics on (they add two clock reads to every program run, so
	// the rounds above go without them).
	return t.programCosts(stdout)
}

// budgetProbesTraining: the probes cost a training run at most 0.5% of its
// throughput.
const budgetProbesTraining = 0.995

// probesTraining runs simgpu's training step (the shares bench's train_b32:
// 64 kernels of uneven lengths, 20 us of host work before each launch, one
// sync a step) on a simulated machine, under the interposer in one cgroup,
// or bypassing it in another.
type probesTraining struct {
	m                   *simmachine.Machine
	secs                float64
	ledgered, bypassing string // cgroup directories
}

func trainingArgs(secs float64) []string {
	return []string{"--label", "train", "--seconds", fmt.Sprint(secs), "--kernels", fmt.Sprint(trainingKernels), "--uneven", "--host-ns", "20000",
		"--kernel-ns", fmt.Sprint(trainingBatch * 6250), "--batch", fmt.Sprint(trainingBatch), "--progress"}
}

const trainingBatch, trainingKernels = 32, 64

// settle is how long a new process runs before it is measured: the agent
// counts a new process's launches exactly until its view of the ledgers
// (rebuilt every 4 s) shows the process in one, and asks again every second.
const settle = 6 * time.Second

// agent starts the agent at its defaults, with eBPF on or off.
func (t probesTraining) agent(probes bool) (*exec.Cmd, error) {
	cmd, _, err := t.m.StartAgent("127.0.0.1:0", fmt.Sprintf("GPUWARDEN_EBPF_ENABLED=%t", probes))
	return cmd, err
}

// workload starts a training run of secs seconds in its cgroup, under the
// interposer when ledgered.
func (t probesTraining) workload(ledgered bool, secs float64) (*exec.Cmd, *bytes.Buffer, error) {
	dir := t.bypassing
	cmd := t.m.Workload(trainingArgs(secs)...)
	if ledgered {
		dir = t.ledgered
		cmd.Env = append(cmd.Env, "LD_PRELOAD="+filepath.Join(t.m.Bin, "libgpuwarden.so"),
			"GPUWARDEN_CONTROL_DIR="+t.m.ControlDir(), "GPUWARDEN_MEMORY_LIMIT=8Gi")
	}
	fd, err := syscall.Open(dir, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	defer syscall.Close(fd)
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
	// Ahead of other work on a shared machine (see raisePriority).
	if nice, err := exec.LookPath("nice"); err == nil {
		cmd.Args = append([]string{"nice", "-n", fmt.Sprint(benchNice)}, cmd.Args...)
		cmd.Path = nice
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("start training run: %w", err)
	}
	return cmd, &out, nil
}

// finish waits for a training run and returns its steps per second.
func finish(cmd *exec.Cmd, out *bytes.Buffer) (float64, error) {
	if err := cmd.Wait(); err != nil {
		return 0, fmt.Errorf("training run: %w: %s", err, out.String())
	}
	return benchFigure(out.String(), "steps_per_sec")
}

// round is a ledgered training run's steps per second, from settle on,
// with the agent observing it (probed) or with the agent's eBPF off.
func (t probesTraining) round(probed bool) (float64, error) {
	agent, err := t.agent(probed)
	if err != nil {
		return 0, err
	}
	defer simmachine.StopProcess(agent)
	cmd, out, err := t.workload(true, settle.Seconds()+t.secs)
	if err != nil {
		return 0, err
	}
	if _, err := finish(cmd, out); err != nil {
		return 0, err
	}
	return settledSteps(out.String())
}

// settledSteps is the steps per second a training run's progress lines
// ("progress <unix time> <images> <device ms>") show from settle after the
// first to the last.
func settledSteps(out string) (float64, error) {
	var t0, t1, i0, i1 float64
	first := -1.0
	for line := range strings.Lines(out) {
		f := strings.Fields(line)
		if len(f) != 4 || f[0] != "progress" {
			continue
		}
		at, err1 := strconv.ParseFloat(f[1], 64)
		images, err2 := strconv.ParseFloat(f[2], 64)
		if err1 != nil || err2 != nil {
			continue
		}
		if first < 0 {
			first = at
		}
		if at-first < settle.Seconds() {
			continue
		}
		if t0 == 0 {
			t0, i0 = at, images
		}
		t1, i1 = at, images
	}
	if t1 <= t0 {
		return 0, fmt.Errorf("training run: no progress after %v: %q", settle, out)
	}
	return (i1 - i0) / trainingBatch / (t1 - t0), nil
}

// programCosts prints, for each of the agent's eBPF programs, its runs per
// second and mean run time over a ledgered training run, then over a
// bypassing one: the exact launch program does not run for the ledgered
// process, and runs once for each launch of the bypassing one. The counts
// include every run on the machine, as an agent's would: the raw
// tracepoints run for every process, and the exact launch program for
// any other process that maps libcuda without a ledger. Each run is
// measured from settle on.
func (t probesTraining) programCosts(stdout io.Writer) error {
	agent, err := t.agent(true)
	if err != nil {
		return err
	}
	defer simmachine.StopProcess(agent)
	stats, err := probes.EnableStats()
	if err != nil {
		return err
	}
	defer stats.Close()
	for _, ledgered := range []bool{true, false} {
		prefix := "probes_prog_"
		if !ledgered {
			prefix = "probes_bypass_prog_"
		}
		cmd, out, err := t.workload(ledgered, settle.Seconds()+t.secs)
		if err != nil {
			return err
		}
		cg := t.ledgered
		if !ledgered {
			cg = t.bypassing
		}
		time.Sleep(settle)
		before, err := probes.ProcessProgramStats(agent.Process.Pid)
		exact0, err2 := exactLaunchesOf(agent.Process.Pid, cg)
		if err := errors.Join(err, err2); err != nil {
			cmd.Process.Kill()
			cmd.Wait()
			return err
		}
		start := time.Now()
		time.Sleep(time.Duration(t.secs * float64(time.Second)))
		after, err := probes.ProcessProgramStats(agent.Process.Pid)
		exact1, err2 := exactLaunchesOf(agent.Process.Pid, cg)
		secs := time.Since(start).Seconds()
		steps, werr := finish(cmd, out)
		if err := errors.Join(err, err2, werr); err != nil {
			return err
		}
		for _, name := range slices.Sorted(maps.Keys(after)) {
			runs := after[name].RunCount - before[name].RunCount
			var nsPerHit float64
			if runs > 0 {
				nsPerHit = float64(after[name].Runtime-before[name].Runtime) / float64(runs)
			}
			fmt.Fprintf(stdout, "BENCH %s%s_hits_per_sec %.3f hits/s\n", prefix, name, float64(runs)/secs)
			fmt.Fprintf(stdout, "BENCH %s%s_ns_per_hit %.0f ns\n", prefix, name, nsPerHit)
		}
		// The workload's own launches the exact probe counted: none of the
		// ledgered one, every one of the bypassing one.
		if ledgered {
			fmt.Fprintf(stdout, "BENCH probes_ledgered_exact_launches_per_sec %.1f launches/s\n", float64(exact1-exact0)/secs)
			continue
		}
		if steps, err = settledSteps(out.String()); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "BENCH probes_bypass_exact_launches_per_sec %.1f launches/s\n", float64(exact1-exact0)/secs)
		fmt.Fprintf(stdout, "BENCH probes_bypass_launches_per_sec %.1f launches/s\n", steps*trainingKernels)
	}
	return nil
}

// exactLaunchesOf is what the agent's exact launch probe counted for the
// cgroup whose directory is dir (its id is the directory's inode).
func exactLaunchesOf(agent int, dir string) (uint64, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil {
		return 0, err
	}
	counts, err := probes.ProcessExactLaunches(agent)
	if err != nil {
		return 0, err
	}
	var n uint64
	for k, v := range counts {
		if k.Cgroup == st.Ino {
			n += v
		}
	}
	return n, nil
}

func mean(v []float64) float64 {
	var sum float64
	for _, x := range v {
		sum += x
	}
	return sum / float64(len(v))
}

// benchNice is the priority the probes bench runs at, itself and its
// workloads alike: ahead of whatever else runs on a shared machine, so its
// noise stays out of a figure that must resolve 2%, with the observer on an
// equal footing with the workloads it observes, as an agent would be.
const benchNice = -10

// raisePriority gives every thread of this process the bench priority (a
// nice value is per thread on Linux; threads made later inherit it).
func raisePriority() {
	tasks, _ := os.ReadDir("/proc/self/task")
	for _, t := range tasks {
		if tid, err := strconv.Atoi(t.Name()); err == nil {
			_ = syscall.Setpriority(syscall.PRIO_PROCESS, tid, benchNice)
		}
	}
}

// probeHitNS is the added cost of one launch with the launch probe attached.
func probeHitNS(m *simmachine.Machine, lib string, launches int) (float64, error) {
	p, err := probes.Open("", nil)
	if err != nil {
		return 0, err
	}
	defer p.Close()
	l, err := p.Attach(lib)
	if err != nil {
		return 0, err
	}
	defer l.Detach()
	var without, with []float64
	for i := 0; i < 3; i++ {
		ns, err := workloadFigure(m, "launch_ns", "--label", "plain", "--launch-cost", fmt.Sprint(launches))
		if err != nil {
			return 0, err
		}
		without = append(without, ns)
		if err := p.AttachLaunch(l); err != nil {
			return 0, err
		}
		ns, err = workloadFigure(m, "launch_ns", "--label", "probed", "--launch-cost", fmt.Sprint(launches))
		l.DetachLaunch()
		if err != nil {
			return 0, err
		}
		with = append(with, ns)
	}
	return median(with) - median(without), nil
}

// workloadFigure runs the workload and returns the value of its BENCH line
// whose name ends in figure.
func workloadFigure(m *simmachine.Machine, figure string, args ...string) (float64, error) {
	var stdout, stderr bytes.Buffer
	cmd := m.Workload(args...)
	// Ahead of other work on a shared machine (see raisePriority).
	if nice, err := exec.LookPath("nice"); err == nil {
		cmd.Args = append([]string{"nice", "-n", fmt.Sprint(benchNice)}, cmd.Args...)
		cmd.Path = nice
	}
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("workload %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	v, err := benchFigure(stdout.String(), figure)
	if err != nil {
		return 0, fmt.Errorf("workload %s: %w", strings.Join(args, " "), err)
	}
	return v, nil
}

// benchFigure is the value of the BENCH line in out whose name ends in figure.
func benchFigure(out, figure string) (float64, error) {
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 3 && f[0] == "BENCH" && strings.HasSuffix(f[1], "_"+figure) {
			return strconv.ParseFloat(f[2], 64)
		}
	}
	return 0, fmt.Errorf("no %s in %q", figure, out)
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
