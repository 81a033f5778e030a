package probes

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// attachChanged attaches the tracepoint that names the processes whose
// mappings change (the map changed), on kernels where it is cheap (6.12 and
// later). Elsewhere Changed cannot tell.
func (p *Probes) attachChanged() error {
	const tp = "mmap_lock_released"
	if l, err := link.AttachRawTracepoint(link.RawTracepointOptions{Name: tp, Program: p.objs.MmapUnlockLayout}); err == nil {
		l.Close()
		return errors.New("the kernel's mmap_lock tracepoints format a memory cgroup path at every lock (before Linux 6.12)")
	}
	l, err := link.AttachRawTracepoint(link.RawTracepointOptions{Name: tp, Program: p.objs.OnMmapUnlock})
	if err != nil {
		return fmt.Errorf("attach raw tracepoint %s: %w", tp, explainAttach(err))
	}
	p.mapping = l
	return nil
}

// Changed returns the processes (host tgids) that changed their mappings
// (mmap, mprotect, munmap, brk), exec'd or exited since the last call. A
// process is named once its change is in place, so maps read after the call
// show every change it names. all is true when it cannot tell: the
// tracepoint is not attached, or more processes changed than it keeps.
func (p *Probes) Changed() (pids map[int]bool, all bool, err error) {
	if p.mapping == nil {
		return nil, true, nil
	}
	m := p.objs.Changed
	var keys []uint32
	var key uint32
	var val uint8
	for it := m.Iterate(); it.Next(&key, &val); {
		keys = append(keys, key)
	}
	pids = make(map[int]bool, len(keys))
	for _, k := range keys {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil, true, fmt.Errorf("take a changed process: %w", err)
		}
		pids[int(k)] = true
	}
	return pids, uint32(len(keys)) >= m.MaxEntries(), nil
}
