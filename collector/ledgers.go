package collector

import (
	"errors"
	"io/fs"
	"sort"
	"syscall"

	"github.com/gpuwarden/gpuwarden/enforcer/agentapi"

	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
)

// ledgerFiles keeps every container's ledger open (and its limits mapped)
// between scrapes: opening a thousand files per scrape costs more than the
// rest of the scrape together. Ledgers are read into one reused buffer, not
// mapped, so the agent's memory does not grow with them and a ledger that
// shrinks cannot fault it (controlblock.Ledger). A limits file replaced
// (another inode) is remapped; a directory gone is dropped. A ledger that
// cannot be read is kept in bad, for the view, until it reads again.
type ledgerFiles struct {
	open map[string]*openLedger // by directory name
	bad  map[string]string      // by directory name: why its ledger was not read
	buf  *controlblock.Usage    // scratch for reading
}

type openLedger struct {
	usage      *controlblock.Ledger
	limits     *controlblock.LimitsFile
	limitsIno  uint64
	limitsPath string
}

func inode(path string) (uint64, bool) {
	var st syscall.Stat_t
	if syscall.Lstat(path, &st) != nil {
		return 0, false
	}
	return st.Ino, true
}

// read returns a snapshot of dir's ledger, opening it on first use.
func (f *ledgerFiles) read(controlDir, dir string) (*ledger, error) {
	l, err := f.readUsage(controlDir, dir)
	f.noteBad(dir, err)
	return l, err
}

func (f *ledgerFiles) readUsage(controlDir, dir string) (*ledger, error) {
	if f.open == nil {
		f.open = map[string]*openLedger{}
	}
	m := f.open[dir]
	if m == nil {
		m = &openLedger{limitsPath: controlblock.LimitsPath(controlDir, dir)}
		f.open[dir] = m
	}
	if m.usage == nil {
		u, err := controlblock.OpenLedger(controlblock.UsagePath(controlDir, dir))
		if err != nil {
			f.drop(dir)
			return nil, err
		}
		m.usage = u
	}
	if f.buf == nil {
		f.buf = new(controlblock.Usage)
	}
	snap, err := m.usage.Read(f.buf)
	if err != nil {
		return nil, err // kept open: it knows whether its file held a ledger before
	}
	l := &ledger{dir: dir, usage: snap, file: m.usage.File()}
	lp := m.limitsPath
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
	for dir := range f.bad {
		if !seen[dir] {
			delete(f.bad, dir)
		}
	}
}

// noteBad records why dir's ledger was not read (err nil: it was).
func (f *ledgerFiles) noteBad(dir string, err error) {
	if err == nil || errors.Is(err, fs.ErrNotExist) || errors.Is(err, controlblock.ErrNotLaidOut) { // no ledger yet: nothing wrong
		delete(f.bad, dir)
		return
	}
	if f.bad == nil {
		f.bad = map[string]string{}
	}
	f.bad[dir] = err.Error()
}

// badList is every ledger that could not be read, by directory.
func (f *ledgerFiles) badList() []agentapi.BadLedger {
	out := make([]agentapi.BadLedger, 0, len(f.bad))
	for dir, msg := range f.bad {
		out = append(out, agentapi.BadLedger{Dir: dir, Error: msg})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Dir < out[j].Dir })
	return out
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
