package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/agentapi"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuwarden/gpuwarden/collector/kubeapi"
	"github.com/gpuwarden/gpuwarden/collector/kubeapi/kubeapitest"
	"github.com/gpuwarden/gpuwarden/collector/kubelet/kubelettest"
	"github.com/gpuwarden/gpuwarden/deploy/allocation"
	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
	"github.com/gpuwarden/gpuwarden/enforcer/hostcgroup"
	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

const gib = 1 << 30

// TestAgentReportsContainers runs the real agent on simgpu with two
// "containers" (cgroups): one under the interposer with a quota, one that
// bypasses it. The scraped figures are what the workloads did.
func TestAgentReportsContainers(t *testing.T) {
	simtest.RequirePrivileged(t, "eBPF and cgroups")
	m := simtest.NewMachine(t, 2, "16Gi")
	agent := simtest.StartAgent(t, m, "GPUWARDEN_NODE_NAME=node-a")
	workload := simtest.Bin(t, "simgpu/workload")

	enforced, bypass := simtest.NewCgroup(t, "enforced"), simtest.NewCgroup(t, "bypass")
	cmd := enforced.Place(m.Command(workload, "--alloc", "1Gi", "--seconds", "60", "--kernels", "4", "--kernel-ns", "1000000"))
	cmd.Env = append(cmd.Env, "LD_PRELOAD="+simtest.Bin(t, "libgpuwarden.so"), "GPUWARDEN_CONTROL_DIR="+agent.ControlDir,
		"GPUWARDEN_MEMORY_LIMIT=4Gi")
	a := simtest.Start(t, cmd)
	a.WaitLine(t, "ready", 10*time.Second)
	b := simtest.Start(t, bypass.Place(m.Command(workload, "--device", "1", "--alloc", "2Gi", "--hold")))
	b.WaitLine(t, "ready", 10*time.Second)

	var enforcedSeries, bypassSeries map[string]string
	simtest.Eventually(t, 15*time.Second, func() error {
		f := agent.Scrape(t)
		enforcedSeries = map[string]string{"node": "node-a", "gpu": "0", "container": enforced.Rel}
		bypassSeries = map[string]string{"node": "node-a", "gpu": "1", "container": bypass.Rel}
		for _, want := range []struct {
			name   string
			labels map[string]string
			value  float64
		}{
			{"gpuwarden_container_gpu_memory_used_bytes", enforcedSeries, gib}, // eBPF: the allocation, byte for byte
			{"gpuwarden_container_gpu_memory_limit_bytes", enforcedSeries, 4 * gib},
			{"gpuwarden_container_unenforced", enforcedSeries, 0},
			{"gpuwarden_container_gpu_memory_used_bytes", bypassSeries, 2 * gib},
			{"gpuwarden_container_unenforced", bypassSeries, 1},
		} {
			s, ok := simtest.Find(f, want.name, want.labels)
			if !ok {
				return fmt.Errorf("no %s%v", want.name, want.labels)
			}
			if s.Value != want.value {
				return fmt.Errorf("%s%v = %v, want %v", want.name, want.labels, s.Value, want.value)
			}
		}
		if s, ok := simtest.Find(f, "gpuwarden_container_kernel_launches_total", enforcedSeries); !ok || s.Value < 4 {
			return fmt.Errorf("launches of the enforced container: %v %v", s.Value, ok)
		}
		if s, ok := simtest.Find(f, "gpuwarden_device_memory_total_bytes", map[string]string{"gpu": "1"}); !ok || s.Value != 16*gib {
			return fmt.Errorf("device 1 total: %v %v", s.Value, ok)
		}
		return nil
	})

	// The same through the API smi reads.
	var resp agentapi.ContainersResponse
	agent.GetJSON(t, "/api/v1/containers", &resp)
	found := false
	for _, c := range resp.Containers {
		if c.CgroupID == enforced.ID && c.GPU == 0 {
			found = true
			if !c.Enforced || c.MemoryLimitBytes != 4*gib || len(c.PIDs) == 0 {
				t.Errorf("API entry for the enforced container = %+v", c)
			}
		}
	}
	if !found {
		t.Errorf("API lists no entry for cgroup %d: %+v", enforced.ID, resp.Containers)
	}

	// A container that is gone leaves no series behind.
	if err := b.Cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_, _ = b.Wait()
	if err := os.Remove(bypass.Path); err != nil {
		t.Fatal(err)
	}
	simtest.Eventually(t, 10*time.Second, func() error {
		for name, samples := range agent.Scrape(t) {
			for _, s := range samples {
				if s.Labels["container"] == bypass.Rel {
					return fmt.Errorf("%s still has a series for the removed container", name)
				}
			}
		}
		return nil
	})
}

func TestAgentReadyAndHealth(t *testing.T) {
	simtest.RequirePrivileged(t, "eBPF")
	m := simtest.NewMachine(t, 1, "8Gi")
	agent := simtest.StartAgent(t, m)
	if code, body := agent.Get(t, "/healthz"); code != 200 || strings.TrimSpace(string(body)) != "ok" {
		t.Errorf("/healthz = %d %q", code, body)
	}
	var ready struct {
		Ready bool `json:"ready"`
		Parts map[string]struct {
			Enabled, Up bool
		} `json:"parts"`
	}
	agent.GetJSON(t, "/readyz", &ready)
	for _, p := range []string{"ebpf", "nvml", "cgroups", "http"} {
		if !ready.Parts[p].Up {
			t.Errorf("part %s is not up: %+v", p, ready)
		}
	}
	// Profiles are off unless http.pprof turns them on.
	if code, _ := agent.Get(t, "/debug/pprof/"); code != 404 {
		t.Errorf("/debug/pprof/ = %d, want 404", code)
	}
}

// A part that cannot start is reported, and the rest run.
func TestAgentRunsWithoutNVML(t *testing.T) {
	simtest.RequirePrivileged(t, "eBPF")
	m := simtest.NewMachine(t, 1, "8Gi")
	agent := simtest.StartAgent(t, m, "GPUWARDEN_NVML_LIBRARY="+filepath.Join(t.TempDir(), "libnvidia-ml.so.1"))
	code, body := agent.Get(t, "/readyz")
	if code != 503 || !strings.Contains(string(body), `"nvml":{"enabled":true,"up":false`) {
		t.Errorf("/readyz = %d %s; want 503 naming nvml down", code, body)
	}
	if code, _ := agent.Get(t, "/metrics"); code != 200 {
		t.Errorf("/metrics = %d without NVML", code)
	}
}

func TestAgentRefusesBadConfig(t *testing.T) {
	f := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(f, []byte("ebpf:\n  enabld: true\nenforcement:\n  onBypass: explode\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(simtest.Bin(t, "gpuwarden"), "agent", "--config", f).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "unknown keys: ebpf.enabld") {
		t.Errorf("agent with a bad config: %v, %s", err, out)
	}
	if err := os.WriteFile(f, []byte("ebpf:\n  launchWindow: 1h\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err = exec.Command(simtest.Bin(t, "gpuwarden"), "agent", "--config", f, "--check-config").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "ebpf.launchWindow") {
		t.Errorf("--check-config with a bad value: %v, %s", err, out)
	}
	out, err = exec.Command(simtest.Bin(t, "gpuwarden"), "agent", "--bogus").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "unknown flag: --bogus") {
		t.Errorf("agent --bogus: %v, %q", err, out)
	}
}

// TestAgentLabelsPodsFromKubelet: a container set up as the device plugin
// does (its allocation's control directory mounted at /run/gpuwarden/root,
// in a cgroup namespace) is named by the test kubelet's pod-resources answer,
// and held to its pod's annotations read from a test API server.
func TestAgentLabelsPodsFromKubelet(t *testing.T) {
	simtest.RequirePrivileged(t, "cgroup and mount namespaces")
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Fatalf("unshare (util-linux) is needed: %v", err)
	}
	ids := []string{"GPU-test::gpu-0"}
	kl := kubelettest.StartPodResources(t)
	kl.SetPods(kubelettest.Pod{Namespace: "ml", Name: "trainer-0", Containers: []kubelettest.Container{
		{Name: "main", Devices: map[string][]string{"gpuwarden.io/gpu": ids}},
	}})
	api := kubeapitest.StartTestServer(t)
	api.SetPods("node-k", kubeapi.Pod{Namespace: "ml", Name: "trainer-0",
		Annotations: map[string]string{"gpuwarden.io/compute-limit.main": "40%"}})
	m := simtest.NewMachine(t, 1, "16Gi")
	agent := simtest.StartAgent(t, m, "GPUWARDEN_KUBELET_POD_RESOURCES_SOCKET="+kl.Socket, "GPUWARDEN_NODE_NAME=node-k",
		"GPUWARDEN_KUBERNETES_API_SERVER="+api.URL, "GPUWARDEN_KUBERNETES_TOKEN_FILE="+api.TokenFile,
		"GPUWARDEN_KUBERNETES_CA_FILE="+api.CAFile)

	// The allocation's directory, seen from the container as <view>/root, as the plugin's mounts make it.
	allocDir := filepath.Join(agent.ControlDir, allocation.DirName(ids))
	view := t.TempDir()
	if err := os.MkdirAll(allocDir, 0o755); err != nil {
		t.Fatal(err)
	}
	lf, err := controlblock.CreateLimits(controlblock.LimitsPath(agent.ControlDir, allocation.DirName(ids)),
		controlblock.LimitsConfig{NDev: 1, MemLimit: [controlblock.MaxDevices]uint64{2 * gib}})
	if err != nil {
		t.Fatal(err)
	}
	lf.Close()
	if err := os.Symlink(allocDir, filepath.Join(view, allocation.ContainerKey)); err != nil {
		t.Fatal(err)
	}
	mnt, err := hostcgroup.Mount("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	cg := simtest.NewCgroup(t, "pod")
	// A container's view: its own cgroup namespace, cgroupfs mounted from it.
	cmd := cg.Place(m.Command("unshare", "--cgroup", "--mount", "--propagation", "private", "sh", "-c",
		`umount -l "$0" && mount -t cgroup2 none "$0" && exec "$@"`, mnt,
		simtest.Bin(t, "simgpu/workload"), "--alloc", "512Mi", "--seconds", "60", "--kernel-ns", "1000000"))
	cmd.Env = append(cmd.Env, "LD_PRELOAD="+simtest.Bin(t, "libgpuwarden.so"), "GPUWARDEN_CONTROL_DIR="+view)
	w := simtest.Start(t, cmd)
	w.WaitLine(t, "ready", 10*time.Second)

	labels := map[string]string{"namespace": "ml", "pod": "trainer-0", "container": "main", "gpu": "0"}
	simtest.Eventually(t, 15*time.Second, func() error {
		f := agent.Scrape(t)
		if s, ok := simtest.Find(f, "gpuwarden_container_gpu_memory_used_bytes", labels); !ok || s.Value != 512<<20 {
			return fmt.Errorf("memory used of ml/trainer-0/main: %v, %v; series: %v", s.Value, ok,
				f["gpuwarden_container_gpu_memory_used_bytes"])
		}
		if s, ok := simtest.Find(f, "gpuwarden_container_gpu_memory_limit_bytes", labels); !ok || s.Value != 2*gib {
			return fmt.Errorf("limit of ml/trainer-0/main: %v, %v", s.Value, ok)
		}
		// The pod's annotation caps it at 40% (read from the API server).
		if s, ok := simtest.Find(f, "gpuwarden_container_compute_limit_ratio", labels); !ok || s.Value != 0.4 {
			return fmt.Errorf("compute limit of ml/trainer-0/main: %v, %v", s.Value, ok)
		}
		return nil
	})
}

// TestAgentServesDevicePlugin: with devicePlugin.enabled the agent registers
// both resources with the kubelet and lists shares of simgpu's devices.
func TestAgentServesDevicePlugin(t *testing.T) {
	simtest.RequirePrivileged(t, "eBPF")
	kl := kubelettest.StartDevicePlugins(t)
	m := simtest.NewMachine(t, 2, "8Gi")
	simtest.StartAgent(t, m, "GPUWARDEN_DEVICE_PLUGIN_ENABLED=true", "GPUWARDEN_DEVICE_PLUGIN_KUBELET_DIR="+kl.Dir,
		"GPUWARDEN_DEVICE_PLUGIN_INTERPOSER_PATH="+simtest.Bin(t, "libgpuwarden.so"), "GPUWARDEN_DEVICE_PLUGIN_MAX_INST=3")
	slots := kl.WaitDevices(t, "gpuwarden.io/gpu", func(d []*pluginapi.Device) bool { return len(d) == 2*3 })
	mem := kl.WaitDevices(t, "gpuwarden.io/gpu-memory", func(d []*pluginapi.Device) bool { return len(d) == 2*8 })
	for _, d := range append(slots, mem...) {
		if d.Health != pluginapi.Healthy {
			t.Errorf("device %s is %s", d.ID, d.Health)
		}
	}
}
