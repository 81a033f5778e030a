package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/agentapi"

	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

// Bounds for an agent under attack, wide for a loaded machine: a scrape
// takes milliseconds, so 5 s is a hang; a healthy agent holds tens of MiB;
// a stop takes seconds (detaching uprobes is slow on a busy machine), and
// a hung one never ends.
const (
	scrapeBound = 5 * time.Second
	rssBound    = 400 << 20
	stopBound   = 60 * time.Second
)

// hostileLedger leaves a hostile `usage` in the agent's control directory
// and returns the directory the agent must report as bad.
type hostileLedger func(t *testing.T, m *simtest.Machine, agent *simtest.Agent) string

// plantedDir makes a container directory holding what plant makes `usage`.
func plantedDir(plant func(usage string) error) hostileLedger {
	return func(t *testing.T, _ *simtest.Machine, agent *simtest.Agent) string {
		dir := "hostile-" + strconv.FormatInt(time.Now().UnixNano(), 36)
		if err := os.MkdirAll(filepath.Join(agent.ControlDir, dir), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := plant(controlblock.UsagePath(agent.ControlDir, dir)); err != nil {
			t.Fatal(err)
		}
		return dir
	}
}

// truncatedWhileMapped truncates, from inside its cgroup, the ledger of a
// container the enforcer has mapped.
func truncatedWhileMapped(t *testing.T, m *simtest.Machine, agent *simtest.Agent) string {
	cg := startEnforced(t, m, agent, "truncated")
	simtest.Eventually(t, 15*time.Second, func() error { // under the scheduler, its ledger mapped
		if e, _ := entry(t, agent, cg); e.ComputeLimit == 0 {
			return fmt.Errorf("%s has no target yet", cg.Rel)
		}
		return nil
	})
	dir := controlblock.ContainerKey(cg.Rel)
	out, err := cg.Place(exec.Command("truncate", "-s", "0", controlblock.UsagePath(agent.ControlDir, dir))).CombinedOutput()
	if err != nil {
		t.Fatalf("truncate from inside the container: %v: %s", err, out)
	}
	return dir
}

// TestAttackHostileLedgers: whatever containers leave as their ledgers,
// all at once, the agent stays up, serves /metrics promptly, reports the
// other containers as before, names each bad ledger, stays small, and
// stops on SIGTERM.
func TestAttackHostileLedgers(t *testing.T) {
	simtest.RequirePrivileged(t, "eBPF, cgroups and mknod")
	m := simtest.NewMachine(t, 1, "16Gi")
	agent := simtest.StartAgent(t, m)
	good := startEnforced(t, m, agent, "good")
	bad := map[string]string{} // dir by kind
	for _, tc := range []struct {
		name  string
		plant hostileLedger
	}{
		{"truncated while mapped", truncatedWhileMapped},
		{"FIFO", plantedDir(func(p string) error { return syscall.Mkfifo(p, 0o666) })},
		{"symlink to /dev/zero", plantedDir(func(p string) error { return os.Symlink("/dev/zero", p) })},
		{"device node", plantedDir(func(p string) error { return syscall.Mknod(p, syscall.S_IFCHR|0o666, 1<<8|5) })},
		{"directory", plantedDir(func(p string) error { return os.Mkdir(p, 0o755) })},
		{"huge file", plantedDir(func(p string) error {
			if err := os.WriteFile(p, nil, 0o666); err != nil {
				return err
			}
			return os.Truncate(p, 1<<40) // sparse: 1 TiB that costs nothing to make
		})},
	} {
		bad[tc.name] = tc.plant(t, m, agent)
	}

	// Several discovery rounds and scheduler ticks over the bad ledgers,
	// every scrape answered in time.
	for range 10 {
		if _, err := getWithin(agent, "/metrics", scrapeBound); err != nil {
			t.Fatalf("/metrics under attack: %v", err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if rss := agentRSS(t, agent); rss > rssBound {
		t.Errorf("agent RSS %d MiB under attack, bound %d MiB", rss>>20, rssBound>>20)
	}
	simtest.Eventually(t, 10*time.Second, func() error {
		resp, err := containersWithin(agent, scrapeBound)
		if err != nil {
			return err
		}
		return listsMemory(resp, good, 1<<30)
	})
	for kind, dir := range bad {
		if err := waitBadLedger(agent, dir, 20*time.Second); err != nil {
			t.Errorf("%s: %v", kind, err)
		}
	}
	if b, err := getWithin(agent, "/healthz", scrapeBound); err != nil || strings.TrimSpace(string(b)) != "ok" {
		t.Errorf("/healthz: %q %v", b, err)
	}
	stopWithin(t, agent, syscall.SIGTERM, stopBound)
}

// getWithin fetches path, failing after bound (a hung agent, not a slow one).
func getWithin(agent *simtest.Agent, path string, bound time.Duration) ([]byte, error) {
	c := http.Client{Timeout: bound}
	resp, err := c.Get("http://" + agent.Addr + path)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return b, err
}

func containersWithin(agent *simtest.Agent, bound time.Duration) (agentapi.ContainersResponse, error) {
	var resp agentapi.ContainersResponse
	b, err := getWithin(agent, "/api/v1/containers", bound)
	if err == nil {
		err = json.Unmarshal(b, &resp)
	}
	return resp, err
}

// waitBadLedger waits for the API to name dir's ledger as bad.
func waitBadLedger(agent *simtest.Agent, dir string, within time.Duration) error {
	var resp agentapi.ContainersResponse
	var err error
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		if resp, err = containersWithin(agent, scrapeBound); err != nil {
			continue
		}
		for _, b := range resp.BadLedgers {
			if b.Dir == dir {
				return nil
			}
		}
	}
	return fmt.Errorf("bad ledger %s not reported within %v (%v): %+v", dir, within, err, resp.BadLedgers)
}

func listsMemory(resp agentapi.ContainersResponse, cg *simtest.Cgroup, want uint64) error {
	for _, c := range resp.Containers {
		if c.CgroupID == cg.ID && c.GPU == 0 {
			if c.MemoryUsedBytes != want || !c.Enforced {
				return fmt.Errorf("%s: used %d enforced %v, want %d enforced", cg.Rel, c.MemoryUsedBytes, c.Enforced, want)
			}
			return nil
		}
	}
	return fmt.Errorf("%s is not listed", cg.Rel)
}

// agentRSS reads the agent's resident memory.
func agentRSS(t *testing.T, agent *simtest.Agent) uint64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", agent.Proc.Cmd.Process.Pid))
	if err != nil {
		t.Fatalf("agent status: %v (did it die?)", err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	t.Fatal("agent status has no VmRSS")
	return 0
}

// stopWithin signals the agent and fails the test unless it exits cleanly
// in time.
func stopWithin(t *testing.T, agent *simtest.Agent, sig syscall.Signal, bound time.Duration) {
	t.Helper()
	cmd := agent.Proc.Cmd
	if cmd.ProcessState != nil {
		t.Fatalf("the agent had already exited: %v", cmd.ProcessState)
	}
	if err := cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("agent exited on %v: %v", sig, err)
		}
	case <-time.After(bound):
		_ = cmd.Process.Kill()
		<-done
		t.Errorf("agent did not stop within %v of %v", bound, sig)
	}
}
