package gpucheck

import (
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/agentapi"
)

// checkProbes is part 3: the agent's uprobes on the driver the machine
// really has, with cuda-alloc (no interposer) in two cgroups. The bytes
// the agent attributes to each cgroup must be what each allocated, a failed
// allocation must arrive, and launches must be counted.
func checkProbes(ctx context.Context, e *env, r *Result) {
	if os.Geteuid() != 0 {
		r.Fail("root", "eBPF and cgroups need root")
		return
	}
	// Launch probes attached for good, so the count is exact.
	a, err := e.startAgent(ctx, e.newDir("control"), "GPUWARDEN_EBPF_LAUNCH_PERIOD=1s", "GPUWARDEN_EBPF_LAUNCH_WINDOW=1s",
		"GPUWARDEN_EBPF_SCAN_INTERVAL=200ms", "GPUWARDEN_ENFORCEMENT_ENABLED=false")
	if err != nil {
		r.Fail("agent", "%v", err)
		return
	}
	defer a.stopFor(r)
	want := map[string]uint64{"probe-a": 3 * gib / 2, "probe-b": 3 * gib}
	procs := map[string]*steered{}
	cgs := map[string]*cgroup{}
	for _, name := range []string{"probe-a", "probe-b"} {
		cg, err := e.cgroup(name)
		if err != nil {
			r.Fail("cgroups", "%v", err)
			return
		}
		p, err := e.startSteered(ctx, e.baseEnv(), cg)
		if err != nil {
			r.Fail("cuda-alloc in "+name, "%v", err)
			return
		}
		defer p.quit()
		procs[name], cgs[name] = p, cg
		if got := p.do("ctx 0"); got != "ok" {
			r.Fail("cuda-alloc in "+name, "ctx 0: %s", got)
			return
		}
	}
	for _, cmd := range []struct{ who, line string }{
		{"probe-a", fmt.Sprintf("alloc linear %d", gib)},
		{"probe-a", fmt.Sprintf("alloc linear %d", gib/2)},
		{"probe-b", fmt.Sprintf("alloc linear %d", 3*gib)},
	} {
		if got := procs[cmd.who].do(cmd.line); !strings.HasPrefix(got, "ok") {
			r.Fail("allocations", "%s: %s: %s", cmd.who, cmd.line, got)
			return
		}
	}
	for _, name := range []string{"probe-a", "probe-b"} {
		var seen agentapi.ContainerDevice
		err := waitFor(ctx, 20*time.Second, func() error {
			c, err := a.container(cgs[name])
			seen = c
			if err == nil && (c.MemorySource != "ebpf" || c.MemoryUsedBytes != want[name]) {
				err = fmt.Errorf("not yet")
			}
			return err
		})
		r.Expect(err == nil, "bytes in "+name, "agent saw %s from %q (allocated %s)%s", bytesText(seen.MemoryUsedBytes), seen.MemorySource,
			bytesText(want[name]), errText(err, a))
	}
	got := procs["probe-b"].do(fmt.Sprintf("alloc linear %d", uint64(1)<<50))
	var fails uint64
	err = waitFor(ctx, 20*time.Second, func() error {
		c, err := a.container(cgs["probe-b"])
		fails = c.AllocFailuresDevice
		if err == nil && fails == 0 {
			err = fmt.Errorf("no failure counted yet")
		}
		return err
	})
	r.Expect(got == "err 2" && err == nil, "failed allocation", "1 PiB asked in probe-b: %s; agent counted %d device failure(s)%s", got, fails, errText(err, a))

	got = procs["probe-a"].do("launchfor 2000")
	n, _ := strconv.ParseFloat(strings.TrimPrefix(got, "ok "), 64)
	var counted float64
	err = waitFor(ctx, 20*time.Second, func() error {
		c, err := a.container(cgs["probe-a"])
		counted = c.Launches
		if err == nil && (n == 0 || math.Abs(counted-n) > n/100) {
			err = fmt.Errorf("counted %.0f of %.0f", counted, n)
		}
		return err
	})
	r.Expect(err == nil, "launches", "probe-a launched for 2 s: %s; agent counted %.0f%s", got, counted, errText(err, a))
	r.Bench("probes_launches_counted_ratio", counted/math.Max(n, 1), "ratio")
}

// container is the agent's view of the container in cg.
func (a *agent) container(cg *cgroup) (agentapi.ContainerDevice, error) {
	cs, errs, _, err := a.containers([]*cgroup{cg})
	if err == nil {
		err = errs[0]
	}
	return cs[0], err
}

// containers is the agent's view of the containers in cgs, from one read
// of its API: each one's, or why it is not listed, and when the view was
// taken.
func (a *agent) containers(cgs []*cgroup) ([]agentapi.ContainerDevice, []error, time.Time, error) {
	out, errs := make([]agentapi.ContainerDevice, len(cgs)), make([]error, len(cgs))
	var resp agentapi.ContainersResponse
	if err := a.get("/api/v1/containers", &resp); err != nil {
		return out, errs, time.Time{}, err
	}
	for i, cg := range cgs {
		j := slices.IndexFunc(resp.Containers, func(c agentapi.ContainerDevice) bool { return c.CgroupPath == cg.rel })
		if j < 0 {
			errs[i] = fmt.Errorf("the agent does not list %s", cg.rel)
			continue
		}
		out[i] = resp.Containers[j]
	}
	return out, errs, resp.Time, nil
}

// errText explains a wait that ran out, with the end of the agent's log.
func errText(err error, a *agent) string {
	if err == nil {
		return ""
	}
	return fmt.Sprintf(" (%v; agent log: %s)", err, a.tail())
}
