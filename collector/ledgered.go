package collector

import (
	"context"
	"time"

	"github.com/gpuwarden/gpuwarden/collector/ledgertrust"
	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
	"github.com/gpuwarden/gpuwarden/enforcer/hostcgroup"
)

// ledgerSlots are the process slots of the ledgers whose cgroup claims
// stood, by the cgroup they speak for.
type ledgerSlots map[uint64][]controlblock.ProcUsage

func (c *Collector) keepSlots(ledgers map[uint64]*ledger) {
	s := make(ledgerSlots, len(ledgers))
	for cg, l := range ledgers {
		s[cg] = l.usage.Procs
	}
	c.slots.Store(&s)
}

// InLedger says whether a slot of its own cgroup's ledger names process pid
// (a host pid, under Sources.ProcRoot), as the last view read the ledgers
// whose claims stand: that ledger counts its launches, so the eBPF probes
// need not (observe.Config.Ledgered). Only the process's own container can
// vouch for it; a process the last view did not cover, or whose cgroup or
// start time cannot be read, is not in a ledger.
func (c *Collector) InLedger(pid int) bool {
	slots := c.slots.Load()
	if slots == nil || c.src.Cgroups == nil {
		return false
	}
	path, err := hostcgroup.Of(c.src.ProcRoot, pid)
	if err != nil {
		return false
	}
	cg, err := c.src.Cgroups.ID(hostcgroup.HostPath(c.src.CgroupNSRoot, path))
	if err != nil {
		return false
	}
	procs, ok := (*slots)[cg]
	if !ok {
		return false
	}
	p, err := ledgertrust.Identify(c.src.ProcRoot, pid)
	return err == nil && ledgertrust.InSlots(p, procs)
}

// Refresh builds a view unless the last one is younger than age, so
// InLedger answers from ledgers read that recently even where nothing else
// asks for views (enforcement off, no scrapes).
func (c *Collector) Refresh(ctx context.Context, age time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last != nil && time.Since(c.last.Time) < age {
		return
	}
	c.last = c.build(ctx)
}
