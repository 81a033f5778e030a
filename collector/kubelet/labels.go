package kubelet

import (
	"hash/maphash"

	"github.com/gpuwarden/gpuwarden/collector/cgroups"
)

// digestSeed keys Digest.
var digestSeed = maphash.MakeSeed()

// Digest identifies an answer of the kubelet's, whatever the order it lists
// the assignments in: equal answers have equal digests.
func Digest(as []Assignment) uint64 {
	var sum uint64
	for _, a := range as {
		var h maphash.Hash
		h.SetSeed(digestSeed)
		for _, s := range append([]string{a.Namespace, a.Pod, a.Container, a.Resource}, a.DeviceIDs...) {
			h.WriteString(s)
			h.WriteByte(0)
		}
		sum += h.Sum64()
	}
	return sum + uint64(len(as))
}

// Labels returns a function naming the container whose control-block
// directory is dir, from the kubelet's assignments: the device plugin named
// each allocation's directory after its device ids (dirName), so the
// directory leads back to the devices and the devices to the container.
// Where podUID knows the pod's uid (from the API server; "" unknown), the
// cgroup must be that pod's: a directory never names another pod's cgroup.
// The function is pure and safe to call concurrently.
func Labels(as []Assignment, dirName func(deviceIDs []string) string, podUID func(namespace, pod string) string) func(dir, cgroupPath string) (ns, pod, container string, ok bool) {
	byDir := make(map[string]Assignment, len(as))
	for _, a := range as {
		byDir[dirName(a.DeviceIDs)] = a
	}
	return func(dir, cgroupPath string) (string, string, string, bool) {
		a, ok := byDir[dir]
		if !ok {
			return "", "", "", false
		}
		if uid := podUID(a.Namespace, a.Pod); uid != "" && cgroups.ParsePath(cgroupPath).PodUID != uid {
			return "", "", "", false
		}
		return a.Namespace, a.Pod, a.Container, true
	}
}
