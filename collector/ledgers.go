package collector

import (
	"fmt"
	"os"
	"syscall"

	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
)

// ledgerFiles keeps every container's ledger open (and its limits mapped)
// between scrapes: opening a thousand files per scrape costs more than the
// rest of the scrape together. Ledgers are read into one reused buffer, not
// mapped, so the agent's memory does not grow with them. A limits file
// replaced (another inode) is remapped; a directory gone is dropped.
type ledgerFiles struct {
	open map[string]*openLedger // by directory name
	buf  []byte
}

type openLedger struct {
	usage     *os.File
	limits    *controlblock.LimitsFile
	limitsIno uint64
}

func inode(path string) (uint64, bool) {
	var st syscall.Stat_t
	if syscall.Stat(path, &st) != nil {
		return 0, false
	}
	return st.Ino, true
}

// read returns a snapshot of dir's ledger, opening it on first use.
func (f *ledgerFiles) read(controlDir, dir string) (*ledger, error) {
	if f.open == nil {
		f.open = map[string]*openLedger{}
	}
	m := f.open[dir]
	if m == nil {
		m = &openLedger{}
		f.open[dir] = m
	}
	if m.usage == nil {
		file, err := os.Open(controlblock.UsagePath(controlDir, dir))
		if err != nil {
			f.drop(dir)
			return nil, err
		}
		m.usage = file
	}
	if f.buf == nil {
		f.buf = make([]byte, controlblock.UsageSize)
	}
	if n, err := m.usage.ReadAt(f.buf, 0); n < len(f.buf) {
		f.drop(dir)
		return nil, fmt.Errorf("read ledger %s: %d bytes: %v", dir, n, err)
	}
	snap, err := controlblock.ParseUsage(f.buf)
	if err != nil {
		return nil, fmt.Errorf("usage: %w", err)
	}
	l := &ledger{dir: dir, usage: snap}
	lp := controlblock.LimitsPath(controlDir, dir)
	if ino, ok := inode(lp); !ok {
		m.closeLimits()
	} else {
		if m.limits == nil || m.limitsIno != ino {
			m.closeLimits()
			if lf, err := controlblock.OpenLimits(lp); err == nil {
				m.limits, m.limitsIno = lf, ino
			}
		}
		if m.limits != nil {
			cfg := m.limits.Config()
			l.limits = &cfg
		}
	}
	return l, nil
}

// keep closes every ledger whose directory is not in seen.
func (f *ledgerFiles) keep(seen map[string]bool) {
	for dir := range f.open {
		if !seen[dir] {
			f.drop(dir)
		}
	}
}

func (f *ledgerFiles) drop(dir string) {
	if m := f.open[dir]; m != nil {
		m.closeUsage()
		m.closeLimits()
	}
	delete(f.open, dir)
}

func (m *openLedger) closeUsage() {
	if m.usage != nil {
		_ = m.usage.Close()
		m.usage = nil
	}
}

func (m *openLedger) closeLimits() {
	if m.limits != nil {
		m.limits.Close()
		m.limits = nil
	}
}
