// Package cgroups maps cgroup v2 ids (what eBPF sees) to cgroup paths and
// parses container runtimes' path forms into container and pod ids.
package cgroups

import (
	"path"
	"regexp"
	"strings"
)

// Container is what a cgroup path says about the container inside it.
type Container struct {
	Runtime     string // "containerd", "cri-o", "docker", or "" when the path names no runtime
	ContainerID string // 64 hex digits, or ""
	PodUID      string // with dashes, or "" off Kubernetes
}

var (
	// systemd driver: ".../kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope"
	systemdScope = regexp.MustCompile(`^(cri-containerd|crio|docker)-([0-9a-f]{64})\.scope$`)
	// cgroupfs driver: ".../pod<uid>/<id>", docker: "/docker/<id>"
	bareID     = regexp.MustCompile(`^([0-9a-f]{64})$`)
	podSegment = regexp.MustCompile(`pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})(\.slice)?$`)
)

var runtimeOfPrefix = map[string]string{"cri-containerd": "containerd", "crio": "cri-o", "docker": "docker"}

// ParsePath reads a cgroup v2 path (as /proc/<pid>/cgroup shows it) for the
// container id and pod uid that the common runtimes and cgroup drivers put
// there. Unknown forms give an empty Container, never an error: such a cgroup
// is still reported, labelled by its path.
func ParsePath(p string) Container {
	var c Container
	for _, seg := range strings.Split(strings.Trim(path.Clean(p), "/"), "/") {
		if m := podSegment.FindStringSubmatch(seg); m != nil {
			c.PodUID = strings.ReplaceAll(m[1], "_", "-")
			continue
		}
		if m := systemdScope.FindStringSubmatch(seg); m != nil {
			c.Runtime, c.ContainerID = runtimeOfPrefix[m[1]], m[2]
			continue
		}
		if m := bareID.FindStringSubmatch(seg); m != nil {
			c.ContainerID = m[1]
			if c.Runtime == "" && strings.Contains(p, "/docker/") {
				c.Runtime = "docker"
			}
		}
	}
	return c
}
