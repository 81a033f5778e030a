package kubelet

// Labels returns a function naming the container whose control-block
// directory is dir, from the kubelet's assignments: the device plugin named
// each allocation's directory after its device ids (dirName), so the
// directory leads back to the devices and the devices to the container. The
// function is pure and safe to call concurrently.
func Labels(as []Assignment, dirName func(deviceIDs []string) string) func(dir, cgroupPath string) (ns, pod, container string, ok bool) {
	byDir := make(map[string]Assignment, len(as))
	for _, a := range as {
		byDir[dirName(a.DeviceIDs)] = a
	}
	return func(dir, _ string) (string, string, string, bool) {
		a, ok := byDir[dir]
		return a.Namespace, a.Pod, a.Container, ok
	}
}
