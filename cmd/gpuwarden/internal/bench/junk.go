package bench

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/gpuwarden/gpuwarden/cmd/gpuwarden/internal/simmachine"
	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
)

func init() { suites["junk"] = suite{order: 45, run: benchJunk} }

const benchJunkDirs = 3000

// benchJunk measures what control directories of junk cost the enforcing
// agent between scrapes: 3,000 directories a hostile container could make
// off Kubernetes, each with a valid ledger whose claim is refused (it
// names a real container's cgroup from a directory that is not that
// container's). The same agent, idle, before they appear and once they
// have been there for half a minute (refused directories are looked at
// again after a wait that grows while they stay refused).
func benchJunk(o options, stdout io.Writer) error {
	if os.Geteuid() != 0 {
		return errors.New("needs root (cgroups and eBPF)")
	}
	m, err := simmachine.New(1, "16Gi")
	if err != nil {
		return err
	}
	defer m.Close()
	ctl := m.ControlDir()
	rels, stop, err := benchContainersOn(m, 1)
	defer stop()
	if err != nil {
		return err
	}
	agent, _, err := m.StartAgent("127.0.0.1:0")
	if err != nil {
		return err
	}
	defer simmachine.StopProcess(agent)
	idle := func(settle time.Duration) (float64, error) {
		time.Sleep(settle)
		d, err := cpuOver(agent.Process.Pid, benchIdleWindow, nil)
		return d.Seconds() / benchIdleWindow.Seconds() * 100, err
	}
	before, err := idle(3 * time.Second)
	if err != nil {
		return err
	}
	tmpl, err := os.ReadFile(controlblock.UsagePath(ctl, controlblock.ContainerKey(rels[0])))
	if err != nil {
		return err
	}
	for i := range benchJunkDirs {
		dir := filepath.Join(ctl, fmt.Sprintf("junk-%04d", i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "usage"), tmpl, 0o666); err != nil {
			return err
		}
	}
	after, err := idle(30 * time.Second)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "BENCH agent_junk_dirs_idle_core_percent_0 %.2f percent\n", before)
	fmt.Fprintf(stdout, "BENCH agent_junk_dirs_idle_core_percent_%d %.2f percent\n", benchJunkDirs, after)
	return nil
}
