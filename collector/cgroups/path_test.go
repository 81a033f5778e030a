package cgroups

import (
	"path"
	"strings"
	"testing"
)

func TestParsePath(t *testing.T) {
	const id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	const uid = "1f0c2a4e-5b6d-4e8f-9a0b-1c2d3e4f5a6b"
	tests := []struct {
		name, path string
		want       Container
	}{
		{"containerd systemd", "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1f0c2a4e_5b6d_4e8f_9a0b_1c2d3e4f5a6b.slice/cri-containerd-" + id + ".scope",
			Container{"containerd", id, uid}},
		{"cri-o systemd", "/kubepods.slice/kubepods-pod1f0c2a4e_5b6d_4e8f_9a0b_1c2d3e4f5a6b.slice/crio-" + id + ".scope",
			Container{"cri-o", id, uid}},
		{"docker systemd", "/system.slice/docker-" + id + ".scope", Container{"docker", id, ""}},
		{"cgroupfs kubepods", "/kubepods/burstable/pod" + uid + "/" + id, Container{"", id, uid}},
		{"cgroupfs guaranteed", "/kubepods/pod" + uid + "/" + id, Container{"", id, uid}},
		{"docker cgroupfs", "/docker/" + id, Container{"docker", id, ""}},
		{"cri-o conmon is no container", "/kubepods.slice/kubepods-pod1f0c2a4e_5b6d_4e8f_9a0b_1c2d3e4f5a6b.slice/crio-conmon-" + id + ".scope",
			Container{"", "", uid}},
		{"pod without container", "/kubepods/besteffort/pod" + uid, Container{"", "", uid}},
		{"host service", "/system.slice/sshd.service", Container{}},
		{"root", "/", Container{}},
		{"short id is not an id", "/docker/0123abc", Container{}},
		{"a process in a child of its container", "/kubepods/pod" + uid + "/" + id + "/worker", Container{"", id, uid}},
		{"under a --cgroup-root", "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod1f0c2a4e_5b6d_4e8f_9a0b_1c2d3e4f5a6b.slice/cri-containerd-" + id + ".scope",
			Container{"containerd", id, uid}},
		{"a pod slice under another QoS class's", "/kubepods.slice/kubepods-burstable.slice/kubepods-besteffort-pod1f0c2a4e_5b6d_4e8f_9a0b_1c2d3e4f5a6b.slice",
			Container{}},
		{"a pod segment off the kubelet's layout", "/kubepods/guaranteed/pod" + uid + "/" + id, Container{}},
		{"a docker container's own kubepods tree", "/docker/" + id + "/kubepods/pod" + uid, Container{"docker", id, ""}},
		{"a docker container's child named as another", "/system.slice/docker-" + id + ".scope/docker-" + victimID + ".scope", Container{"docker", id, ""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ParsePath(tt.path); got != tt.want {
				t.Errorf("ParsePath(%q) = %+v, want %+v", tt.path, got, tt.want)
			}
		})
	}
}

// victimID and victimUID are another pod's container and pod.
const (
	victimID  = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"
	victimUID = "99999999-8888-4777-8666-555555555555"
)

// TestParsePathIgnoresDelegatedChildren: a container with cgroup delegation
// makes cgroups below its own named as another pod's or container's; its
// processes there are still its own pod's and container's.
func TestParsePathIgnoresDelegatedChildren(t *testing.T) {
	const id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	const uid = "1f0c2a4e-5b6d-4e8f-9a0b-1c2d3e4f5a6b"
	systemdVictim := "kubepods-burstable-pod" + strings.ReplaceAll(victimUID, "-", "_") + ".slice"
	tests := []struct {
		name, path string
		want       Container
	}{
		{"systemd pod slice in a container", "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1f0c2a4e_5b6d_4e8f_9a0b_1c2d3e4f5a6b.slice/cri-containerd-" + id + ".scope/" + systemdVictim,
			Container{"containerd", id, uid}},
		{"systemd pod and container in a container", "/kubepods.slice/kubepods-pod1f0c2a4e_5b6d_4e8f_9a0b_1c2d3e4f5a6b.slice/crio-" + id + ".scope/" + systemdVictim + "/crio-" + victimID + ".scope",
			Container{"cri-o", id, uid}},
		{"cgroupfs pod in a container", "/kubepods/burstable/pod" + uid + "/" + id + "/pod" + victimUID, Container{"", id, uid}},
		{"cgroupfs pod and container in a container", "/kubepods/pod" + uid + "/" + id + "/pod" + victimUID + "/" + victimID, Container{"", id, uid}},
		{"a whole kubepods tree in a container", "/kubepods/besteffort/pod" + uid + "/" + id + "/kubepods/besteffort/pod" + victimUID + "/" + victimID,
			Container{"", id, uid}},
		{"a pod in a pod's own cgroup", "/kubepods/besteffort/pod" + uid + "/pod" + victimUID, Container{"", "", uid}},
		{"a container in a pod's own cgroup's child", "/kubepods/besteffort/pod" + uid + "/x/" + victimID, Container{"", "", uid}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ParsePath(tt.path); got != tt.want {
				t.Errorf("ParsePath(%q) = %+v, want %+v", tt.path, got, tt.want)
			}
		})
	}
}

// FuzzParsePath: what a path says is well formed, and cgroups made below it
// (child, its segments) never change a pod or container it names.
func FuzzParsePath(f *testing.F) {
	f.Add("/kubepods/burstable/pod1f0c2a4e-5b6d-4e8f-9a0b-1c2d3e4f5a6b/0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", "pod"+victimUID)
	f.Add("/kubepods.slice/kubepods-pod1f0c2a4e_5b6d_4e8f_9a0b_1c2d3e4f5a6b.slice", "x/kubepods-pod"+strings.ReplaceAll(victimUID, "-", "_")+".slice")
	f.Add("/system.slice/docker-x.scope", "docker-"+victimID+".scope")
	f.Fuzz(func(t *testing.T, p, child string) {
		c := ParsePath(p)
		if c.ContainerID != "" && len(c.ContainerID) != 64 {
			t.Errorf("container id %q is not 64 hex digits", c.ContainerID)
		}
		if c.PodUID != "" && len(c.PodUID) != 36 {
			t.Errorf("pod uid %q is not a uid", c.PodUID)
		}
		below := path.Clean(p)
		for _, seg := range strings.Split(child, "/") {
			if seg != "" && seg != "." && seg != ".." {
				below += "/" + seg
			}
		}
		d := ParsePath(below)
		if c.PodUID != "" && d.PodUID != c.PodUID || c.ContainerID != "" && d != c {
			t.Errorf("ParsePath(%q) = %+v, but below it ParsePath(%q) = %+v", p, c, below, d)
		}
	})
}
