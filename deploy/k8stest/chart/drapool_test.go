package chart

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpuwarden/gpuwarden/deploy/k8stest/kube"
)

const (
	poolRelease = "gpuwarden-pool"
	poolName    = "rack-1"
	poolLabel   = "gpu.gpuwarden.io/remote-pool"
	remoteClass = "remote.gpu.gpuwarden.io"
	poolSecret  = "gpuwarden-pool-remote"
)

// TestDRARemotePoolOnRealNodes: node 1 (one simulated 15 GiB GPU) serves
// remote sessions and offers its GPU to remote pool rack-1, node 2 (no GPU)
// is of the pool too. A claim of the remote class on node 2 runs simgpu's
// workload through node 2's relay on node 1's GPU, held there to the
// claim's memory and weight beside a local claim of the same GPU; a remote
// claim beyond what the GPU has left stays Pending with the scheduler's
// reason instead of failing at session start. Each step needs the ones
// before it.
func TestDRARemotePoolOnRealNodes(t *testing.T) {
	c := needCluster(t)
	if c.Node2.Name == "" {
		t.Fatal("GPUWARDEN_K8S_NODE2 is not set: cluster.sh brings up a second node without GPUs")
	}
	top := t
	base := filepath.Join(c.State, poolRelease)
	server := draNode{cluster: c, base: base, cdiDir: c.CDI}
	machine := simgpuMachine{state: filepath.Join(base, "state", "simgpu.state"), devices: 1, memory: "15Gi"}
	root := kube.Repo(t)
	kubelet1 := filepath.Dir(filepath.Dir(c.PodResources))
	ctx := context.Background()
	var agent string // node 1's agent: the server's metrics

	steps := []struct {
		name string
		run  func(t *testing.T)
	}{
		{"install", func(t *testing.T) {
			if err := importImage(root, imageName, c.Ctr, c.Containerd, t.TempDir()); err != nil { // both nodes'
				t.Fatalf("agent image: %v", err)
			}
			c.labelGPUNode(t)
			ip := c.nodeIP(t, c.Node)
			c.poolSecret(t, top, root, ip)
			for _, n := range []string{c.Node, c.Node2.Name} {
				c.labelNode(t, top, n, poolLabel, poolName)
			}
			lib := filepath.Join(base, "lib", "libgpuwarden.so")
			sessions := "gpuwarden-pool-sessions"
			top.Cleanup(func() { removeCgroup(top, sessions) }) // after the uninstall: cleanups run last first
			c.helmInstallValues(t, top, poolRelease, map[string]any{
				"fullnameOverride": poolRelease,
				"config": map[string]any{
					"controlDir":      filepath.Join(base, "control"),
					"controlDirGrace": "10s",
					"ebpf":            map[string]any{"enabled": false},
					"nvml":            map[string]any{"library": "/usr/local/simgpu/libnvidia-ml.so.1"},
					"enforcement":     map[string]any{"stateFile": filepath.Join(base, "state", "settings.json")},
					"kubelet":         map[string]any{"podResourcesSocket": c.PodResources},
					"devicePlugin":    map[string]any{"enabled": false, "interposerPath": lib},
					"dra": map[string]any{"enabled": true, "cdiDir": c.CDI, "remotePool": poolName,
						"registrarDir": filepath.Join(kubelet1, "plugins_registry"),
						"pluginDir":    filepath.Join(kubelet1, "plugins", draDriver)},
					// The test cluster's pod network has no host ports: clients dial
					// the agent's pod through the node's address with the portmap
					// plugin, as a real node's would.
					"remote": map[string]any{"enabled": true, "advertise": ip + ":7070",
						"libraryDir": filepath.Join(base, "remote-lib"), "cgroupParent": sessions},
				},
				"remote": map[string]any{"secretName": poolSecret},
				"remoteClients": map[string]any{"enabled": true, "config": map[string]any{
					"controlDir":  filepath.Join(base, "control-2"),
					"kubelet":     map[string]any{"podResourcesSocket": c.Node2.PodResources},
					"enforcement": map[string]any{"stateFile": filepath.Join(base, "state-2", "settings.json")},
					"dra": map[string]any{"cdiDir": c.Node2.CDI,
						"registrarDir": filepath.Join(c.Node2.KubeletDir, "plugins_registry"),
						"pluginDir":    filepath.Join(c.Node2.KubeletDir, "plugins", draDriver)},
					"devicePlugin": map[string]any{"kubeletDir": c.Node2.DevicePlugins},
				}},
				"tracefs": false,
				"env": []any{
					map[string]any{"name": "SIMGPU_STATE", "value": machine.state},
					map[string]any{"name": "SIMGPU_DEVICES", "value": "1"},
					map[string]any{"name": "SIMGPU_MEMORY", "value": machine.memory},
				},
			})
			c.workloadNamespace(t, top, podNamespace)
			for _, class := range []string{draDriver, remoteClass} {
				if _, err := c.Client.ResourceV1().DeviceClasses().Get(ctx, class, metav1.GetOptions{}); err != nil {
					t.Errorf("DeviceClass %s: %v", class, err)
				}
			}
			agent = c.agentPod(t, "").Status.PodIP + ":9477"
			c.readyAgent(t, "remote-client", c.Node2.Name, "")
		}},

		// Node 1's slice offers its GPU to the pool's nodes, with the
		// address its sessions are served at.
		{"offered", func(t *testing.T) {
			kube.Eventually(t, 30*time.Second, "node 1's GPU offered to the pool", func() error {
				slices, err := c.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
					FieldSelector: "spec.driver=" + draDriver + ",spec.pool.name=" + c.Node})
				if err != nil {
					return err
				}
				if len(slices.Items) != 1 || len(slices.Items[0].Spec.Devices) != 1 {
					return fmt.Errorf("slices %+v", slices.Items)
				}
				s := slices.Items[0].Spec
				sel, _ := json.Marshal(s.NodeSelector)
				if s.NodeName != nil || !strings.Contains(string(sel), poolLabel) || !strings.Contains(string(sel), poolName) {
					return fmt.Errorf("node name %v, node selector %s: want the pool's label", s.NodeName, sel)
				}
				if a := s.Devices[0].Attributes["server"].StringValue; a == nil || !strings.HasSuffix(*a, ":7070") {
					return fmt.Errorf("server attribute %v", a)
				}
				return nil
			})
		}},

		// A remote claim of 2 GiB on node 2: the workload holds 1 GiB through
		// the relay and is refused 2 more; node 1's agent reports the pod
		// with its 2 GiB limit. One process, which stays: a session's
		// counters go with it.
		{"quota", func(t *testing.T) {
			remoteClaim(t, c, "rq", "2Gi", "")
			c.remotePod(t, machine, "rq", "rq", "exec /usr/local/simgpu/workload --alloc 1Gi --try-alloc 2Gi --steps 1 --hold-after")
			c.tryAllocs(t, "rq", 1)
			reportsQuota(t, agent, "rq", 2*gib)
		}},

		// Weight 2 from a remote claim's ShareConfig beside a local claim of
		// weight 1 on the same GPU: node 1's enforcer targets them 1:2.
		{"weights", func(t *testing.T) {
			busy := "exec /usr/local/simgpu/workload --alloc 256Mi --seconds 1800 --kernel-ns 1000000"
			server.claim(t, "lw1", "1Gi", "", `{"apiVersion": "gpu.gpuwarden.io/v1alpha1", "kind": "ShareConfig", "weight": 1}`)
			p := simgpuPod("lw1", machine, busy)
			local := "lw1"
			p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &local}}
			p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
			c.createPod(t, p)
			remoteClaim(t, c, "rw2", "1Gi", `{"apiVersion": "gpu.gpuwarden.io/v1alpha1", "kind": "ShareConfig", "weight": 2}`)
			c.remotePod(t, machine, "rw2", "rw2", busy)
			c.running(t, podNamespace, "lw1")
			holdsWeights(t, agent, "lw1", "rw2")
		}},

		// The remote claim the README shows users: the API server takes it
		// and a pod on node 2 runs with it, through the relay.
		{"readme", func(t *testing.T) {
			var rc resourceapi.ResourceClaim
			readmeObject(t, filepath.Join(root, "README.md"), "ResourceClaim", &rc)
			rc.Namespace = podNamespace
			if _, err := c.Client.ResourceV1().ResourceClaims(podNamespace).Create(ctx, &rc, metav1.CreateOptions{}); err != nil {
				t.Fatalf("the README's ResourceClaim: %v", err)
			}
			c.remotePod(t, machine, "readme", rc.Name, "/usr/local/simgpu/workload --alloc 1Gi --steps 10 && echo remote-ok; exec sleep 3600")
			c.running(t, podNamespace, "readme")
			kube.Eventually(t, time.Minute, "the README's claim runs the workload remotely", func() error {
				out, err := c.logs(podNamespace, "readme", "")
				if err != nil || !strings.Contains(out, "remote-ok") || !strings.Contains(out, "env: GPUWARDEN_REMOTE=") {
					return fmt.Errorf("logs (%v):\n%s", err, out)
				}
				return nil
			})
		}},

		// 8 GiB of the GPU's 15 are claimed: a remote claim of 12 GiB waits,
		// unscheduled, with the scheduler's reason.
		{"pending", func(t *testing.T) {
			remoteClaim(t, c, "rbig", "12Gi", "")
			c.remotePod(t, machine, "rbig", "rbig", "exec sleep 3600")
			server.unschedulable(t, "rbig")
		}},
	}
	for _, s := range steps {
		if !t.Run(s.name, s.run) {
			c.dumpAgent(t)
			return
		}
	}
}

// nodeIP is a node's InternalIP.
func (c *cluster) nodeIP(t *testing.T, node string) string {
	t.Helper()
	n, err := c.Client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			return a.Address
		}
	}
	t.Fatalf("node %s has no InternalIP: %+v", node, n.Status.Addresses)
	return ""
}

// labelNode sets a label on node until owner ends.
func (c *cluster) labelNode(t, owner *testing.T, node, key, value string) {
	t.Helper()
	patch := func(v any) error {
		b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{key: v}}})
		_, err := c.Client.CoreV1().Nodes().Patch(context.Background(), node, types.StrategicMergePatchType, b, metav1.PatchOptions{})
		return err
	}
	if err := patch(value); err != nil {
		t.Fatalf("label node %s: %v", node, err)
	}
	owner.Cleanup(func() {
		if err := patch(nil); err != nil {
			owner.Errorf("unlabel node %s: %v", node, err)
		}
	})
}

// poolSecret makes the remote part's Secret as README "Remote GPUs" says:
// a CA, and a certificate for each node (node 1's also names the address
// clients dial), until owner ends.
func (c *cluster) poolSecret(t, owner *testing.T, root, ip string) {
	t.Helper()
	dir := t.TempDir()
	gw := filepath.Join(root, "bin", "gpuwarden")
	for _, args := range [][]string{{"certs", "ca", "--dir", dir},
		{"certs", "node", "--dir", dir, "--name", c.Node, "--hosts", c.Node + "," + ip},
		{"certs", "node", "--dir", dir, "--name", c.Node2.Name}} {
		if out, err := exec.Command(gw, args...).CombinedOutput(); err != nil {
			t.Fatalf("gpuwarden %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	data := map[string][]byte{}
	for _, f := range []string{"ca.crt", c.Node + ".crt", c.Node + ".key", c.Node2.Name + ".crt", c.Node2.Name + ".key"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		data[f] = b
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}
	if _, err := c.Client.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	secrets := c.Client.CoreV1().Secrets(namespace)
	if _, err := secrets.Create(context.Background(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: poolSecret}, Data: data},
		metav1.CreateOptions{}); err != nil {
		t.Fatalf("remote Secret: %v", err)
	}
	owner.Cleanup(func() { _ = secrets.Delete(context.Background(), poolSecret, metav1.DeleteOptions{}) })
}

// removeCgroup removes the cgroup v2 directory name below the tree's root
// (the server's session cgroups' parent), which the agent leaves.
func removeCgroup(t *testing.T, name string) {
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Error(err)
		return
	}
	for _, line := range strings.Split(string(mounts), "\n") {
		f := strings.Fields(line)
		if len(f) > 8 && f[len(f)-3] == "cgroup2" {
			dir := filepath.Join(f[4], name)
			for i := 0; i < 20; i++ {
				if err := os.Remove(dir); err == nil || os.IsNotExist(err) {
					break
				}
				time.Sleep(500 * time.Millisecond)
			}
			if _, err := os.Stat(dir); err == nil {
				t.Errorf("cgroup %s left", dir)
			}
		}
	}
}

// remoteClaim makes a ResourceClaim of one device of the remote class with
// memory and an opaque config.
func remoteClaim(t *testing.T, c *cluster, name, memory, config string) {
	t.Helper()
	draNode{cluster: c, class: remoteClass}.claim(t, name, memory, "", config)
}

// remotePod runs script on node 2 in a pod whose container holds claim.
func (c *cluster) remotePod(t *testing.T, m simgpuMachine, name, claim, script string) {
	t.Helper()
	p := simgpuPod(name, m, "env | grep -E '^(GPUWARDEN|CUDA|LD_LIBRARY)' | sed 's/^/env: /'; "+script)
	p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": c.Node2.Name}
	p.Spec.Tolerations = []corev1.Toleration{{Key: "gpuwarden.io/remote-client", Operator: corev1.TolerationOpExists}}
	p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claim}}
	p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
	c.createPod(t, p)
}
