// Package kube is what deploy/k8stest's tests share: the cluster that
// cluster.sh runs them in (its settings and clients), the repository's build
// outputs, waiting on the cluster, and a pod's state in words.
package kube

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Cluster is what cluster.sh hands the tests through their environment,
// and the clients made from it.
type Cluster struct {
	State         string // cluster.sh's state directory: every host path a test uses is under it
	Kubeconfig    string
	Kubectl       string
	Containerd    string // the cluster's containerd socket
	Ctr           string // containerd's ctr, of the cluster's containerd version
	CDI           string // the directory the cluster's containerd reads CDI specs from
	Node          string
	DevicePlugins string // the kubelet's device-plugins directory
	PodResources  string // the kubelet's pod-resources socket
	// Node2 is the cluster's second node, without GPUs: the client side of
	// remote GPUs. It is labelled and tainted gpuwarden.io/remote-client=true
	// (NoSchedule), so only pods that tolerate the taint run there.
	Node2 Node2

	Config  *rest.Config
	Client  *kubernetes.Clientset
	Dynamic *dynamic.DynamicClient
}

// Node2 is where the second node's kubelet and containerd keep what a
// node's agent is given; every path is under the cluster's state directory.
type Node2 struct {
	Name          string
	Containerd    string // its containerd's socket
	CDI           string // the directory its containerd reads CDI specs from
	KubeletDir    string // its kubelet's root directory: plugins_registry, plugins/
	PodResources  string // its kubelet's pod-resources socket
	DevicePlugins string // its kubelet's device-plugins directory, as the host sees it
}

// Need skips unless the test runs inside `cluster.sh run` (make k8s-test):
// without a kubelet and an API server there is nothing to test.
func Need(t *testing.T) *Cluster {
	t.Helper()
	c := &Cluster{State: os.Getenv("GPUWARDEN_K8S_STATE"), Kubeconfig: os.Getenv("KUBECONFIG"),
		Kubectl: os.Getenv("GPUWARDEN_K8S_KUBECTL"), Containerd: os.Getenv("GPUWARDEN_K8S_CONTAINERD"),
		Ctr: os.Getenv("GPUWARDEN_K8S_CTR"), CDI: os.Getenv("GPUWARDEN_K8S_CDI_DIR"),
		Node: os.Getenv("GPUWARDEN_K8S_NODE"), DevicePlugins: os.Getenv("GPUWARDEN_K8S_DEVICE_PLUGINS"),
		PodResources: os.Getenv("GPUWARDEN_K8S_POD_RESOURCES_SOCKET"),
		Node2: Node2{Name: os.Getenv("GPUWARDEN_K8S_NODE2"), Containerd: os.Getenv("GPUWARDEN_K8S_NODE2_CONTAINERD"),
			CDI: os.Getenv("GPUWARDEN_K8S_NODE2_CDI_DIR"), KubeletDir: os.Getenv("GPUWARDEN_K8S_NODE2_KUBELET_DIR"),
			PodResources:  os.Getenv("GPUWARDEN_K8S_NODE2_POD_RESOURCES_SOCKET"),
			DevicePlugins: os.Getenv("GPUWARDEN_K8S_NODE2_DEVICE_PLUGINS")}}
	if c.State == "" {
		t.Skip("no cluster: run through `make k8s-test` (deploy/k8stest/cluster.sh run)")
	}
	var err error
	if c.Config, err = clientcmd.BuildConfigFromFlags("", c.Kubeconfig); err != nil {
		t.Fatalf("load kubeconfig: %v", err)
	}
	if c.Client, err = kubernetes.NewForConfig(c.Config); err != nil {
		t.Fatalf("client: %v", err)
	}
	if c.Dynamic, err = dynamic.NewForConfig(c.Config); err != nil {
		t.Fatalf("dynamic client: %v", err)
	}
	return c
}

// Repo is the repository's root, where bin/ holds `make build`'s outputs:
// the nearest directory above the test's that holds deploy/k8stest.
func Repo(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "deploy", "k8stest", "cluster.sh")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no repository above the working directory: run the tests from deploy/k8stest")
		}
		dir = parent
	}
	if _, err := os.Stat(filepath.Join(dir, "bin", "gpuwarden")); err != nil {
		t.Fatalf("run `make build` first: %v", err)
	}
	return dir
}

// Bin is a build output of `make build` in the repository's bin/.
func Bin(t *testing.T, name string) string {
	t.Helper()
	p := filepath.Join(Repo(t), "bin", name)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s: run `make build` first: %v", name, err)
	}
	return p
}

// Eventually retries f every half second until it returns nil or the
// timeout passes; timeouts are generous, the machines are shared.
func Eventually(t *testing.T, timeout time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, timeout, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// Describe says why a pod is not (yet) what a test waits for: its
// conditions that do not hold, and its containers that wait or failed.
func Describe(p *corev1.Pod) string {
	var s []string
	for _, c := range p.Status.Conditions {
		if c.Status != corev1.ConditionTrue {
			s = append(s, fmt.Sprintf("%s=%s %s: %s", c.Type, c.Status, c.Reason, c.Message))
		}
	}
	for _, cs := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
		if w := cs.State.Waiting; w != nil {
			s = append(s, fmt.Sprintf("container %s waiting %s: %s", cs.Name, w.Reason, w.Message))
		}
		if x := cs.State.Terminated; x != nil && x.ExitCode != 0 {
			s = append(s, fmt.Sprintf("container %s terminated %s (exit %d): %s", cs.Name, x.Reason, x.ExitCode, x.Message))
		}
	}
	return strings.Join(s, "; ")
}
