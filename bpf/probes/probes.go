// Package probes loads gpuwarden's eBPF programs, keeps their maps pinned so
// that the state survives an agent restart, attaches them to libcuda files,
// and reads what they recorded.
//
// It knows nothing about which libraries to attach to (package libcuda finds
// them) nor when (package observe decides): it does one thing, the kernel side.
package probes

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
)

// DefaultPinDir is where the maps are pinned unless configured otherwise.
const DefaultPinDir = "/sys/fs/bpf/gpuwarden"

// Probes is the loaded collection: its programs, its (pinned) maps and the
// process-exit tracepoints. Attach libraries with Attach.
type Probes struct {
	objs   gpuwardenObjects
	pinDir string
	log    *slog.Logger
	exits  []link.Link
	// mapping names the processes whose mappings change (Changed); nil
	// where the kernel has not the tracepoint.
	mapping link.Link
	// exact: the kernel has uprobe-multi links, so launches can be counted
	// process by process (AttachExact).
	exact bool
}

// Open loads the programs and maps. With pinDir set, maps are pinned there
// (under an existing bpffs mount) and maps already pinned by an earlier
// agent are reused when their layout matches; otherwise they are replaced.
// With pinDir empty nothing is pinned. The errors name what is missing
// (ErrPermission, ErrNoBPFFS, ErrNoUprobes, ErrKernel).
func Open(pinDir string, log *slog.Logger) (*Probes, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// Check what the kernel and our privileges allow, naming what is missing.
	if runtime.GOARCH != "amd64" {
		return nil, fmt.Errorf("eBPF probes are built for amd64 registers, not %s: %w", runtime.GOARCH, ErrKernel)
	}
	if err := checkPrivileges(); err != nil {
		return nil, err
	}
	if err := checkUprobes(); err != nil {
		return nil, err
	}
	if pinDir != "" {
		if err := preparePinDir(pinDir); err != nil {
			return nil, err
		}
	}
	// Kernels before 5.11 charge eBPF memory to RLIMIT_MEMLOCK.
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("remove memlock limit: %w: %w", err, ErrPermission)
	}

	// Load, reusing compatible pinned maps; replace them if they do not fit.
	spec, err := loadGpuwarden()
	if err != nil {
		return nil, fmt.Errorf("read embedded eBPF object: %w", err)
	}
	p := &Probes{pinDir: pinDir, log: log}
	if pinDir != "" {
		if err := checkLayout(spec, pinDir, log); err != nil {
			return nil, err
		}
	} else {
		for _, m := range spec.Maps {
			m.Pinning = ebpf.PinNone
		}
	}
	// Without uprobe-multi links (before Linux 6.6) the kernel refuses a
	// program of that attach type: it is loaded as a plain uprobe and never
	// attached, and every process's launches are sampled.
	p.exact = features.HaveBPFLinkUprobeMulti() == nil
	if !p.exact {
		spec.Programs["launch_exact"].AttachType = ebpf.AttachNone
	}
	opts := &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: pinDir}}
	err = spec.LoadAndAssign(&p.objs, opts)
	if errors.Is(err, ebpf.ErrMapIncompatible) && pinDir != "" {
		log.Warn("pinned eBPF maps do not match this agent's layout; replacing them", "dir", pinDir, "err", err)
		if err := unpinAll(spec, pinDir); err != nil {
			return nil, err
		}
		err = spec.LoadAndAssign(&p.objs, opts)
	}
	if err != nil {
		return nil, explainLoad(err)
	}
	if pinDir != "" {
		if err := writeLayout(spec, pinDir); err != nil {
			p.objs.Close()
			return nil, err
		}
	}

	// Process exit and exec take what a process held out of the live view.
	for _, tp := range []struct {
		name string
		prog *ebpf.Program
	}{{"sched_process_exit", p.objs.OnExit}, {"sched_process_exec", p.objs.OnExec}} {
		l, err := link.AttachRawTracepoint(link.RawTracepointOptions{Name: tp.name, Program: tp.prog})
		if err != nil {
			p.Close()
			return nil, fmt.Errorf("attach raw tracepoint %s: %w", tp.name, explainAttach(err))
		}
		p.exits = append(p.exits, l)
	}
	if err := p.attachChanged(); err != nil {
		log.Info("processes that change their mappings are not named: the libcuda scan checks every process", "err", err)
	}
	return p, nil
}

// PinDir is where the maps are pinned ("" when they are not).
func (p *Probes) PinDir() string { return p.pinDir }

// Close detaches the tracepoints and releases the programs and maps; pinned
// maps stay pinned (Unpin removes them). Libraries attached with Attach must
// be detached first.
func (p *Probes) Close() error {
	for _, l := range p.exits {
		l.Close()
	}
	if p.mapping != nil {
		p.mapping.Close()
	}
	p.exits, p.mapping = nil, nil
	return p.objs.Close()
}

// Unpin removes the pinned maps, so the next Open starts from nothing.
func (p *Probes) Unpin() error {
	if p.pinDir == "" {
		return nil
	}
	spec, err := loadGpuwarden()
	if err != nil {
		return err
	}
	if err := unpinAll(spec, p.pinDir); err != nil {
		return err
	}
	return os.Remove(filepath.Join(p.pinDir, layoutMap))
}
