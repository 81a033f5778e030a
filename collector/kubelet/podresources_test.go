package kubelet_test

import (
	"context"
	"strings"
	"testing"

	"github.com/gpuwarden/gpuwarden/collector/kubelet"
	"github.com/gpuwarden/gpuwarden/collector/kubelet/kubelettest"
)

func TestListOverRealSocket(t *testing.T) {
	k := kubelettest.StartPodResources(t)
	k.SetPods(
		kubelettest.Pod{Namespace: "ml", Name: "trainer-0", Containers: []kubelettest.Container{
			{Name: "main", Devices: map[string][]string{"gpuwarden.io/gpu": {"GPU-a::1"}, "example.com/nic": {"eth1"}}},
			{Name: "sidecar"},
		}},
		kubelettest.Pod{Namespace: "web", Name: "api", Containers: []kubelettest.Container{{Name: "app"}}},
	)
	c, err := kubelet.DialPodResources(k.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got, err := c.List(context.Background(), func(r string) bool { return strings.HasPrefix(r, "gpuwarden.io/") })
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 {
		t.Fatalf("List = %+v, want the one gpuwarden assignment", got)
	}
	a := got[0]
	if a.Namespace != "ml" || a.Pod != "trainer-0" || a.Container != "main" || a.Resource != "gpuwarden.io/gpu" ||
		len(a.DeviceIDs) != 1 || a.DeviceIDs[0] != "GPU-a::1" {
		t.Errorf("assignment = %+v", a)
	}
}

func TestListWithoutKubelet(t *testing.T) {
	c, err := kubelet.DialPodResources(t.TempDir() + "/absent.sock")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.List(context.Background(), func(string) bool { return true }); err == nil {
		t.Error("List without a kubelet gave no error")
	}
}

func TestLabelsByAllocationDir(t *testing.T) {
	as := []kubelet.Assignment{
		{Namespace: "ml", Pod: "trainer-0", Container: "main", Resource: "gpuwarden.io/gpu", DeviceIDs: []string{"b", "a"}},
		{Namespace: "ml", Pod: "trainer-1", Container: "main", Resource: "gpuwarden.io/gpu", DeviceIDs: []string{"c"}},
	}
	dirName := func(ids []string) string { return "alloc-" + strings.Join(ids, "+") }
	const uid1 = "1f0c2a4e-5b6d-4e8f-9a0b-1c2d3e4f5a6b"
	uids := func(ns, pod string) string { return map[string]string{"ml/trainer-1": uid1}[ns+"/"+pod] }
	label := kubelet.Labels(as, dirName, uids)
	if ns, pod, c, ok := label("alloc-b+a", "/kubepods/x"); !ok || ns != "ml" || pod != "trainer-0" || c != "main" {
		t.Errorf("label(alloc-b+a) = %q %q %q %v (the pod's uid unknown: its cgroup is not checked)", ns, pod, c, ok)
	}
	if _, _, _, ok := label("alloc-z", "/kubepods/y"); ok {
		t.Error("a directory no assignment names was labelled")
	}
	if _, pod, _, ok := label("alloc-c", "/kubepods/burstable/pod"+uid1+"/"+strings.Repeat("ab", 32)); !ok || pod != "trainer-1" {
		t.Errorf("label(alloc-c) in its pod's cgroup = %q %v", pod, ok)
	}
	if _, _, _, ok := label("alloc-c", "/kubepods/burstable/pod2f0c2a4e-5b6d-4e8f-9a0b-1c2d3e4f5a6b/x"); ok {
		t.Error("a directory was taken for a cgroup of another pod")
	}
	// Another pod's container made a child cgroup named after the pod.
	if _, _, _, ok := label("alloc-c", "/kubepods/burstable/pod2f0c2a4e-5b6d-4e8f-9a0b-1c2d3e4f5a6b/"+strings.Repeat("cd", 32)+"/pod"+uid1); ok {
		t.Error("a directory was taken for a child cgroup another pod's container named after its pod")
	}
}

// TestDigestIdentifiesAnAnswer: the kubelet lists pods in any order; the
// digest of an answer does not depend on it, and tells answers apart.
func TestDigestIdentifiesAnAnswer(t *testing.T) {
	a := kubelet.Assignment{Namespace: "ns", Pod: "a", Container: "c", Resource: "gpuwarden.io/gpu", DeviceIDs: []string{"gpu0-s1"}}
	b := kubelet.Assignment{Namespace: "ns", Pod: "b", Container: "c", Resource: "gpuwarden.io/gpu", DeviceIDs: []string{"gpu0-s2"}}
	if kubelet.Digest([]kubelet.Assignment{a, b}) != kubelet.Digest([]kubelet.Assignment{b, a}) {
		t.Error("the same answer in another order has another digest")
	}
	moved := b
	moved.DeviceIDs = []string{"gpu0-s3"}
	split := a
	split.Pod, split.Container = "a/c", ""
	for _, other := range [][]kubelet.Assignment{{a}, {a, moved}, {split, b}, nil} {
		if kubelet.Digest(other) == kubelet.Digest([]kubelet.Assignment{a, b}) {
			t.Errorf("answer %v has the digest of another", other)
		}
	}
}
