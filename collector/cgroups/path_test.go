package cgroups

import "testing"

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
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ParsePath(tt.path); got != tt.want {
				t.Errorf("ParsePath(%q) = %+v, want %+v", tt.path, got, tt.want)
			}
		})
	}
}

func FuzzParsePath(f *testing.F) {
	f.Add("/kubepods/burstable/pod1f0c2a4e-5b6d-4e8f-9a0b-1c2d3e4f5a6b/0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")
	f.Add("/system.slice/docker-x.scope")
	f.Fuzz(func(t *testing.T, p string) {
		c := ParsePath(p)
		if c.ContainerID != "" && len(c.ContainerID) != 64 {
			t.Errorf("container id %q is not 64 hex digits", c.ContainerID)
		}
		if c.PodUID != "" && len(c.PodUID) != 36 {
			t.Errorf("pod uid %q is not a uid", c.PodUID)
		}
	})
}
