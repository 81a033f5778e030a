package allocation

import (
	"regexp"
	"sort"
	"time"
)

// DefaultCollectGrace is how long a control directory nobody claims stays.
const DefaultCollectGrace = 5 * time.Minute

var dirNameRe = regexp.MustCompile(`^(slot|mem|remote)-[A-Za-z0-9-]{0,64}-[0-9a-f]{16}$`)
var claimDirRe = regexp.MustCompile(`^claim-[A-Za-z0-9_-]{1,64}-[A-Za-z0-9_-]{1,64}$`)

// IsDirName says whether a control directory's name is one DirName makes:
// an allocation's, whose holder the kubelet's pod-resources API names.
func IsDirName(name string) bool { return dirNameRe.MatchString(name) }

// IsClaimDirName says whether a control directory's name is one
// ClaimDirName makes: a DRA claim's, claimed while the claim is prepared.
func IsClaimDirName(name string) bool { return claimDirRe.MatchString(name) }

// Dir is what the agent saw of one control directory.
type Dir struct {
	Name     string
	Modified time.Time // the directory's mtime: Allocate renames its files in
	Listed   bool      // pod-resources lists a container holding the ids it is named by
	Prepared bool      // the DRA driver has the claim it is named by prepared
	Cgroup   bool      // a cgroup whose key (controlblock.ContainerKey) is its name exists
}

// Collector decides which control directories are dead, remembering since
// when each has been unclaimed. It is not safe for concurrent use.
type Collector struct {
	Grace     time.Duration
	unclaimed map[string]time.Time
}

// Dead returns the directories to remove, sorted. A directory is claimed by
// its holder: an allocation's (IsDirName) while pod-resources lists it, a
// DRA claim's (IsClaimDirName) while the driver has the claim prepared, any
// other (made by the interposer, off Kubernetes) while its cgroup exists;
// kubeletKnown false (no answer this time) claims every allocation's, since
// a pod that is gone cannot be told from a kubelet that is down. One
// unclaimed for Grace, and not changed for Grace (an allocation the kubelet
// does not list yet), is dead unless a live process uses it: inUse is asked
// last, once, of those left, and returns the ones in use.
func (c *Collector) Dead(now time.Time, dirs []Dir, kubeletKnown bool, inUse func(names []string) map[string]bool) []string {
	if c.unclaimed == nil {
		c.unclaimed = map[string]time.Time{}
	}
	seen := make(map[string]bool, len(dirs))
	var dead []string
	for _, d := range dirs {
		seen[d.Name] = true
		claimed := d.Cgroup
		switch {
		case IsDirName(d.Name):
			claimed = d.Listed || !kubeletKnown
		case IsClaimDirName(d.Name):
			claimed = d.Prepared
		}
		if claimed {
			delete(c.unclaimed, d.Name)
			continue
		}
		since, ok := c.unclaimed[d.Name]
		if !ok {
			since = now
			c.unclaimed[d.Name] = now
		}
		if now.Sub(since) >= c.Grace && now.Sub(d.Modified) >= c.Grace {
			dead = append(dead, d.Name)
		}
	}
	for name := range c.unclaimed {
		if !seen[name] {
			delete(c.unclaimed, name)
		}
	}
	if len(dead) == 0 {
		return nil
	}
	used := inUse(dead)
	out := dead[:0]
	for _, name := range dead {
		if !used[name] {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// Interval is how often to sweep: a quarter of the grace period, from 1s to
// 1m, so a dead directory goes within about the grace period and a node of
// many containers is not walked every second.
func (c *Collector) Interval() time.Duration {
	return min(max(c.Grace/4, time.Second), time.Minute)
}
