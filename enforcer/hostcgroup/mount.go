package hostcgroup

import (
	"bufio"
	"fmt"
	"os"
	"path"
	"strings"
)

// Mount returns where the cgroup v2 hierarchy is mounted, from a mountinfo
// file (normally /proc/self/mountinfo): /sys/fs/cgroup on most machines,
// /sys/fs/cgroup/unified on hybrid ones.
func Mount(mountinfo string) (string, error) { return MountUnder(mountinfo, "/") }

// MountUnder returns the cgroup v2 mount at dir or below it, the shallowest
// one, from a mountinfo file. dir is where the host's cgroup filesystem
// directory is seen: a pod that mounts the host's /sys/fs/cgroup at
// /host/sys/fs/cgroup (recursively, as the kubelet's hostPath mounts are)
// sees there /host/sys/fs/cgroup itself on a cgroup v2 host and
// /host/sys/fs/cgroup/unified on a hybrid one; a cgroup2 mount outside dir
// (the pod's own, namespaced one) is not the host's tree.
func MountUnder(mountinfo, dir string) (string, error) {
	f, err := os.Open(mountinfo)
	if err != nil {
		return "", fmt.Errorf("read mountinfo: %w", err)
	}
	defer f.Close()
	dir = path.Clean("/" + dir)
	best := ""
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// "36 35 0:31 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw"
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		fields, fstype := strings.Fields(pre), strings.Fields(post)
		if len(fields) < 5 || len(fstype) < 1 || fstype[0] != "cgroup2" {
			continue
		}
		mnt := unescapeMountinfo(fields[4])
		if !Within(mnt, dir) {
			continue
		}
		if best == "" || strings.Count(mnt, "/") < strings.Count(best, "/") {
			best = mnt
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("read mountinfo: %w", err)
	}
	if best == "" {
		return "", fmt.Errorf("no cgroup2 mount at or under %s in %s", dir, mountinfo)
	}
	return best, nil
}

// unescapeMountinfo undoes mountinfo's octal escapes ("\040" for a space).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && isOctal(s[i+1]) && isOctal(s[i+2]) && isOctal(s[i+3]) {
			b.WriteByte((s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0'))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }
