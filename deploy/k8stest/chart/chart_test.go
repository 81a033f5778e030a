// Package chart installs gpuwarden's Helm chart on the real single-node
// cluster of deploy/k8stest/cluster.sh, with Helm's Go packages against the
// real API server, and runs simgpu's workload in pods under the agent the
// chart's DaemonSet starts. Its module, deploy/k8stest, has Helm's
// dependency tree, newer than the Kubernetes that cluster.sh builds
// (deploy/k8stest/kubernetes).
//
// What is real: the API server (admission, RBAC, schema), scheduler,
// kubelet (device manager, pod-resources API), containerd and runc; the
// chart as Helm renders and installs it; the agent as the DaemonSet's pod,
// from an image assembled here from bin/ and imported into containerd; the
// interposer as its init container installs it on the host; the device
// plugin's allocations; the workload's libcuda calls through the
// interposer. What stands in, and why:
//   - simgpu is the GPU (no GPU here); its state file is shared through a
//     hostPath, and the workload pods run in the host's pid namespace (see
//     workloadPod).
//   - The Prometheus Operator's CRDs cannot be fetched: the test installs
//     minimal CRDs of its own for ServiceMonitor and PrometheusRule (any
//     spec accepted), so the chart's two objects are created for real.
//   - There is no kube-proxy, so the Service's cluster IP leads nowhere:
//     the agent is given the API server's node address
//     (GPUWARDEN_KUBERNETES_API_SERVER) where it would use the in-cluster
//     one, and the test reaches the agent at its pod IP.
//   - eBPF is off in the agent: its pinned maps and probes are
//     machine-global, and this machine is shared with other runs; the eBPF
//     path has tests of its own.
package chart

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/release"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/cli-runtime/pkg/genericclioptions"

	"github.com/gpuwarden/gpuwarden/deploy/k8stest/kube"
)

const (
	chartDir     = "../../helm/gpuwarden"
	releaseName  = "gpuwarden"
	namespace    = "gpu-system"    // the chart's release
	podNamespace = "gpuwarden-e2e" // the workloads'
	imageName    = "gpuwarden.test/gpuwarden:e2e"
	simMemory    = "16Gi" // one simulated GPU: 4 slots of 4 GiB at maxInst 4
	gib          = 1 << 30

	resGPU    corev1.ResourceName = "gpuwarden.io/gpu"
	resMemory corev1.ResourceName = "gpuwarden.io/gpu-memory"
)

// Helm logs every symlink it follows (files/alerts, files/grafana).
func init() { log.SetOutput(io.Discard) }

// The host paths the chart is given, all under the cluster's state
// directory so that nothing of this run is machine-global.
func (c *cluster) controlDir() string { return filepath.Join(c.State, "gpuwarden", "control") }
func (c *cluster) interposer() string {
	return filepath.Join(c.State, "gpuwarden", "lib", "libgpuwarden.so")
}
func (c *cluster) stateFile() string {
	return filepath.Join(c.State, "gpuwarden", "state", "settings.json")
}

// simgpu's machine is in the settings' directory: the one host directory
// of the chart's that the agent may write and the workloads can share.
func (c *cluster) simgpuState() string {
	return filepath.Join(c.State, "gpuwarden", "state", "simgpu.state")
}

// TestChartOnRealNode: the chart installed with Helm runs the agent as the
// DaemonSet's pod; it registers the device plugin and installs the
// interposer; pods given shares of the GPU run simgpu's workload under it
// with their quota, names, weights and capacity; an agent restart keeps
// them; a deleted pod leaves nothing behind. Each step is a subtest, and
// each needs the ones before it.
func TestChartOnRealNode(t *testing.T) {
	c := needCluster(t)
	top := t // the steps' cleanups run when the whole test ends
	root := kube.Repo(t)
	ctx := context.Background()
	if c.Containerd == "" || c.Ctr == "" {
		t.Fatal("GPUWARDEN_K8S_CONTAINERD or GPUWARDEN_K8S_CTR is not set: cluster.sh names the cluster's containerd socket and its ctr")
	}
	if _, err := os.Stat(c.interposer()); err == nil {
		t.Fatalf("%s exists before the chart is installed", c.interposer())
	}
	var agent string // the agent pod's IP:port

	steps := []struct {
		name string
		run  func(t *testing.T)
	}{
		// helm install through Helm's Go packages: every object the chart
		// renders, created by the real API server, with the optional
		// ServiceMonitor, PrometheusRule and dashboards on.
		{"install", func(t *testing.T) {
			if err := importImage(root, imageName, c.Ctr, c.Containerd, t.TempDir()); err != nil {
				t.Fatalf("agent image: %v", err)
			}
			c.monitoringCRDs(t)
			c.labelGPUNode(t)
			rel := c.helmInstall(t, top)
			if rel.Info.Status != release.StatusDeployed {
				t.Fatalf("release %s: %s", rel.Name, rel.Info.Status)
			}
			for _, o := range []struct {
				gvr  schema.GroupVersionResource
				name string
			}{
				{schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "daemonsets"}, "gpuwarden"},
				{schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, "gpuwarden"},
				{schema.GroupVersionResource{Version: "v1", Resource: "services"}, "gpuwarden-agent"},
				{schema.GroupVersionResource{Version: "v1", Resource: "serviceaccounts"}, "gpuwarden"},
				{schema.GroupVersionResource{Group: "monitoring.coreos.com", Version: "v1", Resource: "servicemonitors"}, "gpuwarden"},
				{schema.GroupVersionResource{Group: "monitoring.coreos.com", Version: "v1", Resource: "prometheusrules"}, "gpuwarden"},
			} {
				u, err := c.Dynamic.Resource(o.gvr).Namespace(namespace).Get(ctx, o.name, metav1.GetOptions{})
				if err != nil {
					t.Errorf("%s %s: %v", o.gvr.Resource, o.name, err)
					continue
				}
				if u.GetLabels()["app.kubernetes.io/managed-by"] != "Helm" {
					t.Errorf("%s %s: labels %v", o.gvr.Resource, o.name, u.GetLabels())
				}
			}
			groups, _, err := unstructured.NestedSlice(c.get(t, "monitoring.coreos.com", "prometheusrules", "gpuwarden").Object, "spec", "groups")
			if err != nil || len(groups) == 0 {
				t.Errorf("PrometheusRule: spec.groups %v (%v), want the alert rules", groups, err)
			}
			cms, err := c.Client.CoreV1().ConfigMaps(namespace).List(ctx, metav1.ListOptions{LabelSelector: "grafana_dashboard=1"})
			if err != nil || len(cms.Items) == 0 {
				t.Errorf("dashboards: %d ConfigMaps (%v)", len(cms.Items), err)
			}
			if _, err := c.Client.RbacV1().ClusterRoleBindings().Get(ctx, "gpuwarden", metav1.GetOptions{}); err != nil {
				t.Errorf("ClusterRoleBinding: %v", err)
			}
		}},

		// The DaemonSet's pod: the init container put the interposer on
		// the host, the agent is Ready, and the device plugin it serves from
		// inside the pod is registered with the kubelet.
		{"agent-pod", func(t *testing.T) {
			pod := c.agentPod(t, "")
			agent = pod.Status.PodIP + ":9477"
			want, err := os.ReadFile(filepath.Join(root, "bin", "libgpuwarden.so"))
			if err != nil {
				t.Fatal(err)
			}
			if got, err := os.ReadFile(c.interposer()); err != nil || !bytes.Equal(got, want) {
				t.Errorf("the interposer on the host (%s): %d bytes (%v), want bin/libgpuwarden.so's %d", c.interposer(), len(got), err, len(want))
			}
			c.nodeOffers(t, map[corev1.ResourceName]int64{resGPU: 4, resMemory: 16})
		}},

		// A pod of one slot (4 GiB): one workload holds 3 GiB while others
		// ask for 2 GiB, again and again; the interposer refuses every one,
		// and the agent reports the limit and the refusals under the pod's
		// name.
		{"quota", func(t *testing.T) {
			c.workloadNamespace(t, top, podNamespace)
			c.workloadPod(t, "quota", resGPU, 1, nil, overQuota("3Gi", "2Gi"))
			c.running(t, podNamespace, "quota")
			c.tryAllocs(t, "quota", 1)
			reportsQuota(t, agent, "quota", 4*gib)
		}},

		// Two busy pods on the one GPU, weights 1 and 2 from their
		// annotations: smi and /metrics name all three pods by the
		// kubelet's pod-resources; the targets are 1:2 and the device time
		// they get is near it (wide bounds: a shared 2-core machine).
		{"weights", func(t *testing.T) {
			busy := "exec /usr/local/simgpu/workload --alloc 256Mi --seconds 1800 --kernel-ns 1000000"
			c.workloadPod(t, "w1", resGPU, 1, map[string]string{"gpuwarden.io/weight": "1"}, busy)
			c.workloadPod(t, "w2", resGPU, 1, map[string]string{"gpuwarden.io/weight": "2"}, busy)
			uids := map[string]string{}
			for _, name := range []string{"quota", "w1", "w2"} {
				uids[name] = string(c.running(t, podNamespace, name).UID)
			}
			gpuwarden := filepath.Join(root, "bin", "gpuwarden")
			kube.Eventually(t, 2*time.Minute, "smi names the three pods", func() error {
				cs, err := smiContainers(gpuwarden, agent)
				if err != nil {
					return err
				}
				seen := map[string]bool{}
				for _, ct := range cs {
					pod, _ := ct["pod"].(string)
					cg, _ := ct["cgroupPath"].(string)
					uid := uids[pod]
					if ct["namespace"] == podNamespace && ct["container"] == "main" && uid != "" &&
						(strings.Contains(cg, uid) || strings.Contains(cg, strings.ReplaceAll(uid, "-", "_"))) {
						seen[pod] = true
					}
				}
				if len(seen) != 3 {
					return fmt.Errorf("smi named %v in %v", seen, cs)
				}
				return nil
			})
			holdsWeights(t, agent, "w1", "w2")
		}},

		// A container that crashes is started again by the kubelet in a new
		// cgroup, on the same allocation: its ledger is bound to the new
		// cgroup, and the agent enforces it as before, with no breach.
		{"container-restart", func(t *testing.T) {
			p := c.workloadSpec("crasher", resGPU, 1, nil,
				"if [ -e /dev/shm/ran ]; then exec /usr/local/simgpu/workload --alloc 256Mi --seconds 1800 --kernel-ns 1000000; fi; "+
					"touch /dev/shm/ran; /usr/local/simgpu/workload --alloc 256Mi --seconds 2; exit 1")
			p.Spec.RestartPolicy = corev1.RestartPolicyAlways
			c.createPod(t, p)
			kube.Eventually(t, 3*time.Minute, "crasher runs again after its crash", func() error {
				p, err := c.Client.CoreV1().Pods(podNamespace).Get(ctx, "crasher", metav1.GetOptions{})
				if err != nil {
					return err
				}
				if cs := p.Status.ContainerStatuses; len(cs) == 1 && cs[0].RestartCount >= 1 && cs[0].State.Running != nil {
					return nil
				}
				return fmt.Errorf("phase %s, containers %+v", p.Status.Phase, p.Status.ContainerStatuses)
			})
			enforced := func() error {
				if v, err := podValue(agent, "gpuwarden_container_gpu_memory_limit_bytes", "crasher", nil); err != nil || v != 4*gib {
					return fmt.Errorf("gpu_memory_limit_bytes %v (%v), want 4 GiB", v, err)
				}
				if v, err := podValue(agent, "gpuwarden_container_unenforced", "crasher", nil); err != nil || v != 0 {
					return fmt.Errorf("unenforced %v (%v), want 0", v, err)
				}
				ss, err := metrics(agent, "gpuwarden_container_breach")
				if err != nil {
					return err
				}
				for _, s := range ss {
					if s.labels["pod"] == "crasher" && s.value != 0 {
						return fmt.Errorf("crasher in breach: %v", s.labels)
					}
				}
				return nil
			}
			kube.Eventually(t, 2*time.Minute, "the restarted container is enforced", enforced)
			time.Sleep(5 * time.Second) // past the judge's 2 s of evidence
			if err := enforced(); err != nil {
				t.Error(err)
			}
			if n := c.running(t, podNamespace, "crasher").Status.ContainerStatuses[0].RestartCount; n != 1 {
				t.Errorf("crasher restarted %d times, want once", n)
			}
		}},

		// 17 GiB on a node of 16: never scheduled.
		{"over-capacity", func(t *testing.T) {
			c.workloadPod(t, "too-big", resMemory, 17, nil, "exec sleep 3600")
			kube.Eventually(t, 2*time.Minute, "too-big is unschedulable", func() error {
				p, err := c.Client.CoreV1().Pods(podNamespace).Get(ctx, "too-big", metav1.GetOptions{})
				if err != nil {
					return err
				}
				for _, cond := range p.Status.Conditions {
					if cond.Type == corev1.PodScheduled && cond.Reason == corev1.PodReasonUnschedulable &&
						strings.Contains(cond.Message, "Insufficient "+string(resMemory)) {
						return nil
					}
				}
				return fmt.Errorf("phase %s on %q (%s)", p.Status.Phase, p.Spec.NodeName, kube.Describe(p))
			})
			time.Sleep(5 * time.Second)
			p, err := c.Client.CoreV1().Pods(podNamespace).Get(ctx, "too-big", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if p.Status.Phase != corev1.PodPending || p.Spec.NodeName != "" {
				t.Errorf("too-big: phase %s on %q, want Pending and unscheduled", p.Status.Phase, p.Spec.NodeName)
			}
		}},

		// A setting made with `gpuwarden ctl` in the agent's pod, then the
		// DaemonSet rolled (kubectl rollout restart's patch): the new pod
		// has the setting, and the pods that ran through it keep their quota.
		{"restart", func(t *testing.T) {
			old := c.agentPod(t, "")
			// w1 named as users name it: namespace/pod/container.
			target := podNamespace + "/w1/main"
			if out, err := c.kubectlOut("exec", "-n", namespace, old.Name, "-c", "agent", "--",
				"/usr/local/bin/gpuwarden", "ctl", "set", target, "--compute-limit", "20"); err != nil {
				t.Fatalf("ctl set: %v (%s)", err, out)
			}
			c.limitIs(t, agent, "w1", 0.2)
			before := c.tryAllocs(t, "quota", 1)
			patch := fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"kubectl.kubernetes.io/restartedAt":%q}}}}}`, time.Now().Format(time.RFC3339))
			if _, err := c.Client.AppsV1().DaemonSets(namespace).Patch(ctx, "gpuwarden", types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
				t.Fatalf("rollout: %v", err)
			}
			pod := c.agentPod(t, old.UID)
			agent = pod.Status.PodIP + ":9477"
			c.limitIs(t, agent, "w1", 0.2)
			c.tryAllocs(t, "quota", before+2)
			kube.Eventually(t, 2*time.Minute, "the new agent reports quota's limit", func() error {
				if v, err := podValue(agent, "gpuwarden_container_gpu_memory_limit_bytes", "quota", nil); err != nil || v != 4*gib {
					return fmt.Errorf("gpu_memory_limit_bytes %v (%v), want 4 GiB", v, err)
				}
				return nil
			})
			for _, name := range []string{"quota", "w1", "w2"} {
				p := c.running(t, podNamespace, name)
				if n := p.Status.ContainerStatuses[0].RestartCount; n != 0 {
					t.Errorf("%s restarted %d times", name, n)
				}
			}
		}},

		// A deleted pod: its series leave /metrics, and its allocation's
		// directory leaves the control directory once controlDirGrace passes.
		{"deleted", func(t *testing.T) {
			dirs := c.allocationDirs(t)
			zero := int64(0)
			if err := c.Client.CoreV1().Pods(podNamespace).Delete(ctx, "w2", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
				t.Fatal(err)
			}
			kube.Eventually(t, 3*time.Minute, "w2's series and directory go", func() error {
				ss, err := metrics(agent, "gpuwarden_container_gpu_memory_limit_bytes")
				if err != nil {
					return err
				}
				pods := map[string]bool{}
				for _, s := range ss {
					pods[s.labels["pod"]] = true
				}
				if pods["w2"] || !pods["w1"] {
					return fmt.Errorf("series of pods %v, want w1's and not w2's", pods)
				}
				if now := c.allocationDirs(t); len(now) != len(dirs)-1 {
					return fmt.Errorf("allocation directories %v, were %v: want one fewer", now, dirs)
				}
				return nil
			})
		}},
	}
	for _, s := range steps {
		if !t.Run(s.name, s.run) {
			c.dumpAgent(t)
			return
		}
	}
}

// helmInstall is `helm install gpuwarden deploy/helm/gpuwarden -n gpu-system
// --create-namespace` with the test's values, through Helm's Go packages;
// the release is uninstalled when owner (the test the steps are of) ends.
func (c *cluster) helmInstall(t, owner *testing.T) *release.Release {
	t.Helper()
	return c.helmInstallValues(t, owner, releaseName, map[string]any{
		"fullnameOverride": releaseName,
		"config": map[string]any{
			"controlDir":      c.controlDir(),
			"controlDirGrace": "10s",
			"ebpf":            map[string]any{"enabled": false},
			"nvml":            map[string]any{"library": "/usr/local/simgpu/libnvidia-ml.so.1"},
			"enforcement":     map[string]any{"stateFile": c.stateFile()},
			"kubelet":         map[string]any{"podResourcesSocket": os.Getenv("GPUWARDEN_K8S_POD_RESOURCES_SOCKET")},
			"devicePlugin":    map[string]any{"interposerPath": c.interposer()},
		},
		"tracefs": false,
		// simgpu's machine, shared with the workloads through the state
		// file's directory (a hostPath the chart mounts for its settings).
		"env": []any{
			map[string]any{"name": "SIMGPU_STATE", "value": c.simgpuState()},
			map[string]any{"name": "SIMGPU_DEVICES", "value": "1"},
			map[string]any{"name": "SIMGPU_MEMORY", "value": simMemory},
		},
		"serviceMonitor": map[string]any{"enabled": true},
		"prometheusRule": map[string]any{"enabled": true},
		"dashboards":     map[string]any{"enabled": true},
	})
}

// labelGPUNode labels the node for the chart's nodeSelector: a GPU node,
// as NVIDIA's feature discovery labels one.
func (c *cluster) labelGPUNode(t *testing.T) {
	t.Helper()
	patch := []byte(`{"metadata":{"labels":{"nvidia.com/gpu.present":"true"}}}`)
	if _, err := c.Client.CoreV1().Nodes().Patch(context.Background(), c.Node, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatalf("label node: %v", err)
	}
}

// helmInstallValues installs release name with vals, the agent's image and
// its API server added (env entries appended to vals' own), until owner
// ends.
func (c *cluster) helmInstallValues(t, owner *testing.T, name string, vals map[string]any) *release.Release {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("load chart: %v", err)
	}
	cfg := c.helmConfig(t)
	in := action.NewInstall(cfg)
	in.ReleaseName, in.Namespace, in.CreateNamespace, in.Timeout = name, namespace, true, 5*time.Minute
	node, err := c.Client.CoreV1().Nodes().Get(context.Background(), c.Node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var nodeIP string
	for _, a := range node.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			nodeIP = a.Address
		}
	}
	vals["image"] = map[string]any{"repository": strings.Split(imageName, ":")[0], "tag": strings.Split(imageName, ":")[1], "pullPolicy": "Never"}
	env, _ := vals["env"].([]any)
	vals["env"] = append(env, map[string]any{"name": "GPUWARDEN_KUBERNETES_API_SERVER", "value": "https://" + nodeIP + ":6443"})
	rel, err := in.Run(ch, vals)
	if err != nil {
		t.Fatalf("helm install: %v", err)
	}
	owner.Cleanup(func() {
		un := action.NewUninstall(c.helmConfig(owner))
		un.Wait, un.Timeout = true, 3*time.Minute
		if _, err := un.Run(name); err != nil {
			owner.Errorf("helm uninstall %s: %v", name, err)
		}
	})
	return rel
}

func (c *cluster) helmConfig(t *testing.T) *action.Configuration {
	t.Helper()
	flags := genericclioptions.NewConfigFlags(false)
	flags.KubeConfig = &c.Kubeconfig
	ns := namespace
	flags.Namespace = &ns
	cfg := new(action.Configuration)
	if err := cfg.Init(flags, namespace, "secret", func(string, ...any) {}); err != nil {
		t.Fatalf("helm: %v", err)
	}
	return cfg
}

// monitoringCRDs installs minimal CRDs for the Prometheus Operator's two
// kinds the chart makes (the real ones cannot be fetched here): any spec.
func (c *cluster) monitoringCRDs(t *testing.T) {
	t.Helper()
	gvr := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	for _, kind := range []string{"ServiceMonitor", "PrometheusRule"} {
		plural := strings.ToLower(kind) + "s"
		crd := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
			"metadata": map[string]any{"name": plural + ".monitoring.coreos.com"},
			"spec": map[string]any{
				"group": "monitoring.coreos.com", "scope": "Namespaced",
				"names": map[string]any{"kind": kind, "plural": plural, "singular": strings.ToLower(kind), "listKind": kind + "List"},
				"versions": []any{map[string]any{"name": "v1", "served": true, "storage": true,
					"schema": map[string]any{"openAPIV3Schema": map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}},
			},
		}}
		if _, err := c.Dynamic.Resource(gvr).Create(context.Background(), crd, metav1.CreateOptions{}); err != nil {
			t.Fatalf("CRD %s: %v", kind, err)
		}
		kube.Eventually(t, time.Minute, "CRD "+kind+" established", func() error {
			u, err := c.Dynamic.Resource(gvr).Get(context.Background(), plural+".monitoring.coreos.com", metav1.GetOptions{})
			if err != nil {
				return err
			}
			conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
			for _, cond := range conds {
				if m, ok := cond.(map[string]any); ok && m["type"] == "Established" && m["status"] == "True" {
					return nil
				}
			}
			return fmt.Errorf("conditions %v", conds)
		})
	}
}

// overQuota is a workload script that holds hold, then asks for more again
// and again, once a second.
func overQuota(hold, more string) string {
	return "/usr/local/simgpu/workload --alloc " + hold + " --hold >/tmp/holder & " +
		"until grep -q ready /tmp/holder; do sleep 0.2; done; cat /tmp/holder; " +
		"while :; do /usr/local/simgpu/workload --try-alloc " + more + " --steps 1; sleep 1; done"
}

// reportsQuota waits for the agent to report pod's memory limit and the
// allocations its quota refused.
func reportsQuota(t *testing.T, agent, pod string, limit float64) {
	t.Helper()
	kube.Eventually(t, 2*time.Minute, "the agent reports "+pod+"'s limit and refusals", func() error {
		if v, err := podValue(agent, "gpuwarden_container_gpu_memory_limit_bytes", pod, nil); err != nil || v != limit {
			return fmt.Errorf("gpu_memory_limit_bytes %v (%v), want %v", v, err, limit)
		}
		if v, err := podValue(agent, "gpuwarden_container_gpu_memory_alloc_failures_total", pod, map[string]string{"reason": "quota"}); err != nil || v < 1 {
			return fmt.Errorf("alloc_failures_total{reason=quota} %v (%v), want 1 or more", v, err)
		}
		return nil
	})
}

// holdsWeights checks that pods w1 and w2, busy on one GPU at weights 1
// and 2, are held to targets of 1:2 and get device time near it (wide
// bounds: a shared 2-core machine).
func holdsWeights(t *testing.T, agent, w1, w2 string) {
	t.Helper()
	var limits [2]float64
	kube.Eventually(t, 2*time.Minute, "the targets follow the weights", func() error {
		for i, pod := range []string{w1, w2} {
			v, err := podValue(agent, "gpuwarden_container_compute_limit_ratio", pod, nil)
			if err != nil || v <= 0 {
				return fmt.Errorf("%s: compute_limit_ratio %v (%v)", pod, v, err)
			}
			limits[i] = v
		}
		if r := limits[1] / limits[0]; math.Abs(r-2) > 0.1 {
			return fmt.Errorf("targets %v: %s/%s %.2f, want 2", limits, w2, w1, r)
		}
		return nil
	})
	// What they got: NVML's per-process utilization, summed over 20 samples.
	var got [2]float64
	for range 20 {
		time.Sleep(time.Second)
		for i, pod := range []string{w1, w2} {
			v, err := podValue(agent, "gpuwarden_container_compute_share_ratio", pod, nil)
			if err != nil {
				t.Fatal(err)
			}
			got[i] += v
		}
	}
	if got[0] <= 0 || got[1]/got[0] < 1.3 || got[1]/got[0] > 3.5 {
		t.Errorf("device time %s %.2f, %s %.2f: ratio %.2f, want about 2 (1.3-3.5)", w1, got[0], w2, got[1], got[1]/got[0])
	}
	t.Logf("targets %.3f:%.3f; device time %s %.2f, %s %.2f (ratio %.2f)", limits[0], limits[1], w1, got[0], w2, got[1], got[1]/got[0])
}

// workloadNamespace makes namespace ns for the test's workloads and, when
// owner ends, deletes it and waits until its pods are gone, before the
// agent that serves them is uninstalled (cleanups run last first).
func (c *cluster) workloadNamespace(t, owner *testing.T, ns string) {
	t.Helper()
	ctx := context.Background()
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	owner.Cleanup(func() {
		if err := c.Client.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil {
			owner.Errorf("delete namespace %s: %v", ns, err)
			return
		}
		deadline := time.Now().Add(3 * time.Minute)
		for {
			_, err := c.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return
			}
			if time.Now().After(deadline) {
				owner.Errorf("namespace %s not gone within 3 minutes (%v)", ns, err)
				return
			}
			time.Sleep(time.Second)
		}
	})
}

func (c *cluster) get(t *testing.T, group, resource, name string) *unstructured.Unstructured {
	t.Helper()
	u, err := c.Dynamic.Resource(schema.GroupVersionResource{Group: group, Version: "v1", Resource: resource}).
		Namespace(namespace).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("%s %s: %v", resource, name, err)
	}
	return u
}

// agentPod waits for the DaemonSet's one pod, other than the one of
// notUID, to be Ready on the node, and returns it.
func (c *cluster) agentPod(t *testing.T, notUID types.UID) *corev1.Pod {
	t.Helper()
	return c.readyAgent(t, "agent", c.Node, notUID)
}

// readyAgent waits for the one pod of the agent's DaemonSet of component
// (agent, remote-client), other than the one of notUID, to be Ready on
// node, and returns it.
func (c *cluster) readyAgent(t *testing.T, component, node string, notUID types.UID) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	kube.Eventually(t, 4*time.Minute, "the "+component+" pod on "+node+" is Ready", func() error {
		pods, err := c.Client.CoreV1().Pods(namespace).List(context.Background(), metav1.ListOptions{
			LabelSelector: "app.kubernetes.io/name=gpuwarden,app.kubernetes.io/component=" + component})
		if err != nil {
			return err
		}
		var states []string
		for i := range pods.Items {
			p := &pods.Items[i]
			ready := false
			for _, cond := range p.Status.Conditions {
				ready = ready || cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue
			}
			if p.UID != notUID && ready && p.DeletionTimestamp == nil && p.Spec.NodeName == node && len(pods.Items) == 1 {
				pod = p
				return nil
			}
			states = append(states, fmt.Sprintf("%s %s ready=%v (%s)", p.Name, p.Status.Phase, ready, kube.Describe(p)))
		}
		return fmt.Errorf("pods: %v", states)
	})
	return pod
}

// nodeOffers waits for the node's capacity and allocatable to be want.
func (c *cluster) nodeOffers(t *testing.T, want map[corev1.ResourceName]int64) {
	t.Helper()
	kube.Eventually(t, 2*time.Minute, "the node offers gpuwarden's resources", func() error {
		n, err := c.Client.CoreV1().Nodes().Get(context.Background(), c.Node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for res, v := range want {
			for what, list := range map[string]corev1.ResourceList{"capacity": n.Status.Capacity, "allocatable": n.Status.Allocatable} {
				if q, ok := list[res]; !ok || q.Value() != v {
					return fmt.Errorf("%s %s is %v, want %d", what, res, list[res], v)
				}
			}
		}
		return nil
	})
}

// tryAllocs waits until pod's workloads have tried their over-quota
// allocation at least n times, fails if any got it, and returns how many
// tries there were.
func (c *cluster) tryAllocs(t *testing.T, pod string, n int) int {
	t.Helper()
	var tries int
	kube.Eventually(t, 2*time.Minute, fmt.Sprintf("%s tries %d over-quota allocations", pod, n), func() error {
		out, err := c.logs(podNamespace, pod, "")
		if err != nil {
			return err
		}
		tries = 0
		for _, line := range strings.Split(out, "\n") {
			if res, ok := strings.CutPrefix(line, "try-alloc "); ok {
				if res != "CUDA_ERROR_OUT_OF_MEMORY" {
					t.Fatalf("%s: an allocation over its quota returned %s", pod, res)
				}
				tries++
			}
		}
		if tries < n {
			return fmt.Errorf("%d tries; output:\n%s", tries, out)
		}
		return nil
	})
	return tries
}

// limitIs waits for pod's compute_limit_ratio to be want.
func (c *cluster) limitIs(t *testing.T, agent, pod string, want float64) {
	t.Helper()
	kube.Eventually(t, 2*time.Minute, fmt.Sprintf("%s's compute limit is %.2f", pod, want), func() error {
		v, err := podValue(agent, "gpuwarden_container_compute_limit_ratio", pod, nil)
		if err != nil || math.Abs(v-want) > 0.005 {
			return fmt.Errorf("compute_limit_ratio %v (%v)", v, err)
		}
		return nil
	})
}

// allocationDirs lists the control directory's allocation directories.
func (c *cluster) allocationDirs(t *testing.T) []string {
	t.Helper()
	ents, err := os.ReadDir(c.controlDir())
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	for _, e := range ents {
		if e.IsDir() && (strings.HasPrefix(e.Name(), "slot-") || strings.HasPrefix(e.Name(), "mem-")) {
			dirs = append(dirs, e.Name())
		}
	}
	return dirs
}

// dumpAgent logs the agent pods' logs after a failed step.
func (c *cluster) dumpAgent(t *testing.T) {
	for _, ct := range []string{"install-interposer", "agent"} {
		out, err := c.kubectlOut("logs", "-n", namespace, "-l", "app.kubernetes.io/name=gpuwarden", "-c", ct, "--tail", "60")
		t.Logf("agent pods, container %s (%v):\n%s", ct, err, out)
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
