package chart

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/gpuwarden/gpuwarden/deploy/k8stest/kube"
)

const (
	draRelease = "gpuwarden-dra"
	draDriver  = "gpu.gpuwarden.io" // the driver, and its DeviceClass
	draMemory  = "15Gi"             // each of the node's two simulated GPUs
)

// draNode is what the DRA release is given: its own directories under the
// cluster's state, and a simulated machine of two 15 GiB GPUs.
type draNode struct {
	*cluster
	base   string // everything of the release's
	cdiDir string // containerd's CDI spec directory
	class  string // the DeviceClass its claims name; "": the driver's
}

func (d draNode) control() string { return filepath.Join(d.base, "control") }
func (d draNode) machine() simgpuMachine {
	return simgpuMachine{state: filepath.Join(d.base, "state", "simgpu.state"), devices: 2, memory: draMemory}
}

// TestDRAOnRealNode: the chart with the DRA driver on instead of the device
// plugin. The node's two GPUs are published as shareable devices; the
// cluster's scheduler packs claims onto them by memory and compute;
// prepared claims reach containers through CDI with their quota and the
// settings of their ShareConfig; bad settings refuse the claim; deleted
// pods and an agent restart leave nothing behind. Each step is a subtest,
// and each needs the ones before it.
func TestDRAOnRealNode(t *testing.T) {
	c := needCluster(t)
	top := t // the steps' cleanups run when the whole test ends
	d := draNode{cluster: c, base: filepath.Join(c.State, "gpuwarden-dra"), cdiDir: c.CDI}
	if d.cdiDir == "" {
		t.Fatal("GPUWARDEN_K8S_CDI_DIR is not set: cluster.sh names containerd's CDI spec directory")
	}
	root := kube.Repo(t)
	kubelet := filepath.Dir(filepath.Dir(c.PodResources)) // the kubelet's root directory
	ctx := context.Background()
	var agent string
	uuids := map[string]string{} // pod: the GPU its container was given

	steps := []struct {
		name string
		run  func(t *testing.T)
	}{
		{"install", func(t *testing.T) {
			if err := importImage(root, imageName, c.Ctr, c.Containerd, t.TempDir()); err != nil {
				t.Fatalf("agent image: %v", err)
			}
			c.labelGPUNode(t)
			c.helmInstallValues(t, top, draRelease, map[string]any{
				"fullnameOverride": draRelease,
				"config": map[string]any{
					"controlDir":      d.control(),
					"controlDirGrace": "10s",
					"ebpf":            map[string]any{"enabled": false},
					"nvml":            map[string]any{"library": "/usr/local/simgpu/libnvidia-ml.so.1"},
					"enforcement":     map[string]any{"stateFile": filepath.Join(d.base, "state", "settings.json")},
					"kubelet":         map[string]any{"podResourcesSocket": c.PodResources},
					"devicePlugin":    map[string]any{"enabled": false, "interposerPath": filepath.Join(d.base, "lib", "libgpuwarden.so")},
					"dra": map[string]any{"enabled": true, "cdiDir": d.cdiDir,
						"registrarDir": filepath.Join(kubelet, "plugins_registry"),
						"pluginDir":    filepath.Join(kubelet, "plugins", draDriver)},
				},
				"tracefs": false,
				"env": []any{
					map[string]any{"name": "SIMGPU_STATE", "value": d.machine().state},
					map[string]any{"name": "SIMGPU_DEVICES", "value": "2"},
					map[string]any{"name": "SIMGPU_MEMORY", "value": draMemory},
				},
			})
			c.workloadNamespace(t, top, podNamespace) // after the install: its pods go before the agent
			if _, err := c.Client.ResourceV1().DeviceClasses().Get(ctx, draDriver, metav1.GetOptions{}); err != nil {
				t.Errorf("DeviceClass %s: %v", draDriver, err)
			}
		}},

		// Ready means the slice is published; it must be there within 10 s,
		// one shareable device per GPU with both capacities.
		{"slices", func(t *testing.T) {
			pod := c.agentPod(t, "")
			agent = pod.Status.PodIP + ":9477"
			start := time.Now()
			kube.Eventually(t, 10*time.Second, "the node's ResourceSlice", func() error {
				devs, err := d.publishedDevices(ctx)
				if err != nil {
					return err
				}
				if len(devs) != 2 {
					return fmt.Errorf("%d devices, want 2: %+v", len(devs), devs)
				}
				for _, dv := range devs {
					mem, comp := dv.Capacity["memory"], dv.Capacity["compute"]
					if dv.AllowMultipleAllocations == nil || !*dv.AllowMultipleAllocations ||
						mem.Value.Cmp(resource.MustParse(draMemory)) != 0 || comp.Value.Value() != 100 ||
						dv.Attributes["uuid"].StringValue == nil {
						return fmt.Errorf("device %s: %+v", dv.Name, dv)
					}
				}
				return nil
			})
			t.Logf("slice published %v after the agent was Ready", time.Since(start).Round(time.Millisecond))
		}},

		// 6 and 8 GiB fit one 15 GiB GPU; 4 more does not, and goes to the
		// other; 12 fits neither and waits, unscheduled, with the reason.
		{"packing", func(t *testing.T) {
			// One claim at a time: what is measured is where the allocator
			// puts a claim beside an allocation it knows, not how the
			// scheduler treats two claims whose allocations are both still
			// in flight (it may spread them).
			d.claim(t, "c6", "6Gi", "", "")
			d.claimPod(t, "p6", "c6", overQuota("5Gi", "2Gi"))
			uuids["p6"] = d.given(t, "p6", "6Gi")
			d.claim(t, "c8", "8Gi", "", "")
			d.claimPod(t, "p8", "c8", "exec sleep 3600")
			uuids["p8"] = d.given(t, "p8", "8Gi")
			if uuids["p6"] != uuids["p8"] {
				t.Errorf("6 and 8 GiB on two GPUs (%s, %s), want one", uuids["p6"], uuids["p8"])
			}
			d.claim(t, "c4", "4Gi", "", "")
			d.claimPod(t, "p4", "c4", "exec sleep 3600")
			if uuids["p4"] = d.given(t, "p4", "4Gi"); uuids["p4"] == uuids["p6"] {
				t.Errorf("4 GiB on the GPU that has 1 GiB left (%s)", uuids["p4"])
			}
			d.claim(t, "c12", "12Gi", "", "")
			d.claimPod(t, "p12", "c12", "exec sleep 3600")
			d.unschedulable(t, "p12")
		}},

		// The 6 GiB pod holds 5 and is refused 2 more; the agent names the
		// pod and its 6 GiB limit.
		{"quota", func(t *testing.T) {
			c.tryAllocs(t, "p6", 1)
			reportsQuota(t, agent, "p6", 6*gib)
		}},

		// Deleted pods: their claims are unprepared, their CDI specs gone
		// within 5 s and their control directories with them.
		{"cleanup", func(t *testing.T) {
			d.deletePods(t, "p6", "p8", "p4", "p12")
			// The kubelet unprepares a gone pod's claims at its next
			// housekeeping (1-2 s measured); the bound is wide for a
			// loaded machine, the figure is logged.
			start := time.Now()
			kube.Eventually(t, 15*time.Second, "no CDI spec and no claim directory", d.nothingPrepared)
			t.Logf("unprepared %v after the pods were gone", time.Since(start).Round(time.Millisecond))
		}},

		// Weights 1 and 2 from the claims' ShareConfigs, both on one GPU:
		// the targets are 1:2 and the device time near it.
		{"weights", func(t *testing.T) {
			busy := "exec /usr/local/simgpu/workload --alloc 256Mi --seconds 1800 --kernel-ns 1000000"
			for name, w := range map[string]int{"w1": 1, "w2": 2} {
				d.claim(t, "c"+name, "1Gi", "", fmt.Sprintf(`{"apiVersion": "gpu.gpuwarden.io/v1alpha1", "kind": "ShareConfig", "weight": %d}`, w))
				d.claimPod(t, name, "c"+name, busy)
			}
			if a, b := d.given(t, "w1", "1Gi"), d.given(t, "w2", "1Gi"); a != b {
				t.Fatalf("w1 and w2 on two GPUs (%s, %s)", a, b)
			}
			holdsWeights(t, agent, "w1", "w2")
			d.deletePods(t, "w1", "w2")
		}},

		// Compute is a capacity too: 60% and 50% never share a GPU.
		{"compute", func(t *testing.T) {
			kube.Eventually(t, 30*time.Second, "the weights' claims unprepared", d.nothingPrepared)
			d.claim(t, "c60", "1Gi", "60", "")
			d.claimPod(t, "k60", "c60", "exec sleep 3600")
			a := d.given(t, "k60", "1Gi")
			d.claim(t, "c50", "1Gi", "50", "")
			d.claimPod(t, "k50", "c50", "exec sleep 3600")
			if b := d.given(t, "k50", "1Gi"); a == b {
				t.Errorf("compute 60 and 50 on one GPU (%s)", a)
			}
		}},

		// The claim the README shows users is one the API server takes,
		// and the driver prepares with its weight.
		{"readme", func(t *testing.T) {
			tmpl := readmeClaimTemplate(t, filepath.Join(root, "README.md"))
			tmpl.Namespace = podNamespace
			if _, err := c.Client.ResourceV1().ResourceClaimTemplates(podNamespace).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
				t.Fatalf("the README's ResourceClaimTemplate: %v", err)
			}
			p := simgpuPod("readme", d.machine(), "env | grep -E '^(GPUWARDEN|CUDA)_' | sed 's/^/env: /'; exec sleep 3600")
			p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: &tmpl.Name}}
			p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
			d.createPod(t, p)
			d.given(t, "readme", "3Gi")
			if out, _ := d.logs(podNamespace, "readme", ""); !strings.Contains(out, "env: GPUWARDEN_COMPUTE_WEIGHT=2\n") {
				t.Errorf("the README's claim: weight 2 not in the environment:\n%s", out)
			}
			d.deletePods(t, "readme")
		}},

		// A ShareConfig with weight 0, or a field the driver does not know:
		// the claim is refused, the pod never starts, its events say why.
		{"refused", func(t *testing.T) {
			for name, cfg := range map[string]string{
				"bad-weight": `{"apiVersion": "gpu.gpuwarden.io/v1alpha1", "kind": "ShareConfig", "weight": 0}`,
				"bad-field":  `{"apiVersion": "gpu.gpuwarden.io/v1alpha1", "kind": "ShareConfig", "wieght": 2}`,
			} {
				d.claim(t, "c-"+name, "1Gi", "", cfg)
				d.claimPod(t, name, "c-"+name, "exec sleep 3600")
			}
			for name, why := range map[string]string{"bad-weight": "weight 0: want an integer from 1 to 1000", "bad-field": `unknown field "wieght"`} {
				kube.Eventually(t, 2*time.Minute, name+"'s events say why", func() error {
					return d.eventSays(ctx, name, why)
				})
				p, err := c.Client.CoreV1().Pods(podNamespace).Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if p.Status.Phase == corev1.PodRunning {
					t.Errorf("%s runs with a refused claim", name)
				}
				d.deletePods(t, name)
			}
		}},

		// 100 pods, 20 at a time, each with a claim from a template (a small
		// one, so that 20 fit), created and deleted: nothing is left behind,
		// neither claims nor specs nor directories.
		{"cycles", func(t *testing.T) {
			d.deletePods(t, "k60", "k50")
			small := &resourceapi.ExactDeviceRequest{DeviceClassName: draDriver, Capacity: &resourceapi.CapacityRequirements{
				Requests: map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse("64Mi"), "compute": resource.MustParse("1")}}}
			tmpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "small", Namespace: podNamespace},
				Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
					Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: small}}}}}}
			if _, err := c.Client.ResourceV1().ResourceClaimTemplates(podNamespace).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			for batch := 0; batch < 100; batch += 20 {
				var names []string
				for i := batch; i < batch+20; i++ {
					name := fmt.Sprintf("cycle-%03d", i)
					p := simgpuPod(name, d.machine(), "exec sleep 3600")
					p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: &tmpl.Name}}
					p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
					d.createPod(t, p)
					names = append(names, name)
				}
				for _, name := range names {
					d.running(t, podNamespace, name)
				}
				d.deletePods(t, names...)
			}
			kube.Eventually(t, time.Minute, "no claims left", func() error {
				claims, err := c.Client.ResourceV1().ResourceClaims(podNamespace).List(ctx, metav1.ListOptions{})
				if err != nil {
					return err
				}
				if len(claims.Items) > 0 {
					return fmt.Errorf("%d claims left", len(claims.Items))
				}
				return nil
			})
			kube.Eventually(t, 30*time.Second, "nothing prepared", d.nothingPrepared)
			t.Logf("100 pods created and deleted in %v", time.Since(start).Round(time.Second))
		}},

		// The agent restarted between a claim's prepare and its unprepare:
		// the new agent still removes what the old one wrote.
		{"agent-restart", func(t *testing.T) {
			d.claim(t, "cr", "1Gi", "", "")
			d.claimPod(t, "r1", "cr", "exec sleep 3600")
			d.given(t, "r1", "1Gi")
			old := c.agentPod(t, "")
			zero := int64(0)
			if err := c.Client.CoreV1().Pods(namespace).Delete(ctx, old.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
				t.Fatal(err)
			}
			d.deletePods(t, "r1")
			c.agentPod(t, old.UID)
			kube.Eventually(t, 2*time.Minute, "r1's claim unprepared by the new agent", d.nothingPrepared)
		}},
	}
	for _, s := range steps {
		if !t.Run(s.name, s.run) {
			c.dumpAgent(t)
			return
		}
	}
}

// readmeClaimTemplate is the ResourceClaimTemplate in the README's yaml
// blocks, decoded strictly.
func readmeClaimTemplate(t *testing.T, readme string) *resourceapi.ResourceClaimTemplate {
	t.Helper()
	var tmpl resourceapi.ResourceClaimTemplate
	readmeObject(t, readme, "ResourceClaimTemplate", &tmpl)
	return &tmpl
}

// readmeObject decodes strictly into out the first of the README's yaml
// blocks that is of kind.
func readmeObject(t *testing.T, readme, kind string, out any) {
	t.Helper()
	b, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	for _, block := range strings.Split(string(b), "```yaml\n")[1:] {
		block, _, _ = strings.Cut(block, "```")
		if !strings.Contains(block, "\nkind: "+kind+"\n") {
			continue
		}
		if err := yaml.UnmarshalStrict([]byte(block), out); err != nil {
			t.Fatalf("the README's %s: %v\n%s", kind, err, block)
		}
		return
	}
	t.Fatalf("%s shows no %s", readme, kind)
}

// publishedDevices are the devices of the driver's slices for the node.
func (d draNode) publishedDevices(ctx context.Context) ([]resourceapi.Device, error) {
	slices, err := d.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
		FieldSelector: "spec.driver=" + draDriver + ",spec.nodeName=" + d.Node})
	if err != nil {
		return nil, err
	}
	var devs []resourceapi.Device
	for _, s := range slices.Items {
		devs = append(devs, s.Spec.Devices...)
	}
	return devs, nil
}

// claim makes a ResourceClaim of one device of the driver's class, asking
// for memory and compute ("": the device's default) with an opaque config.
func (d draNode) claim(t *testing.T, name, memory, compute, config string) {
	t.Helper()
	class := d.class
	if class == "" {
		class = draDriver
	}
	req := &resourceapi.ExactDeviceRequest{DeviceClassName: class,
		Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{}}}
	if memory != "" {
		req.Capacity.Requests["memory"] = resource.MustParse(memory)
	}
	if compute != "" {
		req.Capacity.Requests["compute"] = resource.MustParse(compute)
	}
	rc := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: podNamespace},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: req}}}}}
	if config != "" {
		rc.Spec.Devices.Config = []resourceapi.DeviceClaimConfiguration{{Requests: []string{"gpu"},
			DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
				Driver: draDriver, Parameters: runtime.RawExtension{Raw: []byte(config)}}}}}
	}
	if _, err := d.Client.ResourceV1().ResourceClaims(podNamespace).Create(context.Background(), rc, metav1.CreateOptions{}); err != nil {
		t.Fatalf("claim %s: %v", name, err)
	}
}

// claimPod runs script in a workload pod whose container holds claim; it
// prints its environment's gpuwarden and CUDA lines first.
func (d draNode) claimPod(t *testing.T, name, claim, script string) {
	t.Helper()
	p := simgpuPod(name, d.machine(), "env | grep -E '^(GPUWARDEN|CUDA)_' | sed 's/^/env: /'; "+script)
	p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claim}}
	p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
	d.createPod(t, p)
}

// given waits for pod to run with memoryLimit as its quota, and returns
// the GPU its environment names.
func (d draNode) given(t *testing.T, pod, memoryLimit string) string {
	t.Helper()
	d.running(t, podNamespace, pod)
	env := map[string]string{}
	kube.Eventually(t, time.Minute, pod+"'s environment", func() error {
		out, err := d.logs(podNamespace, pod, "")
		if err != nil {
			return err
		}
		for _, line := range strings.Split(out, "\n") {
			if kv, ok := strings.CutPrefix(line, "env: "); ok {
				k, v, _ := strings.Cut(kv, "=")
				env[k] = v
			}
		}
		if env["CUDA_VISIBLE_DEVICES"] == "" {
			return fmt.Errorf("no CUDA_VISIBLE_DEVICES in %q", out)
		}
		return nil
	})
	if env["GPUWARDEN_MEMORY_LIMIT"] != memoryLimit {
		t.Errorf("%s: GPUWARDEN_MEMORY_LIMIT %q, want %s (environment %v)", pod, env["GPUWARDEN_MEMORY_LIMIT"], memoryLimit, env)
	}
	return env["CUDA_VISIBLE_DEVICES"]
}

// unschedulable waits for the scheduler to say why pod cannot run anywhere,
// and checks that it stays so.
func (d draNode) unschedulable(t *testing.T, pod string) {
	t.Helper()
	ctx := context.Background()
	var why string
	kube.Eventually(t, 2*time.Minute, pod+" unschedulable", func() error {
		p, err := d.Client.CoreV1().Pods(podNamespace).Get(ctx, pod, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Reason == corev1.PodReasonUnschedulable && cond.Message != "" {
				why = cond.Message
				return nil
			}
		}
		return fmt.Errorf("phase %s on %q (%s)", p.Status.Phase, p.Spec.NodeName, kube.Describe(p))
	})
	time.Sleep(5 * time.Second)
	p, err := d.Client.CoreV1().Pods(podNamespace).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Status.Phase != corev1.PodPending || p.Spec.NodeName != "" {
		t.Errorf("%s: phase %s on %q, want Pending and unscheduled", pod, p.Status.Phase, p.Spec.NodeName)
	}
	t.Logf("%s: %s", pod, why)
}

// deletePods deletes pods at once, waits until they are gone, and deletes
// the claims they named (those from a template go with their pod).
func (d draNode) deletePods(t *testing.T, names ...string) {
	t.Helper()
	ctx := context.Background()
	zero := int64(0)
	var claims []string
	for _, name := range names {
		p, err := d.Client.CoreV1().Pods(podNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, rc := range p.Spec.ResourceClaims {
			if rc.ResourceClaimName != nil {
				claims = append(claims, *rc.ResourceClaimName)
			}
		}
		if err := d.Client.CoreV1().Pods(podNamespace).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			t.Fatal(err)
		}
	}
	kube.Eventually(t, 2*time.Minute, fmt.Sprintf("pods %v gone", names), func() error {
		for _, name := range names {
			if _, err := d.Client.CoreV1().Pods(podNamespace).Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return fmt.Errorf("%s still there (%v)", name, err)
			}
		}
		return nil
	})
	for _, claim := range claims {
		if err := d.Client.ResourceV1().ResourceClaims(podNamespace).Delete(ctx, claim, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
	}
}

// nothingPrepared: no claim's CDI spec and no claim's control directory.
func (d draNode) nothingPrepared() error {
	var left []string
	specs, _ := filepath.Glob(filepath.Join(d.cdiDir, draDriver+"-*"))
	left = append(left, specs...)
	dirs, _ := filepath.Glob(filepath.Join(d.control(), "claim-*"))
	left = append(left, dirs...)
	if len(left) > 0 {
		return fmt.Errorf("left: %v", left)
	}
	return nil
}

// eventSays finds an event of pod whose message holds why.
func (d draNode) eventSays(ctx context.Context, pod, why string) error {
	evs, err := d.Client.CoreV1().Events(podNamespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod})
	if err != nil {
		return err
	}
	var msgs []string
	for _, e := range evs.Items {
		if strings.Contains(e.Message, why) {
			return nil
		}
		msgs = append(msgs, e.Reason+": "+e.Message)
	}
	b, _ := json.Marshal(msgs)
	return errors.New("events: " + string(b))
}
