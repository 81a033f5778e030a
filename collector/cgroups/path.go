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
	bareID = regexp.MustCompile(`^([0-9a-f]{64})$`)
	uid    = regexp.MustCompile(`^[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}$`)
	// The kubelet's pods cgroup under the systemd driver: kubepods.slice,
	// or <root>-kubepods.slice under a --cgroup-root of <root>.slice.
	systemdPods = regexp.MustCompile(`^([a-z0-9_.]+-)?kubepods\.slice$`)
)

var runtimeOfPrefix = map[string]string{"cri-containerd": "containerd", "crio": "cri-o", "docker": "docker"}

// qosClasses are the kubelet's cgroups of burstable and best-effort pods;
// guaranteed pods sit directly in the pods cgroup.
var qosClasses = []string{"burstable", "besteffort"}

// ParsePath reads a cgroup v2 path (as /proc/<pid>/cgroup shows it) for the
// container id and pod uid that the common runtimes and cgroup drivers put
// there. Unknown forms give an empty Container, never an error: such a cgroup
// is still reported, labelled by its path.
//
// Only the kubelet's layout names a pod: the path's first pods cgroup, a QoS
// cgroup or none, the pod's cgroup, and the container's directly below it.
// Anything deeper a container with cgroup delegation may have made itself,
// so a pod<uid> or container segment there names nothing. Off Kubernetes the
// outermost container segment is the container, for the same reason.
func ParsePath(p string) Container {
	segs := strings.Split(strings.Trim(path.Clean(p), "/"), "/")
	for i, seg := range segs {
		if seg == "kubepods" || systemdPods.MatchString(seg) {
			return kubeletPod(seg, segs[i+1:])
		}
		if c, ok := containerAt(segs, i); ok {
			return c
		}
	}
	return Container{}
}

// kubeletPod reads the pod and its container from below, the path's
// segments under pods, the kubelet's pods cgroup.
func kubeletPod(pods string, below []string) Container {
	uid, depth := podBelow(pods, below)
	if uid == "" {
		return Container{}
	}
	c, _ := containerAt(below, depth)
	c.PodUID = uid
	return c
}

// podBelow is the pod uid the kubelet's layout puts under pods, and how
// many segments of below lead to the pod's cgroup. cgroupfs names each
// cgroup alone (burstable/pod<uid>); systemd names each slice after its
// whole path (kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice).
func podBelow(pods string, below []string) (string, int) {
	at := func(i int) string {
		if i < len(below) {
			return below[i]
		}
		return ""
	}
	name, suffix := func(parts ...string) string { return parts[len(parts)-1] }, ""
	if pods != "kubepods" {
		base := strings.TrimSuffix(pods, ".slice")
		name = func(parts ...string) string { return strings.Join(append([]string{base}, parts...), "-") }
		suffix = ".slice"
	}
	if uid := uidIn(at(0), name("pod"), suffix); uid != "" {
		return uid, 1
	}
	for _, q := range qosClasses {
		if at(0) == name(q)+suffix {
			if uid := uidIn(at(1), name(q, "pod"), suffix); uid != "" {
				return uid, 2
			}
		}
	}
	return "", 0
}

// uidIn is the pod uid, with dashes, that seg holds between prefix and
// suffix; "" when seg is no such name.
func uidIn(seg, prefix, suffix string) string {
	s, ok := strings.CutPrefix(seg, prefix)
	if !ok {
		return ""
	}
	if s, ok = strings.CutSuffix(s, suffix); !ok || !uid.MatchString(s) {
		return ""
	}
	return strings.ReplaceAll(s, "_", "-")
}

// containerAt reads segs[i] as a container's cgroup.
func containerAt(segs []string, i int) (Container, bool) {
	if i >= len(segs) {
		return Container{}, false
	}
	if m := systemdScope.FindStringSubmatch(segs[i]); m != nil {
		return Container{Runtime: runtimeOfPrefix[m[1]], ContainerID: m[2]}, true
	}
	if m := bareID.FindStringSubmatch(segs[i]); m != nil {
		c := Container{ContainerID: m[1]}
		if i > 0 && segs[i-1] == "docker" {
			c.Runtime = "docker"
		}
		return c, true
	}
	return Container{}, false
}
