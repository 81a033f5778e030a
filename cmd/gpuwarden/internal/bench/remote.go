package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gpuwarden/gpuwarden/cmd/gpuwarden/internal/simmachine"
	"github.com/gpuwarden/gpuwarden/enforcer/agentapi"
	"github.com/gpuwarden/gpuwarden/enforcer/hostcgroup"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/pki"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/session"
)

func init() { suites["remote"] = suite{order: 50, run: benchRemote} }

// Remote GPU budgets: remote throughput, bandwidth and launch rate as
// fractions of local (over veth, bandwidth on the same node), bandwidth
// over veth as a fraction of plain TCP's, and a synchronous call's round
// trip.
const (
	budgetKernel2ms      = 0.98
	budgetKernel200us    = 0.95
	budgetBandwidth      = 0.70 // on the same node
	budgetBandwidthTCP   = 0.60 // over veth, of plain TCP's
	budgetLaunchRate     = 0.80 // zero-length kernels, a sync every 1,000
	budgetRoundTripVeth  = 50.0 // µs
	budgetRoundTripLocal = 40.0 // µs, over loopback
	// The agents do no per-call work on the data path: under one read or
	// write of the GPU node's agent in 20 calls (its own background work
	// during the run is counted too).
	budgetAgentSyscallsPerCall = 0.05
	// ... and while bulk copies stream, under 5% of the session's CPU.
	budgetAgentCPUShare = 0.05
	remoteBenchAddr     = "10.231.0.1"
	remoteBenchClient   = "10.231.0.2"
	remoteBenchNetemUs  = 50
	remoteBenchTCPPort  = 7071 // gw-tcp's, beside the agent's 7070
)

// benchNet is one way to reach the GPU node: a network namespace to run
// the client in, the address it dials, and the session's data path.
type benchNet struct {
	name, netns, addr string
	relayed           bool   // --data-path relayed: through both agents
	link              string // the network's name, without the path
	local             string // --local-socket: the GPU node's own agent, no network
}

// relayedNet is n on the relayed data path.
func relayedNet(n benchNet) benchNet {
	return benchNet{name: n.name + "_relayed", netns: n.netns, addr: n.addr, relayed: true, link: n.name}
}

// benchRemote measures remote sessions against local containers on the
// same simulated GPU, side by side: the GPU node's agent (remote part on)
// in a network namespace of its own; clients over its loopback and over a
// veth pair from another namespace (and, where the kernel has sch_netem,
// the veth pair with 50 µs more round trip). Local runs are containers on
// the GPU node under the interposer.
func benchRemote(o options, stdout io.Writer) error {
	if os.Geteuid() != 0 {
		return errors.New("needs root (network namespaces and cgroups)")
	}
	m, err := simmachine.New(1, "16Gi")
	if err != nil {
		return err
	}
	defer m.Close()
	creds := filepath.Join(m.Dir, "pki")
	if err := benchCredentials(creds); err != nil {
		return err
	}
	server, err := newBenchNetNS()
	if err != nil {
		return err
	}
	defer server.close()
	client, err := newBenchNetNS()
	if err != nil {
		return err
	}
	defer client.close()
	if err := benchVeth(server, client); err != nil {
		return err
	}
	parent := fmt.Sprintf("gpuwarden-bench-remote-%d", os.Getpid())
	serverEnv := []string{
		// What is measured is the link: no probes, and no scheduler that
		// would share the GPU between the run measured and the sessions
		// and containers that just ended.
		"GPUWARDEN_EBPF_ENABLED=false", "GPUWARDEN_ENFORCEMENT_ENABLED=false",
		"GPUWARDEN_REMOTE_ENABLED=true", "GPUWARDEN_REMOTE_LISTEN=0.0.0.0:7070",
		"GPUWARDEN_REMOTE_CERT=" + filepath.Join(creds, "server.crt"), "GPUWARDEN_REMOTE_KEY=" + filepath.Join(creds, "server.key"),
		"GPUWARDEN_REMOTE_CA=" + filepath.Join(creds, "ca.crt"), "GPUWARDEN_REMOTE_CGROUP_PARENT=" + parent,
		"LD_LIBRARY_PATH=" + filepath.Join(m.Bin, "simgpu")}
	agent, _, err := m.StartAgentIn(server.path, "127.0.0.1:0", serverEnv...)
	if err != nil {
		return err
	}
	defer func() {
		if agent != nil {
			simmachine.StopProcess(agent)
		}
		if mnt, err := hostcgroup.Mount("/proc/self/mountinfo"); err == nil {
			_ = os.Remove(filepath.Join(mnt, parent))
		}
	}()

	loopback := benchNet{name: "loopback", netns: server.path, addr: "127.0.0.1", link: "loopback"}
	veth := benchNet{name: "veth", netns: client.path, addr: remoteBenchAddr, link: "veth"}
	// Sessions take the direct path by default; the relayed one, still
	// the fallback, is measured beside it on each network.
	// On the GPU node itself a session takes the worker's own socket.
	sameNode := benchNet{name: "same_node", netns: server.path, addr: "127.0.0.1", link: "loopback",
		local: filepath.Join(m.ControlDir(), session.LocalSocket)}
	nets := []benchNet{sameNode, loopback, veth, relayedNet(loopback), relayedNet(veth)}
	netem := exec.Command("nsenter", "--net="+client.path, "tc", "qdisc", "add", "dev", "gw1", "root", "netem",
		"delay", fmt.Sprintf("%dus", remoteBenchNetemUs))
	netemOut, netemErr := netem.CombinedOutput()
	if netemErr == nil {
		nets = append(nets, benchNet{name: "veth_netem50us", netns: client.path, addr: remoteBenchAddr, link: "veth_netem50us"})
	} else {
		fmt.Fprintf(os.Stderr, "gpuwarden bench: remote: no sch_netem in this kernel (%s): no row with added delay\n",
			strings.TrimSpace(string(netemOut)))
	}
	fmt.Fprintf(stdout, "BENCH remote_netem_available %d bool\n", b2i(netemErr == nil))
	// The netem qdisc sits on the client's end; the other rows go out
	// through it too unless it is off while they run.
	setNetem := func(on bool) {
		if netemErr != nil {
			return
		}
		op := "del"
		if on {
			op = "add"
		}
		_ = exec.Command("nsenter", "--net="+client.path, "tc", "qdisc", op, "dev", "gw1", "root", "netem",
			"delay", fmt.Sprintf("%dus", remoteBenchNetemUs)).Run()
	}
	setNetem(false)

	r := &remoteRunner{m: m, creds: creds, nets: nets, setNetem: setNetem, agentPID: agent.Process.Pid}
	secs := fmt.Sprint(o.seconds)
	for _, k := range []struct {
		name   string
		ns     int
		budget float64
	}{{"20us", 20000, 0}, {"200us", 200000, budgetKernel200us}, {"2ms", 2000000, budgetKernel2ms}} {
		f := figure{prog: "simgpu/workload", key: "workload_steps_per_sec", name: "kernel_" + k.name + "_steps_per_sec",
			unit: "steps/s", budget: k.budget, budgetNets: []string{"veth"},
			args: []string{"--alloc", "256Mi", "--seconds", secs, "--kernels", "8", "--kernel-ns", strconv.Itoa(k.ns)}}
		if _, err := r.compare(f, stdout); err != nil {
			return err
		}
	}
	// A training step's shape: host work before each launch, so launches
	// trickle out between the client's flushes, then a sync.
	train := figure{prog: "simgpu/workload", key: "workload_steps_per_sec", name: "train_steps_per_sec", unit: "steps/s",
		args: []string{"--alloc", "256Mi", "--seconds", secs, "--kernels", "16", "--kernel-ns", "200000", "--uneven", "--host-ns", "20000"}}
	if _, err := r.compare(train, stdout); err != nil {
		return err
	}
	// One synchronous call's round trip: cuCtxSynchronize on an idle
	// context, nothing queued before it. A time, not a rate: no ratio row.
	rt := figure{prog: "interposer/gw-remote", args: []string{"roundtrip", "2000"}, key: "sync_call_us",
		name: "sync_round_trip_us", unit: "us", transform: func(us float64) float64 { return us }}
	rtGot, err := r.compare(rt, stdout)
	if err != nil {
		return err
	}
	for net, most := range map[string]float64{"loopback": budgetRoundTripLocal, "veth": budgetRoundTripVeth} {
		fmt.Fprintf(stdout, "BENCH remote_%s_sync_round_trip_us_within_budget %d bool\n", net, b2i(rtGot[net] <= most))
	}
	// What the GPU node's agent does per synchronous call, and its share of
	// a session's CPU while bulk copies stream: nothing but its own
	// background work once it handed the session over, a relay's reads,
	// writes and CPU otherwise.
	for _, n := range r.nets {
		if n.name == "veth_netem50us" {
			continue
		}
		per, err := r.agentSyscallsPerCall(n)
		if err != nil {
			return err
		}
		share, err := r.agentCPUShareOfBulk(n)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "BENCH remote_%s_server_agent_syscalls_per_sync_call %.3f syscalls\n", n.name, per)
		fmt.Fprintf(stdout, "BENCH remote_%s_server_agent_cpu_share_of_bulk_copies %.3f ratio\n", n.name, share)
		if n.name == "veth" {
			fmt.Fprintf(stdout, "BENCH remote_veth_server_agent_syscalls_per_sync_call_within_budget %d bool\n",
				b2i(per < budgetAgentSyscallsPerCall))
			fmt.Fprintf(stdout, "BENCH remote_veth_server_agent_cpu_share_of_bulk_copies_within_budget %d bool\n",
				b2i(share < budgetAgentCPUShare))
		}
	}
	// Launches a second (zero-length kernels, a sync every 1,000) and
	// bandwidth, with gw-remote. simgpu's own launch costs next to
	// nothing, so the launch rate here is how three threads (the client,
	// the worker and simgpu's stream thread) share two CPUs; the rate the
	// budget holds is measured at the end, under the h200 model.
	got := map[string]map[string]float64{}
	launches := figure{prog: "interposer/gw-remote", args: []string{"launches", "200000"}, key: "launches_per_sec",
		name: "launches_per_sec", unit: "launches/s"}
	for _, f := range []figure{
		launches,
		{prog: "interposer/gw-remote", args: []string{"bandwidth", "64"}, key: "htod_mib_per_sec", name: "htod_mib_per_sec",
			unit: "MiB/s", budget: budgetBandwidth, budgetNets: []string{"same_node"}},
		{prog: "interposer/gw-remote", args: []string{"bandwidth", "64"}, key: "dtoh_mib_per_sec", name: "dtoh_mib_per_sec",
			unit: "MiB/s", budget: budgetBandwidth, budgetNets: []string{"same_node"}},
	} {
		if got[f.key], err = r.compare(f, stdout); err != nil {
			return err
		}
	}
	got["sync_call_us"] = rtGot
	if err := r.tcpCeiling(server, got, stdout); err != nil {
		return err
	}
	// Launches where a launch costs the host what NVIDIA's driver does
	// (simgpu's h200 model, its launch time measured on an H200): the GPU
	// node's agent starts again with the model, for the workers it runs.
	simmachine.StopProcess(agent)
	if agent, _, err = m.StartAgentIn(server.path, "127.0.0.1:0", append(serverEnv, "SIMGPU_MODEL=h200")...); err != nil {
		return err
	}
	r.agentPID, r.env = agent.Process.Pid, []string{"SIMGPU_MODEL=h200"}
	launches.name, launches.budget, launches.budgetNets = "h200_launches_per_sec", budgetLaunchRate, []string{"veth"}
	_, err = r.compare(launches, stdout)
	return err
}

// tcpCeiling measures plain TCP between two C programs (bin/interposer/gw-tcp)
// over each network, as the remote figures were, and prints each remote
// figure against it: what the link allows, beside what a session reaches.
func (r *remoteRunner) tcpCeiling(server *benchNetNS, remote map[string]map[string]float64, stdout io.Writer) error {
	serve := exec.Command("nsenter", "--net="+server.path, "--", filepath.Join(r.m.Bin, "interposer/gw-tcp"),
		"serve", "0.0.0.0:"+strconv.Itoa(remoteBenchTCPPort))
	out, err := serve.StdoutPipe()
	if err == nil {
		err = serve.Start()
	}
	if err != nil {
		return fmt.Errorf("gw-tcp serve: %w", err)
	}
	defer func() { _ = serve.Process.Kill(); _ = serve.Wait() }()
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || !strings.HasPrefix(line, "listening ") {
		return fmt.Errorf("gw-tcp serve did not listen (%q, %v)", line, err)
	}
	vals := map[string]map[string][]float64{}
	ktls := 0.0
	var links []benchNet
	for _, n := range r.nets {
		if n.name == n.link {
			links = append(links, n)
		}
	}
	for round := 0; round < benchRounds; round++ {
		for i := range links {
			n := links[(i+round)%len(links)]
			r.setNetem(n.name == "veth_netem50us")
			cmd := exec.Command("nsenter", "--net="+n.netns, "--", filepath.Join(r.m.Bin, "interposer/gw-tcp"),
				"client", n.addr+":"+strconv.Itoa(remoteBenchTCPPort), "2000", "64")
			got, err := benchLines(cmd)
			r.setNetem(false)
			if err != nil {
				return err
			}
			if vals[n.name] == nil {
				vals[n.name] = map[string][]float64{}
			}
			for k, v := range got {
				vals[n.name][k] = append(vals[n.name][k], v)
			}
			ktls = max(ktls, got["tcp_ktls_available"])
		}
	}
	// Kernel TLS would let the endpoints hold the encrypted socket themselves.
	fmt.Fprintf(stdout, "BENCH remote_ktls_available %d bool\n", int(ktls))
	// What one core of the endpoints' record layer seals and opens, on the
	// path this CPU takes (VAES where it has it) and on AES-NI alone.
	cipher, err := benchLines(exec.Command(filepath.Join(r.m.Bin, "interposer/gw-tlsrec"), "speed", "256"))
	if err != nil {
		return err
	}
	for _, row := range []struct{ key, unit string }{{"tls_record_wide_available", "bool"},
		{"tls_record_seal_mib_per_sec", "MiB/s"}, {"tls_record_open_mib_per_sec", "MiB/s"},
		{"tls_record_narrow_seal_mib_per_sec", "MiB/s"}, {"tls_record_narrow_open_mib_per_sec", "MiB/s"}} {
		fmt.Fprintf(stdout, "BENCH remote_%s %.0f %s\n", row.key, cipher[row.key], row.unit)
	}
	for _, n := range r.nets {
		if n.local != "" {
			continue // no network to compare with
		}
		med := func(k string) float64 { return interposerMedian(vals[n.link][k]) }
		rt, send, recv := med("tcp_round_trip_us"), med("tcp_send_mib_per_sec"), med("tcp_recv_mib_per_sec")
		if n.name == n.link {
			fmt.Fprintf(stdout, "BENCH tcp_ceiling_%s_round_trip_us %.2f us\n", n.name, rt)
			fmt.Fprintf(stdout, "BENCH tcp_ceiling_%s_send_mib_per_sec %.0f MiB/s\n", n.name, send)
			fmt.Fprintf(stdout, "BENCH tcp_ceiling_%s_recv_mib_per_sec %.0f MiB/s\n", n.name, recv)
		}
		fmt.Fprintf(stdout, "BENCH remote_%s_sync_round_trip_over_tcp_ceiling_us %.2f us\n", n.name,
			remote["sync_call_us"][n.name]-rt)
		fmt.Fprintf(stdout, "BENCH remote_%s_htod_vs_tcp_ceiling %.3f ratio\n", n.name, remote["htod_mib_per_sec"][n.name]/send)
		fmt.Fprintf(stdout, "BENCH remote_%s_dtoh_vs_tcp_ceiling %.3f ratio\n", n.name, remote["dtoh_mib_per_sec"][n.name]/recv)
		if n.name == "veth" {
			for _, d := range []struct {
				key     string
				ceiling float64
			}{{"htod", send}, {"dtoh", recv}} {
				fmt.Fprintf(stdout, "BENCH remote_veth_%s_vs_tcp_ceiling_within_budget %d bool\n", d.key,
					b2i(remote[d.key+"_mib_per_sec"]["veth"]/d.ceiling >= budgetBandwidthTCP))
			}
		}
	}
	return nil
}

// benchRounds: every figure is measured this many times, local and each
// network in turn (the order rotating), and the medians printed.
const benchRounds = 3

// figure is one BENCH figure measured locally and over each network.
type figure struct {
	prog       string   // relative to bin/
	args       []string // the program's
	key        string   // the program's BENCH line
	name, unit string
	transform  func(float64) float64 // nil: as printed
	budget     float64               // remote/local at least; 0: none
	budgetNets []string              // the networks the budget is stated for
}

// compare prints local_<name>, remote_<net>_<name>, their ratio (the
// median of the rounds' ratios) and, where a budget is stated,
// remote_<net>_<name>_within_budget; it returns the medians by "local" and
// network name.
func (r *remoteRunner) compare(f figure, stdout io.Writer) (map[string]float64, error) {
	vals := map[string][]float64{}
	ratios := map[string][]float64{}
	remotes := append([]string{unixDirect}, netNames(r.nets)...)
	order := append([]string{"local"}, remotes...)
	for round := 0; round < benchRounds; round++ {
		got := map[string]float64{}
		for i := range order {
			name := order[(i+round)%len(order)]
			var out map[string]float64
			var err error
			switch name {
			case "local":
				out, err = r.local(f.prog, f.args...)
			case unixDirect:
				out, err = r.direct(f.prog, f.args...)
			default:
				n := r.net(name)
				r.setNetem(n.name == "veth_netem50us")
				out, err = r.remote(n, f.prog, f.args...)
				r.setNetem(false)
			}
			if err != nil {
				time.Sleep(2 * time.Second) // for the agent to log how the session's worker ended
				log, _ := os.ReadFile(filepath.Join(r.m.Dir, "agent.log"))
				return nil, fmt.Errorf("%w\nthe agent's log ends:\n%s", err, agentapi.LogEnd(string(log)))
			}
			v, ok := out[f.key]
			if !ok || v <= 0 {
				return nil, fmt.Errorf("%s %v printed no %s", f.prog, f.args, f.key)
			}
			got[name] = v
			if f.transform != nil {
				v = f.transform(v)
			}
			vals[name] = append(vals[name], v)
		}
		for _, n := range remotes {
			ratios[n] = append(ratios[n], got[n]/got["local"]) // of the raw rates
		}
	}
	medians := map[string]float64{"local": interposerMedian(vals["local"])}
	fmt.Fprintf(stdout, "BENCH local_%s %.2f %s\n", f.name, medians["local"], f.unit)
	for _, n := range remotes {
		ratio := interposerMedian(ratios[n])
		medians[n] = interposerMedian(vals[n])
		fmt.Fprintf(stdout, "BENCH remote_%s_%s %.2f %s\n", n, f.name, medians[n], f.unit)
		if f.transform == nil {
			fmt.Fprintf(stdout, "BENCH remote_%s_%s_ratio %.3f ratio\n", n, f.name, ratio)
		}
		if f.budget > 0 && slices.Contains(f.budgetNets, n) {
			fmt.Fprintf(stdout, "BENCH remote_%s_%s_within_budget %d bool\n", n, f.name, b2i(ratio >= f.budget))
		}
	}
	return medians, nil
}

func netNames(nets []benchNet) []string {
	var out []string
	for _, n := range nets {
		out = append(out, n.name)
	}
	return out
}

func benchCredentials(dir string) error {
	if err := pki.CreateCA(dir, "bench CA", 24*time.Hour); err != nil {
		return err
	}
	if err := pki.Issue(dir, dir, pki.Request{Name: "server", Hosts: []string{"127.0.0.1", remoteBenchAddr}, Validity: 24 * time.Hour}); err != nil {
		return err
	}
	return pki.Issue(dir, dir, pki.Request{Name: "client", Validity: 24 * time.Hour,
		Client: &pki.Identity{Namespace: "bench", Pod: "bench", Container: "bench"}})
}

// remoteRunner runs a program of bin/simgpu locally (a container on the GPU
// node) or through `gpuwarden run --remote`, and reads its BENCH lines.
type remoteRunner struct {
	m        *simmachine.Machine
	creds    string
	nets     []benchNet
	setNetem func(on bool)
	agentPID int      // the GPU node's agent
	env      []string // simgpu's settings for the local runs and the workers the bench starts
}

func (r *remoteRunner) net(name string) benchNet {
	for _, n := range r.nets {
		if n.name == name {
			return n
		}
	}
	return benchNet{}
}

func (r *remoteRunner) local(prog string, args ...string) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), benchRunTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(r.m.Bin, prog), args...)
	cmd.Env = append(append(r.m.Env(), r.env...), "LD_PRELOAD="+filepath.Join(r.m.Bin, "libgpuwarden.so"),
		"GPUWARDEN_CONTROL_DIR="+r.m.ControlDir(), "GPUWARDEN_MEMORY_LIMIT=8Gi")
	return benchLines(cmd)
}

func (r *remoteRunner) remote(n benchNet, prog string, args ...string) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), benchRunTimeout)
	defer cancel()
	return benchLines(r.remoteCmd(ctx, n, prog, args...))
}

// remoteCmd is prog run on the client node through `gpuwarden run`, a
// session over n.
func (r *remoteRunner) remoteCmd(ctx context.Context, n benchNet, prog string, args ...string) *exec.Cmd {
	all := []string{"--net=" + n.netns, "--", filepath.Join(r.m.Bin, "gpuwarden"), "run", "--remote", n.addr,
		"--memory", "0.5", "--cert", filepath.Join(r.creds, "client.crt"), "--key", filepath.Join(r.creds, "client.key"),
		"--ca", filepath.Join(r.creds, "ca.crt"), "--data-path", dataPath(n.relayed)}
	if n.local != "" {
		all = append(all, "--local-socket", n.local)
	}
	all = append(all, "--", filepath.Join(r.m.Bin, prog))
	cmd := exec.CommandContext(ctx, "nsenter", append(all, args...)...) // nsenter runs `gpuwarden run` in its place
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}                     // a client node: no simgpu, no driver
	return cmd
}

// agentCPUShareOfBulk runs a session copying a buffer of few and one of
// many MiB (gw-remote bandwidth) and returns the GPU node's agent's CPU time
// over the sessions' (the worker's, which the agent reaps, and the client
// side's: the program and `gpuwarden run`) between the two, so what a
// session's start costs cancels out.
func (r *remoteRunner) agentCPUShareOfBulk(n benchNet) (float64, error) {
	const few, many = 16, 256
	measure := func(mib int) (agent, session time.Duration, err error) {
		own0, err := cpuTime(r.agentPID)
		if err != nil {
			return 0, 0, err
		}
		reaped0, err := reapedCPUTime(r.agentPID)
		if err != nil {
			return 0, 0, err
		}
		ctx, cancel := context.WithTimeout(context.Background(), benchRunTimeout)
		defer cancel()
		cmd := r.remoteCmd(ctx, n, "interposer/gw-remote", "bandwidth", strconv.Itoa(mib))
		if _, err := benchLines(cmd); err != nil {
			return 0, 0, err
		}
		client := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
		reaped := reaped0
		for deadline := time.Now().Add(5 * time.Second); reaped == reaped0 && time.Now().Before(deadline); {
			time.Sleep(20 * time.Millisecond) // the worker ends with its session, and the agent reaps it
			if reaped, err = reapedCPUTime(r.agentPID); err != nil {
				return 0, 0, err
			}
		}
		own, err := cpuTime(r.agentPID)
		return own - own0, reaped - reaped0 + client, err
	}
	agentFew, sessionFew, err := measure(few)
	if err != nil {
		return 0, err
	}
	agentMany, sessionMany, err := measure(many)
	if err != nil {
		return 0, err
	}
	if sessionMany <= sessionFew {
		return 0, fmt.Errorf("a session of %d MiB of copies took no more CPU than one of %d MiB", many, few)
	}
	return max(float64(agentMany-agentFew), 0) / float64(sessionMany-sessionFew), nil
}

// agentSyscallsPerCall runs a session of n of few and one of many
// synchronous calls and returns the GPU node's agent's reads and writes
// (syscr, syscw of its threads) per call between the two, so what a
// session's start costs cancels out.
func (r *remoteRunner) agentSyscallsPerCall(n benchNet) (float64, error) {
	const few, many = 200, 2200
	count := func(calls int) (uint64, error) {
		before, err := procIOCalls(r.agentPID)
		if err != nil {
			return 0, err
		}
		if _, err := r.remote(n, "interposer/gw-remote", "roundtrip", strconv.Itoa(calls)); err != nil {
			return 0, err
		}
		after, err := procIOCalls(r.agentPID)
		return max(after, before) - before, err // a thread that ended takes its counts along
	}
	a, err := count(few)
	if err != nil {
		return 0, err
	}
	b, err := count(many)
	if err != nil {
		return 0, err
	}
	return max(float64(b)-float64(a), 0) / (many - few), nil
}

// procIOCalls is a process's read and write system calls so far, its own
// threads' alone: /proc/PID/io also counts the children it reaped (a
// session's worker).
func procIOCalls(pid int) (uint64, error) {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/io", pid))
	if err != nil || len(tasks) == 0 {
		return 0, fmt.Errorf("the threads of process %d: %v", pid, err)
	}
	var sum uint64
	for _, task := range tasks {
		b, err := os.ReadFile(task)
		if err != nil {
			continue // a thread that ended
		}
		for _, line := range strings.Split(string(b), "\n") {
			k, v, ok := strings.Cut(line, ": ")
			if ok && (k == "syscr" || k == "syscw") {
				n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
				if err != nil {
					return 0, fmt.Errorf("%s: %s: %w", task, k, err)
				}
				sum += n
			}
		}
	}
	return sum, nil
}

func dataPath(relayed bool) string {
	if relayed {
		return session.PathRelayed
	}
	return session.PathDirect
}

// unixDirect is the remote path without relays: the client library
// straight to a worker over a unix socket, no TLS, no agent between. What a
// session on the GPU node's own machine would reach if the agents stepped
// off its data path, and so what the two relays cost beside it.
const unixDirect = "unix_direct"

// direct runs prog on the client library against a worker of its own on
// the GPU node, as the server starts one (under the interposer), joined
// by a unix socket.
func (r *remoteRunner) direct(prog string, args ...string) (map[string]float64, error) {
	dir, err := os.MkdirTemp("", "gwb") // short: a socket path has 108 bytes
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "s")
	ctx, cancel := context.WithTimeout(context.Background(), benchRunTimeout)
	defer cancel()
	w := exec.CommandContext(ctx, filepath.Join(r.m.Bin, "gpuwarden-worker"), "--listen", sock)
	w.Env = append(append(r.m.Env(), r.env...), "LD_LIBRARY_PATH="+filepath.Join(r.m.Bin, "simgpu"),
		"LD_PRELOAD="+filepath.Join(r.m.Bin, "libgpuwarden.so"), "GPUWARDEN_CONTROL_DIR="+r.m.ControlDir(),
		"GPUWARDEN_MEMORY_LIMIT=8Gi")
	var werr bytes.Buffer
	w.Stderr = &werr
	if err := w.Start(); err != nil {
		return nil, fmt.Errorf("gpuwarden-worker: %w", err)
	}
	defer func() { _ = w.Process.Kill(); _ = w.Wait() }()
	for i := 0; ; i++ { // the socket appears once the worker listens
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if i == 500 {
			return nil, fmt.Errorf("gpuwarden-worker made no socket in 5s: %s", werr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cmd := exec.CommandContext(ctx, filepath.Join(r.m.Bin, prog), args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "GPUWARDEN_REMOTE=unix:" + sock,
		"LD_LIBRARY_PATH=" + filepath.Join(r.m.Bin, "remote")}
	return benchLines(cmd)
}

// benchRunTimeout bounds one run: a session whose worker is frozen (by a
// breach action, say) waits as long as the freeze, as a container would.
const benchRunTimeout = 2 * time.Minute

// benchLines runs cmd and returns its BENCH figures by name.
func benchLines(cmd *exec.Cmd) (map[string]float64, error) {
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s: %w: %s", strings.Join(cmd.Args, " "), err, errb.String())
	}
	got := map[string]float64{}
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 3 && f[0] == "BENCH" {
			if v, err := strconv.ParseFloat(f[2], 64); err == nil {
				got[f[1]] = v
			}
		}
	}
	if len(got) == 0 {
		return nil, fmt.Errorf("%s printed no BENCH line: %s", strings.Join(cmd.Args, " "), out.String())
	}
	return got, nil
}

// benchNetNS is a network namespace held by a sleeping process.
type benchNetNS struct {
	path string
	hold *exec.Cmd
}

func newBenchNetNS() (*benchNetNS, error) {
	hold := exec.Command("unshare", "--net", "sh", "-c", "ip link set lo up && echo up && exec sleep infinity")
	out, err := hold.StdoutPipe()
	if err == nil {
		err = hold.Start()
	}
	if err != nil {
		return nil, fmt.Errorf("unshare --net: %w", err)
	}
	n := &benchNetNS{path: fmt.Sprintf("/proc/%d/ns/net", hold.Process.Pid), hold: hold}
	// Ready once the holder says so, from inside the namespace.
	b := make([]byte, 2)
	if _, err := io.ReadFull(out, b); err != nil || string(b) != "up" {
		n.close()
		return nil, fmt.Errorf("unshare --net: the namespace's loopback did not come up (%v)", err)
	}
	return n, nil
}

func (n *benchNetNS) run(args ...string) error {
	out, err := exec.Command("nsenter", append([]string{"--net=" + n.path, "--"}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

func (n *benchNetNS) close() { _ = n.hold.Process.Kill(); _ = n.hold.Wait() }

// benchVeth joins the server's namespace (gw0, 10.231.0.1) and the
// client's (gw1, 10.231.0.2).
func benchVeth(server, client *benchNetNS) error {
	for _, step := range []struct {
		ns   *benchNetNS
		args []string
	}{
		{server, []string{"ip", "link", "add", "gw0", "type", "veth", "peer", "name", "gw1", "netns", client.path}},
		{server, []string{"ip", "addr", "add", remoteBenchAddr + "/24", "dev", "gw0"}},
		{server, []string{"ip", "link", "set", "gw0", "up"}},
		{client, []string{"ip", "addr", "add", remoteBenchClient + "/24", "dev", "gw1"}},
		{client, []string{"ip", "link", "set", "gw1", "up"}},
	} {
		if err := step.ns.run(step.args...); err != nil {
			return err
		}
	}
	return nil
}
