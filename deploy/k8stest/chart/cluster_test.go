package chart

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuwarden/gpuwarden/deploy/k8stest/kube"
)

// cluster is the cluster cluster.sh runs the test in.
type cluster struct{ *kube.Cluster }

func needCluster(t *testing.T) *cluster {
	t.Helper()
	return &cluster{kube.Need(t)}
}

// kubectlOut runs the cluster's kubectl.
func (c *cluster) kubectlOut(args ...string) (string, error) {
	out, err := exec.Command(c.Kubectl, append([]string{"--kubeconfig", c.Kubeconfig}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// workloadPod is a pod running simgpu's workload under the interposer, as
// the device plugin sets it up: script is its shell command.
//
// hostPID: simgpu's NVML reports each process by the pid it sees itself
// as, where NVIDIA's driver reports host pids; in the host's pid namespace
// the two agree, as the agent (hostPID too) needs.
//
// unshare --cgroup, mount -t cgroup2 (CAP_SYS_ADMIN): the interposer
// finds the control block the device plugin mounted at /run/gpuwarden/root
// only inside a cgroup namespace, and names its cgroup by the cgroup2 mount
// it sees; runc gives every container both on a cgroup v2 host. This
// host's layout is hybrid, where it gives neither (the interposer would run
// standalone, unseen by the enforcer: deploy/README.md), so the pod's first
// process makes the two as runc makes them there, rooted at the
// container's own cgroup, before anything loads CUDA.
func (c *cluster) workloadPod(t *testing.T, name string, res corev1.ResourceName, n int64, annotations map[string]string, script string) {
	t.Helper()
	c.createPod(t, c.workloadSpec(name, res, n, annotations, script))
}

// workloadSpec is workloadPod's pod, not created yet.
func (c *cluster) workloadSpec(name string, res corev1.ResourceName, n int64, annotations map[string]string, script string) *corev1.Pod {
	p := simgpuPod(name, simgpuMachine{state: c.simgpuState(), devices: 1, memory: simMemory}, script)
	p.Annotations = annotations
	p.Spec.Containers[0].Resources = corev1.ResourceRequirements{Limits: corev1.ResourceList{res: *resource.NewQuantity(n, resource.DecimalSI)}}
	return p
}

// simgpuMachine is the simulated machine an agent and its workloads share.
type simgpuMachine struct {
	state   string // the state file, in a host directory the pods mount
	devices int
	memory  string // each GPU's
}

// simgpuPod is a workload pod on machine m (see workloadPod) that asks for
// no GPU yet.
func simgpuPod(name string, m simgpuMachine, script string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: podNamespace},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: new(int64),
			HostPID:                       true,
			Containers: []corev1.Container{{
				Name: "main", Image: imageName, ImagePullPolicy: corev1.PullNever,
				Command: []string{"/usr/bin/unshare", "--cgroup", "/bin/sh", "-c",
					"mkdir -p /tmp/cgroup2 && mount -t cgroup2 cgroup2 /tmp/cgroup2 || exit 1; " + script},
				SecurityContext: &corev1.SecurityContext{
					Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"SYS_ADMIN"}}},
				Env: []corev1.EnvVar{
					{Name: "SIMGPU_STATE", Value: m.state},
					{Name: "SIMGPU_DEVICES", Value: strconv.Itoa(m.devices)},
					{Name: "SIMGPU_MEMORY", Value: m.memory},
				},
				VolumeMounts: []corev1.VolumeMount{{Name: "simgpu", MountPath: filepath.Dir(m.state)}},
			}},
			Volumes: []corev1.Volume{{Name: "simgpu", VolumeSource: corev1.VolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: filepath.Dir(m.state)}}}},
		},
	}
}

func (c *cluster) createPod(t *testing.T, p *corev1.Pod) {
	t.Helper()
	if _, err := c.Client.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s: %v", p.Name, err)
	}
}

// running waits for a pod to run, and returns it.
func (c *cluster) running(t *testing.T, ns, name string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	kube.Eventually(t, 3*time.Minute, "pod "+ns+"/"+name+" runs", func() error {
		p, err := c.Client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		switch p.Status.Phase {
		case corev1.PodRunning:
			pod = p
			return nil
		case corev1.PodFailed, corev1.PodSucceeded:
			logs, _ := c.logs(ns, name, "")
			t.Fatalf("pod %s: phase %s (%s); logs:\n%s", name, p.Status.Phase, kube.Describe(p), logs)
		}
		return fmt.Errorf("phase %s (%s)", p.Status.Phase, kube.Describe(p))
	})
	return pod
}

func (c *cluster) logs(ns, name, container string) (string, error) {
	b, err := c.Client.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{Container: container}).DoRaw(context.Background())
	return string(b), err
}

// series is one Prometheus sample: its labels and value.
type series struct {
	labels map[string]string
	value  float64
}

// metrics scrapes the agent's /metrics and returns the samples of name.
func metrics(agent, name string) ([]series, error) {
	resp, err := http.Get("http://" + agent + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/metrics: %s", resp.Status)
	}
	var out []series
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		s := series{labels: map[string]string{}}
		rest := strings.TrimPrefix(line, name)
		if strings.HasPrefix(rest, "{") {
			end := strings.LastIndex(rest, "}")
			for _, kv := range splitLabels(rest[1:end]) {
				k, v, _ := strings.Cut(kv, "=")
				s.labels[k] = strings.Trim(v, `"`)
			}
			rest = rest[end+1:]
		}
		if s.value, err = strconv.ParseFloat(strings.Fields(rest)[0], 64); err != nil {
			return nil, fmt.Errorf("%s: %w", line, err)
		}
		out = append(out, s)
	}
	return out, sc.Err()
}

// splitLabels splits `a="x",b="y,z"` at the commas between labels.
func splitLabels(s string) []string {
	var out []string
	quoted, start := false, 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '"':
			quoted = !quoted
		case ',':
			if !quoted {
				out = append(out, s[start:i])
				start = i + 1
			}
		}
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}

// podValue is the value of name's series for one pod's container "main";
// without one, the error names the series there are.
func podValue(agent, name, pod string, extra map[string]string) (float64, error) {
	ss, err := metrics(agent, name)
	if err != nil {
		return 0, err
	}
	var seen []string
	for _, s := range ss {
		match := s.labels["namespace"] == podNamespace && s.labels["pod"] == pod && s.labels["container"] == "main"
		for k, v := range extra {
			match = match && s.labels[k] == v
		}
		if match {
			return s.value, nil
		}
		seen = append(seen, fmt.Sprint(s.labels))
	}
	return 0, fmt.Errorf("no %s for %s/%s/main %v; there are %v", name, podNamespace, pod, extra, seen)
}

// smiContainers is `gpuwarden smi --json`'s containers, read from the agent.
func smiContainers(gpuwarden, agent string) ([]map[string]any, error) {
	out, err := exec.Command(gpuwarden, "smi", "--agent", "http://"+agent, "--json").Output()
	if err != nil {
		return nil, fmt.Errorf("smi: %w", err)
	}
	var v struct {
		Source     string           `json:"source"`
		Containers []map[string]any `json:"containers"`
	}
	if err := json.Unmarshal(out, &v); err != nil {
		return nil, fmt.Errorf("smi: %w: %s", err, out)
	}
	if v.Source != "agent" {
		return nil, fmt.Errorf("smi read %q, not the agent", v.Source)
	}
	return v.Containers, nil
}
