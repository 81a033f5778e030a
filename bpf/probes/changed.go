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
	// One system call per batch, not two per process (it runs twice a
	// second); batch operations are older than the tracepoint.
	keys, vals := make([]uint32, 256), make([]uint8, 256)
	pids = map[int]bool{}
	var cursor ebpf.MapBatchCursor
	for {
		n, err := m.BatchLookupAndDelete(&cursor, keys, vals, nil)
		for _, k := range keys[:n] {
			pids[int(k)] = true
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			break // read to the end
		}
		if err != nil {
			return nil, true, fmt.Errorf("take the changed processes: %w", err)
		}
	}
	return pids, uint32(len(pids)) >= m.MaxEntries(), nil
}
