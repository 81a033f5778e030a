package k8stest

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	podresources "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpuwarden/gpuwarden/deploy/k8stest/kube"
)

const (
	resGPU    corev1.ResourceName = "gpuwarden.io/gpu"
	resMemory corev1.ResourceName = "gpuwarden.io/gpu-memory"
	// simgpu's one device: 16 GiB, so 4 slots of 4 GiB at the default maxInst.
	simMemory = "16Gi"
	busybox   = "gpuwarden.test/busybox:1" // imported by cluster.sh; never pulled
)

// cluster is the cluster cluster.sh runs the test in; its pods go in
// namespace.
type cluster struct {
	*kube.Cluster
	namespace string
}

func needCluster(t *testing.T) *cluster {
	t.Helper()
	return &cluster{Cluster: kube.Need(t), namespace: "default"}
}

// startAgent runs bin/gpuwarden agent as a node's agent runs, outside any
// pod: the device plugin on, in the real kubelet's directories, simgpu as
// the GPU. eBPF is off: this test is about the kubelet, and the agent's
// probes have tests of their own. It returns the control directory.
func startAgent(t *testing.T, c *cluster) string {
	t.Helper()
	dir := t.TempDir()
	control := filepath.Join(dir, "control")
	cmd := exec.Command(kube.Bin(t, "gpuwarden"), "agent", "--listen", "127.0.0.1:0")
	cmd.Env = append(ownEnv(),
		"SIMGPU_STATE="+filepath.Join(dir, "simgpu.state"), "SIMGPU_DEVICES=1", "SIMGPU_MEMORY="+simMemory,
		"GPUWARDEN_NVML_LIBRARY="+kube.Bin(t, "simgpu/libnvidia-ml.so.1"),
		"GPUWARDEN_EBPF_ENABLED=false",
		"GPUWARDEN_CONTROL_DIR="+control,
		"GPUWARDEN_ENFORCEMENT_API_TOKEN_FILE="+filepath.Join(dir, "token"),
		"GPUWARDEN_ENFORCEMENT_STATE_FILE="+filepath.Join(dir, "settings.json"),
		"GPUWARDEN_NODE_NAME="+c.Node,
		"GPUWARDEN_KUBELET_POD_RESOURCES_SOCKET="+c.PodResources,
		"GPUWARDEN_DEVICE_PLUGIN_ENABLED=true",
		"GPUWARDEN_DEVICE_PLUGIN_KUBELET_DIR="+c.DevicePlugins,
		"GPUWARDEN_DEVICE_PLUGIN_INTERPOSER_PATH="+kube.Bin(t, "libgpuwarden.so"),
	)
	startLogged(t, filepath.Join(dir, "agent.log"), cmd)
	return control
}

// startLogged starts cmd with its output in logPath, which the test's log
// shows if the test fails. It dies with the test process, even when a
// timeout kills it before the cleanups run; at the end it gets SIGINT, and
// SIGKILL 30 s later.
func startLogged(t *testing.T, logPath string, cmd *exec.Cmd) {
	t.Helper()
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", cmd.Path, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		logFile.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("%s:\n%s", logPath, b)
		}
	})
}

// ownEnv is the test's environment without gpuwarden's and simgpu's
// variables, so the agent's settings are the test's alone.
func ownEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GPUWARDEN_") && !strings.HasPrefix(kv, "SIMGPU_") {
			env = append(env, kv)
		}
	}
	return env
}

// pod makes a busybox pod asking for n of res; its container prints its
// environment and mount table, then sleeps.
func (c *cluster) pod(t *testing.T, name string, res corev1.ResourceName, n int64) *corev1.Pod {
	t.Helper()
	q := *resource.NewQuantity(n, resource.DecimalSI)
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.namespace},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{
				Name: "main", Image: busybox, ImagePullPolicy: corev1.PullNever,
				Command:   []string{"sh", "-c", "env; echo ==mounts==; cat /proc/self/mountinfo; echo ==end==; exec sleep 3600"},
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{res: q}},
			}},
		},
	}
	return c.create(t, p)
}

// create creates pod p, deleted at once when the test ends.
func (c *cluster) create(t *testing.T, p *corev1.Pod) *corev1.Pod {
	t.Helper()
	name := p.Name
	p, err := c.Client.CoreV1().Pods(c.namespace).Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s: %v", name, err)
	}
	t.Cleanup(func() {
		zero := int64(0)
		_ = c.Client.CoreV1().Pods(c.namespace).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	})
	return p
}

// output is what a pod's container printed: its environment and its mounts
// by mount point (each line of /proc/self/mountinfo).
type output struct {
	env    map[string]string
	mounts map[string][]string
}

func (c *cluster) output(t *testing.T, name string) output {
	t.Helper()
	var out output
	kube.Eventually(t, 2*time.Minute, "pod "+name+" prints its environment and mounts", func() error {
		p, err := c.Client.CoreV1().Pods(c.namespace).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		switch p.Status.Phase {
		case corev1.PodRunning:
		case corev1.PodFailed, corev1.PodSucceeded:
			t.Fatalf("pod %s: phase %s (%s)", name, p.Status.Phase, kube.Describe(p))
		default:
			return fmt.Errorf("phase %s (%s)", p.Status.Phase, kube.Describe(p))
		}
		b, err := c.Client.CoreV1().Pods(c.namespace).GetLogs(name, &corev1.PodLogOptions{}).DoRaw(context.Background())
		if err != nil {
			return fmt.Errorf("logs: %w", err)
		}
		if !strings.Contains(string(b), "==end==") {
			return fmt.Errorf("output not complete yet")
		}
		out = output{env: map[string]string{}, mounts: map[string][]string{}}
		inMounts := false
		sc := bufio.NewScanner(strings.NewReader(string(b)))
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "==mounts==":
				inMounts = true
			case line == "==end==":
				return nil
			case inMounts:
				if f := strings.Fields(line); len(f) > 5 {
					out.mounts[f[4]] = f
				}
			default:
				if k, v, ok := strings.Cut(line, "="); ok {
					out.env[k] = v
				}
			}
		}
		return nil
	})
	return out
}

var uuidRe = regexp.MustCompile(`^GPU-[0-9a-fA-F-]+$`)

// TestDevicePluginOnRealKubelet: the agent registers both resources with a
// real kubelet; the node offers them; pods that fit run with the
// environment and mounts Allocate gave them, bound to the agent's control
// block for them, and the kubelet's pod-resources API reports their
// devices; a pod asking for more than the node has stays Pending.
func TestDevicePluginOnRealKubelet(t *testing.T) {
	c := needCluster(t)
	control := startAgent(t, c)
	ctx := context.Background()

	// 1 GPU of 16 GiB: 4 slots and 16 GiB.
	want := map[corev1.ResourceName]int64{resGPU: 4, resMemory: 16}
	kube.Eventually(t, 2*time.Minute, "the node offers gpuwarden's resources", func() error {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, c.Node, metav1.GetOptions{})
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

	for _, tc := range []struct {
		pod   string
		res   corev1.ResourceName
		n     int64
		limit string // GPUWARDEN_MEMORY_LIMIT
		dir   string // the control directory's prefix (allocation.DirName)
	}{
		{"slot", resGPU, 1, "4Gi", "slot-"},
		{"memory", resMemory, 3, "3Gi", "mem-"},
	} {
		t.Run(tc.pod, func(t *testing.T) {
			c.pod(t, tc.pod, tc.res, tc.n)
			out := c.output(t, tc.pod)
			for k, v := range map[string]string{
				"GPUWARDEN_MEMORY_LIMIT": tc.limit,
				"GPUWARDEN_CONTROL_DIR":  "/run/gpuwarden",
				"LD_PRELOAD":             "/usr/local/gpuwarden/lib/libgpuwarden.so",
			} {
				if out.env[k] != v {
					t.Errorf("%s=%q, want %q", k, out.env[k], v)
				}
			}
			uuid := out.env["NVIDIA_VISIBLE_DEVICES"]
			if !uuidRe.MatchString(uuid) || out.env["CUDA_VISIBLE_DEVICES"] != uuid {
				t.Errorf("NVIDIA_VISIBLE_DEVICES=%q CUDA_VISIBLE_DEVICES=%q: want one GPU UUID in both",
					uuid, out.env["CUDA_VISIBLE_DEVICES"])
			}
			// Mounts: mountinfo's fields are id, parent, dev, root (the
			// source's path), mount point, options.
			lib := out.mounts["/usr/local/gpuwarden/lib/libgpuwarden.so"]
			if lib == nil || !hasOpt(lib[5], "ro") || !strings.HasSuffix(lib[3], "/libgpuwarden.so") {
				t.Errorf("interposer mount: %v, want libgpuwarden.so read-only", lib)
			}
			// The kubelet's pod-resources API, which the agent reads for its
			// labels, holds the same devices.
			ids := c.podDevices(t, tc.pod, "main", tc.res)
			if int64(len(ids)) != tc.n {
				t.Errorf("pod-resources: %s holds %v, want %d devices", tc.res, ids, tc.n)
			}
			for _, id := range ids {
				if !strings.HasPrefix(id, uuid+"::") {
					t.Errorf("pod-resources: device %s is not on GPU %s", id, uuid)
				}
			}
			prefix := filepath.Join(control, tc.dir+uuid+"-")
			for file, opt := range map[string]string{"limits": "ro", "usage": "rw"} {
				m := out.mounts["/run/gpuwarden/root/"+file]
				if m == nil || !hasOpt(m[5], opt) || !strings.HasPrefix(m[3], prefix) || filepath.Base(m[3]) != file {
					t.Errorf("%s mount: %v, want %s<ids hash>/%s, %s", file, m, prefix, file, opt)
					continue
				}
				if _, err := os.Stat(m[3]); err != nil {
					t.Errorf("%s on the host: %v", file, err)
				}
			}
		})
	}

	// 17 GiB on a node of 16: the scheduler never places it.
	c.pod(t, "too-big", resMemory, 17)
	kube.Eventually(t, 2*time.Minute, "too-big is unschedulable", func() error {
		p, err := c.Client.CoreV1().Pods(c.namespace).Get(ctx, "too-big", metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse &&
				cond.Reason == corev1.PodReasonUnschedulable && strings.Contains(cond.Message, "Insufficient "+string(resMemory)) {
				return nil
			}
		}
		return fmt.Errorf("phase %s, node %q (%s)", p.Status.Phase, p.Spec.NodeName, kube.Describe(p))
	})
	time.Sleep(5 * time.Second) // and stays so
	p, err := c.Client.CoreV1().Pods(c.namespace).Get(ctx, "too-big", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Status.Phase != corev1.PodPending || p.Spec.NodeName != "" {
		t.Errorf("too-big: phase %s on node %q, want Pending and unscheduled", p.Status.Phase, p.Spec.NodeName)
	}
}

// podDevices is the device ids of res that the kubelet's pod-resources API
// reports for one container.
func (c *cluster) podDevices(t *testing.T, pod, container string, res corev1.ResourceName) []string {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+c.PodResources, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("pod-resources: %v", err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := podresources.NewPodResourcesListerClient(conn).List(ctx, &podresources.ListPodResourcesRequest{})
	if err != nil {
		t.Fatalf("pod-resources list: %v", err)
	}
	var ids []string
	for _, p := range resp.GetPodResources() {
		if p.GetNamespace() != c.namespace || p.GetName() != pod {
			continue
		}
		for _, ct := range p.GetContainers() {
			if ct.GetName() != container {
				continue
			}
			for _, d := range ct.GetDevices() {
				if d.GetResourceName() == string(res) {
					ids = append(ids, d.GetDeviceIds()...)
				}
			}
		}
	}
	return ids
}

func hasOpt(opts, want string) bool {
	for _, o := range strings.Split(opts, ",") {
		if o == want {
			return true
		}
	}
	return false
}
