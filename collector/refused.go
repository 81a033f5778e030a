package collector

import (
	"fmt"
	"slices"
	"strings"

	"github.com/gpuwarden/gpuwarden/collector/ledgertrust"
	"github.com/gpuwarden/gpuwarden/enforcer/agentapi"
	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
)

// refusedLedgers are what the judge keeps about ledgers whose cgroup claim
// was refused, between views.
type refusedLedgers struct {
	// maps says whether a GPU process maps a refused ledger, by process
	// and file: the interposer maps its ledger once, for the process's
	// life, so one read of a process's maps answers for as long as both
	// last.
	maps map[holding]bool
	// logged is the reason each refusal was logged with.
	logged map[string]string
}

type holding struct {
	pid   int
	start uint64
	file  controlblock.FileID
}

// judgeRefused holds the writers of refused ledgers to account, and no one
// else. A container can write any (pid, start time) into its own ledger, so
// a ledger's slots are no evidence against the processes they name. Its
// writers are:
//   - the GPU processes that map it (the interposer maps its container's
//     ledger for the process's life): what they hold, they hold under a
//     ledger that lies about its cgroup;
//   - when its slots name GPU processes of other containers that do not map
//     it, the container its directory belongs to, which alone writes it
//     (an attempt to have another container judged by its ledger).
//
// A refused ledger with no writer (one a container that is gone left
// behind) accuses nobody. It returns the breaches by cgroup, adds an entry
// for an accused container that has none, and lists every refusal in the
// view.
func (j *joiner) judgeRefused(rejected []*ledger) map[uint64][]agentapi.Breach {
	rl := &j.c.refused
	if len(rejected) == 0 {
		rl.maps, rl.logged = nil, nil
		return nil
	}
	j.readMaps(rejected)
	paths := j.entryPaths()
	out := map[uint64][]agentapi.Breach{}
	logged := map[string]string{}
	for _, l := range rejected {
		owner, owned := j.ownerOf(l.dir, paths)
		holders, framed := j.writersOf(l, owner)
		accused := map[uint64]agentapi.Breach{}
		for cg, ps := range holders {
			accused[cg] = agentapi.Breach{Reason: BreachFalseClaim, Procs: ps, Evidence: fmt.Sprintf(
				"processes %v map ledger %s, which names cgroup %d: %v", pidsOf(ps), l.dir, l.usage.CgroupID, l.refused)}
		}
		if owned && len(framed) > 0 {
			accused[owner] = agentapi.Breach{Reason: BreachFalseClaim, Procs: holders[owner], Evidence: fmt.Sprintf(
				"ledger %s, this container's, names processes %v of other containers in its slots (its claim, cgroup %d: %v)",
				l.dir, pidsOf(framed), l.usage.CgroupID, l.refused)}
		}
		r := agentapi.RefusedLedger{Dir: l.dir, Cgroup: l.usage.CgroupID, Reason: l.refused.Error()}
		for cg, b := range accused {
			out[cg] = append(out[cg], b)
			if _, listed := paths[cg]; !listed { // the directory's owner, with no GPU entry
				j.entry(cg, j.firstGPU(l))
				paths[cg], _ = j.c.src.Cgroups.Path(cg)
			}
			r.Writers = append(r.Writers, paths[cg])
		}
		slices.Sort(r.Writers)
		j.v.Refused = append(j.v.Refused, r)
		why := fmt.Sprintf("%s; writers %v", r.Reason, r.Writers)
		if rl.logged[l.dir] != why {
			j.c.log.Warn("ledger's cgroup claim refused", "dir", l.dir, "cgroup", l.usage.CgroupID, "err", l.refused,
				"writers", r.Writers, "named", pidsOf(framed))
		}
		logged[l.dir] = why
	}
	rl.logged = logged
	slices.SortFunc(j.v.Refused, func(a, b agentapi.RefusedLedger) int { return strings.Compare(a.Dir, b.Dir) })
	return out
}

// writersOf sorts the GPU processes a refused ledger concerns: those that
// map it, by cgroup, and those of containers other than owner (its
// directory's; 0: unknown) its slots name without their mapping it.
func (j *joiner) writersOf(l *ledger, owner uint64) (holders map[uint64][]agentapi.Process, framed []agentapi.Process) {
	holders = map[uint64][]agentapi.Process{}
	seen := map[int]bool{} // a process listed on several GPUs counts once
	for k, ps := range j.procs {
		for _, p := range ps {
			if !p.ok || seen[p.hostPID] {
				continue
			}
			seen[p.hostPID] = true
			proc := agentapi.Process{PID: p.hostPID, StartTime: p.id.StartTime}
			switch {
			case j.c.refused.maps[holding{p.hostPID, p.id.StartTime, l.file}]:
				holders[k.Cgroup] = append(holders[k.Cgroup], proc)
			case ledgertrust.InSlots(p.id, l.usage.Procs) && k.Cgroup != owner:
				framed = append(framed, proc)
			}
		}
	}
	return holders, framed
}

// readMaps learns, for every GPU process, which refused ledgers it maps,
// reading the maps only of processes not asked about these files before.
func (j *joiner) readMaps(rejected []*ledger) {
	rl := &j.c.refused
	want := map[controlblock.FileID]bool{}
	for _, l := range rejected {
		want[l.file] = true
	}
	kept := map[holding]bool{}
	for _, ps := range j.procs {
		for _, p := range ps {
			if !p.ok {
				continue
			}
			known := true
			for f := range want {
				h := holding{p.hostPID, p.id.StartTime, f}
				v, ok := rl.maps[h]
				known = known && ok
				if ok {
					kept[h] = v
				}
			}
			if known {
				continue
			}
			mapped, err := controlblock.MappedFiles(j.c.src.ProcRoot, p.hostPID, want)
			if err != nil {
				continue // gone: asked again if listed again
			}
			for f := range want {
				kept[holding{p.hostPID, p.id.StartTime, f}] = mapped[f]
			}
		}
	}
	rl.maps = kept
}

// entryPaths is the cgroup path of every container with an entry.
func (j *joiner) entryPaths() map[uint64]string {
	paths := map[uint64]string{}
	for k, e := range j.entries {
		if e.CgroupPath != "" || paths[k.Cgroup] == "" {
			paths[k.Cgroup] = e.CgroupPath
		}
	}
	for cg, path := range paths {
		if path == "" && j.c.src.Cgroups != nil {
			paths[cg], _ = j.c.src.Cgroups.Path(cg)
		}
	}
	return paths
}

// ownerOf is the cgroup a control directory belongs to: off Kubernetes,
// the one its name was made from; on Kubernetes, the container of a GPU
// entry (paths) the kubelet assigned it to.
func (j *joiner) ownerOf(dir string, paths map[uint64]string) (uint64, bool) {
	if j.c.src.Cgroups == nil {
		return 0, false
	}
	if path, ok := controlblock.KeyPath(dir); ok {
		if id, err := j.c.src.Cgroups.ID(path); err == nil {
			return id, true
		}
	}
	if assigned := j.assigned(); assigned != nil {
		for cg, path := range paths {
			if path != "" && assigned(dir, path) {
				return cg, true
			}
		}
	}
	return 0, false
}

// firstGPU is the GPU of a ledger's first CUDA ordinal the node knows.
func (j *joiner) firstGPU(l *ledger) int {
	for _, g := range l.gpus {
		if g != NoGPU {
			return g
		}
	}
	return NoGPU
}
