package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/gpuwarden/gpuwarden/enforcer/agentapi"

	"github.com/gpuwarden/gpuwarden/collector"
	"github.com/gpuwarden/gpuwarden/collector/cgroups"
	"github.com/gpuwarden/gpuwarden/collector/ledgertrust"
	"github.com/gpuwarden/gpuwarden/enforcer/hostcgroup"
	"github.com/gpuwarden/gpuwarden/enforcer/nvmldev"
)

// localView reads what smi can see without the agent: the interposer's
// ledgers and limits in the control directory, and NVML. It runs the
// agent's own collector over those two sources, so the figures are joined
// exactly as the agent joins them; what is missing is the eBPF view.
type localView struct {
	coll  *collector.Collector
	nvml  *nvmldev.Reader
	notes []string
}

// openLocal opens the sources there are. It fails only when there is none:
// no control directory and no NVML.
func openLocal(controlDir, nvmlLibrary string) (*localView, error) {
	l := &localView{}
	src := collector.Sources{ProcRoot: "/proc"}
	var missing []string

	dirErr := checkControlDir(controlDir)
	if dirErr == nil {
		src.ControlDir = controlDir
	} else {
		missing = append(missing, dirErr.Error())
	}
	if r, err := nvmldev.Open(nvmlLibrary); err == nil {
		l.nvml = r
		src.NVML = r.Devices
	} else {
		missing = append(missing, "NVML: "+err.Error())
	}
	if len(missing) == 2 {
		return nil, errors.New(strings.Join(missing, "; "))
	}
	if dirErr != nil {
		l.notes = append(l.notes, fmt.Sprintf("%v: no container runs under the interposer here, or the control blocks are elsewhere (--control-dir).", dirErr))
	}
	if l.nvml == nil {
		l.notes = append(l.notes, missing[len(missing)-1]+": no device totals, utilization or processes.")
	}

	if root, err := hostcgroup.Mount("/proc/self/mountinfo"); err == nil {
		src.Cgroups = cgroups.NewResolver(root)
		src.Claims = ledgertrust.NewVerifier(src.Cgroups, root, src.ProcRoot)
	} else {
		l.notes = append(l.notes, fmt.Sprintf("cgroup v2 not found (%v): the control blocks cannot be checked against their cgroups and are not shown.", err))
	}
	l.notes = append(l.notes, "without the agent there is no eBPF view: a container that bypasses the interposer is not detected "+
		"unless NVML lists its processes, memory is NVML's or the interposer's figure (context reserve included), "+
		"and compute limits are only those the containers asked for.")

	node, _ := os.Hostname()
	l.coll = collector.New(node, version, src, slog.New(slog.DiscardHandler))
	return l, nil
}

func checkControlDir(dir string) error {
	st, err := os.Stat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("no control directory %s", dir)
	case err != nil:
		return fmt.Errorf("control directory: %w", err)
	case !st.IsDir():
		return fmt.Errorf("control directory %s is not a directory", dir)
	}
	return nil
}

func (l *localView) view(ctx context.Context) *smiView {
	cv := l.coll.View(ctx)
	v := &smiView{Node: cv.Node, Time: cv.Time, Source: "local", Devices: cv.Devices, Containers: cv.Containers,
		Sources: cv.Sources, Notes: append([]string(nil), l.notes...)}
	if v.Devices == nil {
		v.Devices = []agentapi.Device{}
	}
	if v.Containers == nil {
		v.Containers = []agentapi.ContainerDevice{}
	}
	for _, s := range cv.Sources {
		if !s.OK {
			v.Notes = append(v.Notes, fmt.Sprintf("reading %s failed: %s", s.Name, s.Error))
		}
	}
	return v
}

func (l *localView) close() {
	if l.nvml != nil {
		_ = l.nvml.Close()
	}
}
