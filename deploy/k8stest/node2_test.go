package k8stest

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuwarden/gpuwarden/deploy/k8stest/kube"
)

const (
	// remoteClient is node 2's label and its taint's key and value.
	remoteClient = "gpuwarden.io/remote-client"
	// node2Subnet is node 2's pod subnet (cluster.sh's POD_CIDR2).
	node2Subnet = "10.214.1.0/24"
	// node2CgroupRoot is node 2's cgroup root (cluster.sh's CGROUP_ROOT2).
	node2CgroupRoot = "/gpuwarden-node2"
)

// TestSecondNode: cluster.sh's second node, without GPUs, is Ready,
// labelled and tainted gpuwarden.io/remote-client=true; node 1's kubelet
// socket in the fixed device-plugins directory is still there beside node
// 2's own. A busybox pod that tolerates the taint runs on node 2, in its
// pod subnet and under its cgroup root, reads its service-account token (a
// tmpfs its kubelet mounted in a mount namespace of its own, which
// containerd must see) and exits 0, its logs read through node 2's kubelet;
// a pod that does not tolerate the taint is never scheduled there.
func TestSecondNode(t *testing.T) {
	c := needCluster(t)
	n2 := c.Node2
	if n2.Name == "" {
		t.Fatal("GPUWARDEN_K8S_NODE2 is not set: cluster.sh brings up a second node without GPUs")
	}
	for what, p := range map[string]string{"containerd": n2.Containerd, "CDI dir": n2.CDI, "kubelet dir": n2.KubeletDir,
		"pod-resources socket": n2.PodResources, "device-plugins dir": n2.DevicePlugins} {
		if !strings.HasPrefix(p, c.State+"/") {
			t.Errorf("node 2's %s %q is not under the state directory %s", what, p, c.State)
		}
	}
	ctx := context.Background()

	t.Run("node", func(t *testing.T) {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, n2.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if v := n.Labels[remoteClient]; v != "true" {
			t.Errorf("label %s=%q, want true", remoteClient, v)
		}
		tainted := false
		for _, tn := range n.Spec.Taints {
			tainted = tainted || tn.Key == remoteClient && tn.Value == "true" && tn.Effect == corev1.TaintEffectNoSchedule
		}
		if !tainted {
			t.Errorf("taints %v, want %s=true:NoSchedule", n.Spec.Taints, remoteClient)
		}
		if _, ok := n.Labels["nvidia.com/gpu.present"]; ok {
			t.Errorf("node 2 is labelled nvidia.com/gpu.present: the chart's GPU DaemonSet would run there")
		}
		ready := false
		for _, cond := range n.Status.Conditions {
			ready = ready || cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue
		}
		if !ready {
			t.Errorf("node 2 is not Ready: %v", n.Status.Conditions)
		}
		// Both kubelets' device-plugins sockets: node 1's in the directory
		// fixed in the kubelet's code, node 2's in its own.
		for _, sock := range []string{filepath.Join(c.DevicePlugins, "kubelet.sock"), filepath.Join(n2.DevicePlugins, "kubelet.sock")} {
			if !isSocket(sock) {
				t.Errorf("%s: no socket there", sock)
			}
		}
		// Node 2's device-plugins mount is its kubelet's alone: the host has
		// none over the fixed directory.
		mountinfo, err := os.ReadFile("/proc/self/mountinfo")
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(mountinfo), "\n") {
			if f := strings.Fields(line); len(f) > 4 && f[4] == c.DevicePlugins {
				t.Errorf("the host has a mount on %s: %s", c.DevicePlugins, line)
			}
		}
		if _, err := os.Stat(n2.PodResources); err != nil {
			t.Errorf("node 2's pod-resources socket: %v", err)
		}
	})

	t.Run("pod", func(t *testing.T) {
		// The container prints its token's length and its cgroups, and fails
		// on an empty or missing token.
		p := c.node2Pod(t, "node2-token", true,
			`t=$(cat /var/run/secrets/kubernetes.io/serviceaccount/token) && [ -n "$t" ] && echo "token ${#t} bytes" && cat /proc/self/cgroup`)
		var logs string
		kube.Eventually(t, 2*time.Minute, "pod "+p.Name+" succeeds on node 2", func() error {
			var err error
			if p, err = c.Client.CoreV1().Pods(c.namespace).Get(ctx, p.Name, metav1.GetOptions{}); err != nil {
				return err
			}
			switch p.Status.Phase {
			case corev1.PodSucceeded:
			case corev1.PodFailed:
				b, _ := c.Client.CoreV1().Pods(c.namespace).GetLogs(p.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
				t.Fatalf("pod %s failed (%s): %s", p.Name, kube.Describe(p), b)
			default:
				return fmt.Errorf("phase %s on %q (%s)", p.Status.Phase, p.Spec.NodeName, kube.Describe(p))
			}
			b, err := c.Client.CoreV1().Pods(c.namespace).GetLogs(p.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
			if err != nil {
				return fmt.Errorf("logs: %w", err)
			}
			logs = string(b)
			return nil
		})
		t.Logf("pod %s printed:\n%s", p.Name, logs)
		if p.Spec.NodeName != n2.Name {
			t.Errorf("ran on %q, want %s", p.Spec.NodeName, n2.Name)
		}
		_, subnet, _ := net.ParseCIDR(node2Subnet)
		if ip := net.ParseIP(p.Status.PodIP); ip == nil || !subnet.Contains(ip) {
			t.Errorf("pod IP %q, want one of node 2's %s", p.Status.PodIP, node2Subnet)
		}
		if !strings.Contains(logs, "token ") || strings.Contains(logs, "token 0 bytes") {
			t.Errorf("logs %q: want the token's length", logs)
		}
		// Without a cgroup namespace (cgroup v1, as on a hybrid host) the
		// container sees its cgroups' host paths: all under node 2's root.
		for _, line := range strings.Split(strings.TrimSpace(logs), "\n") {
			f := strings.SplitN(line, ":", 3)
			if len(f) != 3 || f[2] == "/" {
				continue
			}
			if !strings.HasPrefix(f[2], node2CgroupRoot+"/kubepods/") {
				t.Errorf("cgroup %q: not under node 2's %s/kubepods", line, node2CgroupRoot)
			}
		}
	})

	t.Run("taint", func(t *testing.T) {
		p := c.node2Pod(t, "node2-untolerated", false, "true")
		kube.Eventually(t, time.Minute, "pod "+p.Name+" unschedulable for node 2's taint", func() error {
			var err error
			if p, err = c.Client.CoreV1().Pods(c.namespace).Get(ctx, p.Name, metav1.GetOptions{}); err != nil {
				return err
			}
			for _, cond := range p.Status.Conditions {
				if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse && strings.Contains(cond.Message, "untolerated taint") {
					return nil
				}
			}
			return fmt.Errorf("phase %s on %q (%s)", p.Status.Phase, p.Spec.NodeName, kube.Describe(p))
		})
		if p.Spec.NodeName != "" {
			t.Errorf("scheduled to %q", p.Spec.NodeName)
		}
	})

	// Node 1's socket once more, after node 2's kubelet has run pods.
	if sock := filepath.Join(c.DevicePlugins, "kubelet.sock"); !isSocket(sock) {
		t.Errorf("%s: gone after node 2's pods", sock)
	}
}

// node2Pod makes a busybox pod for node 2 (its nodeSelector) running
// script once; tolerate says whether it tolerates node 2's taint.
func (c *cluster) node2Pod(t *testing.T, name string, tolerate bool, script string) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.namespace},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: new(int64),
			NodeSelector:                  map[string]string{"kubernetes.io/hostname": c.Node2.Name},
			Containers: []corev1.Container{{
				Name: "main", Image: busybox, ImagePullPolicy: corev1.PullNever,
				Command: []string{"sh", "-c", script},
			}},
		},
	}
	if tolerate {
		p.Spec.Tolerations = []corev1.Toleration{{Key: remoteClient, Operator: corev1.TolerationOpEqual,
			Value: "true", Effect: corev1.TaintEffectNoSchedule}}
	}
	return c.create(t, p)
}

func isSocket(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode()&os.ModeSocket != 0
}
