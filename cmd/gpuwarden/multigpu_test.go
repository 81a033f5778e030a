package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/agentapi"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuwarden/gpuwarden/collector/kubelet/kubelettest"
	"github.com/gpuwarden/gpuwarden/deploy/allocation"
	"github.com/gpuwarden/gpuwarden/enforcer/hostcgroup"
	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

// multiGPUNode is a simulated node of several GPUs with the agent serving
// its device plugin, and a test kubelet that allocates slots to pods.
type multiGPUNode struct {
	m     *simtest.Machine
	agent *simtest.Agent
	kl    *kubelettest.DevicePlugins
	pr    *kubelettest.PodResources
	uuids []string // by NVML index
	next  map[string]int
	pods  []kubelettest.Pod
	cgMnt string
}

// podOnGPU is a pod whose one container was allocated slots of one GPU.
type podOnGPU struct {
	name string
	gpu  int
	cg   *simtest.Cgroup
	w    *simtest.Proc
}

// gpuUUIDs is each GPU's UUID by NVML index, as the agent lists them; the
// agent must list gpus GPUs.
func gpuUUIDs(t *testing.T, agent *simtest.Agent, gpus int) []string {
	t.Helper()
	var devs agentapi.DevicesResponse
	agent.GetJSON(t, "/api/v1/devices", &devs)
	if len(devs.Devices) != gpus {
		t.Fatalf("NVML lists %d GPUs, want %d", len(devs.Devices), gpus)
	}
	uuids := make([]string, gpus)
	for _, d := range devs.Devices {
		uuids[d.Index] = d.UUID
	}
	return uuids
}

func startMultiGPUNode(t *testing.T, gpus, maxInst int) *multiGPUNode {
	t.Helper()
	n := &multiGPUNode{m: simtest.NewMachine(t, gpus, "16Gi"), kl: kubelettest.StartDevicePlugins(t),
		pr: kubelettest.StartPodResources(t), next: map[string]int{}}
	n.agent = simtest.StartAgent(t, n.m, "GPUWARDEN_DEVICE_PLUGIN_ENABLED=true",
		"GPUWARDEN_DEVICE_PLUGIN_KUBELET_DIR="+n.kl.Dir,
		"GPUWARDEN_DEVICE_PLUGIN_INTERPOSER_PATH="+simtest.Bin(t, "libgpuwarden.so"),
		fmt.Sprintf("GPUWARDEN_DEVICE_PLUGIN_MAX_INST=%d", maxInst),
		"GPUWARDEN_KUBELET_POD_RESOURCES_SOCKET="+n.pr.Socket, "GPUWARDEN_NODE_NAME=node-m")
	n.kl.WaitDevices(t, allocation.ResourceGPU, func(d []*pluginapi.Device) bool { return len(d) == gpus*maxInst })
	n.uuids = gpuUUIDs(t, n.agent, gpus)
	mnt, err := hostcgroup.Mount("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	n.cgMnt = mnt
	return n
}

// start allocates slots of GPU gpu to pod name through the device plugin,
// as the kubelet would, and runs a training workload in the container the
// allocation describes: its environment (CUDA_VISIBLE_DEVICES=<uuid>, so its
// GPU is ordinal 0) and its control directory mounted as its own, in a
// cgroup namespace of its own.
func (n *multiGPUNode) start(t *testing.T, name string, gpu, slots int) *podOnGPU {
	t.Helper()
	uuid := n.uuids[gpu]
	var ids []string
	for range slots {
		ids = append(ids, fmt.Sprintf("%s::slot-%d", uuid, n.next[uuid]))
		n.next[uuid]++
	}
	resp, err := n.kl.Client(t, allocation.ResourceGPU).Allocate(context.Background(),
		&pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}})
	if err != nil {
		t.Fatalf("allocate %v: %v", ids, err)
	}
	n.pods = append(n.pods, kubelettest.Pod{Namespace: "ml", Name: name, Containers: []kubelettest.Container{
		{Name: "main", Devices: map[string][]string{allocation.ResourceGPU: ids}}}})
	n.pr.SetPods(n.pods...)

	view := t.TempDir()
	if err := os.Symlink(filepath.Join(n.agent.ControlDir, allocation.DirName(ids)), filepath.Join(view, allocation.ContainerKey)); err != nil {
		t.Fatal(err)
	}
	cg := simtest.NewCgroup(t, name)
	cmd := cg.Place(n.m.Command("unshare", "--cgroup", "--mount", "--propagation", "private", "sh", "-c",
		`umount -l "$0" && mount -t cgroup2 none "$0" && exec "$@"`, n.cgMnt,
		simtest.Bin(t, "simgpu/workload"), "--alloc", "1Gi", "--seconds", "300", "--kernels", "8", "--kernel-ns", "2000000"))
	for k, v := range resp.ContainerResponses[0].Envs {
		switch k {
		case "GPUWARDEN_CONTROL_DIR":
			v = view
		case "LD_PRELOAD":
			v = simtest.Bin(t, "libgpuwarden.so")
		}
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	w := simtest.Start(t, cmd)
	w.WaitLine(t, "ready", 20*time.Second)
	return &podOnGPU{name: name, gpu: gpu, cg: cg, w: w}
}

// stop ends a pod's workload and drops it from pod-resources.
func (n *multiGPUNode) stop(t *testing.T, p *podOnGPU) {
	t.Helper()
	if err := p.w.Cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_, _ = p.w.Wait()
	for i, q := range n.pods {
		if q.Name == p.name {
			n.pods = append(n.pods[:i], n.pods[i+1:]...)
			break
		}
	}
	n.pr.SetPods(n.pods...)
}

// shares averages each pod's measured share of its GPU over samples views
// (NVML's utilization is a one-second window); a pod the API does not list
// on its GPU has none.
func (n *multiGPUNode) shares(t *testing.T, pods []*podOnGPU, samples int) map[string]float64 {
	t.Helper()
	sum := map[string]float64{}
	for i := range samples {
		if i > 0 {
			time.Sleep(1100 * time.Millisecond) // the next view
		}
		var resp agentapi.ContainersResponse
		n.agent.GetJSON(t, "/api/v1/containers", &resp)
		for _, p := range pods {
			for _, c := range resp.Containers {
				if c.CgroupID == p.cg.ID && c.GPU == p.gpu {
					sum[p.name] += c.ComputeShare / float64(samples)
				}
			}
		}
	}
	return sum
}

// TestAgentSchedulesEachGPUByUUID: on a node of four GPUs, pods given their
// GPUs by the agent's device plugin each see their GPU as CUDA ordinal 0;
// the enforcer schedules each on its own GPU (found by the UUID the ledger
// records), so pods alone on their GPUs each get the whole of it under the
// weighted policy, and two pods sharing a GPU get their 1:2. Metrics and
// smi name each pod's physical GPU.
func TestAgentSchedulesEachGPUByUUID(t *testing.T) {
	simtest.RequirePrivileged(t, "cgroup and mount namespaces")
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Fatalf("unshare (util-linux) is needed: %v", err)
	}
	const gpus = 4
	n := startMultiGPUNode(t, gpus, 8)

	// Four pods on four GPUs, two slots each: weight 2, so every GPU is
	// under the weighted policy.
	var solo []*podOnGPU
	for g := range gpus {
		solo = append(solo, n.start(t, fmt.Sprintf("solo-%d", g), g, 2))
	}
	simtest.Eventually(t, 60*time.Second, func() error {
		var info []struct {
			UUID   string `json:"uuid"`
			Policy string `json:"policy"`
		}
		n.agent.GetJSON(t, "/api/v1/gpus", &info)
		if len(info) != gpus {
			return fmt.Errorf("the enforcer schedules %d GPUs, want %d: %+v", len(info), gpus, info)
		}
		for _, g := range info {
			if g.Policy != "weighted" {
				return fmt.Errorf("GPU %s is under %s, want weighted", g.UUID, g.Policy)
			}
		}
		sh := n.shares(t, solo, 4)
		for _, p := range solo {
			if sh[p.name] < 0.6 {
				return fmt.Errorf("shares %v: %s has %.2f of GPU %d, want its whole GPU (> 0.6)", sh, p.name, sh[p.name], p.gpu)
			}
		}
		t.Logf("pods alone on their GPUs: shares %v", sh)
		return nil
	})

	// Two pods share the last GPU, with one slot and two: weights 1 and 2.
	n.stop(t, solo[gpus-1])
	light := n.start(t, "light", gpus-1, 1)
	heavy := n.start(t, "heavy", gpus-1, 2)
	pods := append(solo[:gpus-1:gpus-1], light, heavy)
	simtest.Eventually(t, 90*time.Second, func() error {
		sh := n.shares(t, pods, 6)
		if sh["light"] == 0 || sh["heavy"]/sh["light"] < 1.4 || sh["heavy"]/sh["light"] > 2.8 {
			return fmt.Errorf("shares %v: heavy/light %.2f, want 2 (1.4-2.8)", sh, sh["heavy"]/sh["light"])
		}
		for _, p := range solo[:gpus-1] {
			if sh[p.name] < 0.6 {
				return fmt.Errorf("shares %v: %s has %.2f of GPU %d, want its whole GPU (> 0.6)", sh, p.name, sh[p.name], p.gpu)
			}
		}
		t.Logf("with two pods sharing GPU %d: shares %v (heavy/light %.2f)", gpus-1, sh, sh["heavy"]/sh["light"])
		return nil
	})

	// Metrics: each pod's series carry its physical GPU's index and UUID.
	simtest.Eventually(t, 15*time.Second, func() error {
		f := n.agent.Scrape(t)
		for _, p := range pods {
			want := map[string]string{"namespace": "ml", "pod": p.name, "container": "main"}
			s, ok := simtest.Find(f, "gpuwarden_container_gpu_memory_used_bytes", want)
			if !ok {
				return fmt.Errorf("no memory series of %s: %v", p.name, f["gpuwarden_container_gpu_memory_used_bytes"])
			}
			if s.Labels["gpu"] != fmt.Sprint(p.gpu) || s.Labels["uuid"] != n.uuids[p.gpu] {
				return fmt.Errorf("%s's series is on gpu %q uuid %q, want %d %s", p.name, s.Labels["gpu"], s.Labels["uuid"], p.gpu, n.uuids[p.gpu])
			}
			if s, ok := simtest.Find(f, "gpuwarden_container_kernel_launches_total", want); !ok || s.Value == 0 || s.Labels["gpu"] != fmt.Sprint(p.gpu) {
				return fmt.Errorf("%s's launches: %+v (listed %v), want some on gpu %d", p.name, s, ok, p.gpu)
			}
		}
		return nil
	})

	// ctl names a GPU by index or UUID alike.
	for _, arg := range []string{fmt.Sprint(gpus - 1), n.uuids[gpus-1]} {
		want := fmt.Sprintf("GPU %d (%s): policy weighted, max_inst 8,", gpus-1, n.uuids[gpus-1])
		if out, err := ctl(t, n.agent, "gpu", arg); err != nil || !strings.Contains(out, want) {
			t.Errorf("ctl gpu %s: %v: %s, want %q", arg, err, out, want)
		}
	}

	// smi lists each pod under its GPU.
	out, err := exec.Command(simtest.Bin(t, "gpuwarden"), "smi", "--agent", n.agent.Addr).CombinedOutput()
	if err != nil {
		t.Fatalf("smi: %v\n%s", err, out)
	}
	under := smiGPUOf(string(out))
	for _, p := range pods {
		if g, ok := under["ml/"+p.name+"/main"]; !ok || g != fmt.Sprint(p.gpu) {
			t.Errorf("smi shows %s under GPU %q (listed %v), want %d:\n%s", p.name, g, ok, p.gpu, out)
		}
	}
}

// smiGPUOf reads smi's table: the GPU each container row is listed under
// (the GPU row that opens its block).
func smiGPUOf(table string) map[string]string {
	out := map[string]string{}
	gpu := ""
	for _, line := range strings.Split(table, "\n") {
		if strings.HasPrefix(line, "+") {
			gpu = "" // a block ends
			continue
		}
		f := strings.Fields(strings.Trim(line, "|"))
		if len(f) < 2 {
			continue
		}
		switch {
		case gpu == "" && strings.HasPrefix(f[1], "simgpu"):
			gpu = f[0]
		case gpu != "" && f[0] == gpu && strings.Count(f[1], "/") == 2:
			out[f[1]] = gpu
		}
	}
	return out
}

// TestAgentSchedulesContainerOnTwoGPUs: a container that sees two GPUs in
// its own order (CUDA_VISIBLE_DEVICES=<GPU 2>,<GPU 0>) and runs a process
// on each is scheduled on both GPUs, and each process's launches are
// reported on the GPU it ran on.
func TestAgentSchedulesContainerOnTwoGPUs(t *testing.T) {
	simtest.RequirePrivileged(t, "eBPF and cgroups")
	m := simtest.NewMachine(t, 3, "16Gi")
	agent := simtest.StartAgent(t, m)
	uuids := gpuUUIDs(t, agent, 3)
	cg := simtest.NewCgroup(t, "two")
	ordinalGPU := []int{2, 0} // the container's ordinal 0 is GPU 2, ordinal 1 GPU 0
	pids := map[int]int{}     // GPU -> pid
	for ord, gpu := range ordinalGPU {
		cmd := cg.Place(m.Command(simtest.Bin(t, "simgpu/workload"), "--alloc", "256Mi", "--seconds", "300",
			"--kernels", "8", "--kernel-ns", "2000000", "--device", fmt.Sprint(ord)))
		cmd.Env = append(cmd.Env, "LD_PRELOAD="+simtest.Bin(t, "libgpuwarden.so"), "GPUWARDEN_CONTROL_DIR="+agent.ControlDir,
			"GPUWARDEN_COMPUTE_WEIGHT=2", "CUDA_VISIBLE_DEVICES="+uuids[2]+","+uuids[0])
		w := simtest.Start(t, cmd)
		w.WaitLine(t, "ready", 20*time.Second)
		pids[gpu] = w.Cmd.Process.Pid
	}
	simtest.Eventually(t, 30*time.Second, func() error {
		var info []struct {
			UUID       string `json:"uuid"`
			Containers int    `json:"containers"`
		}
		agent.GetJSON(t, "/api/v1/gpus", &info)
		on := map[string]int{}
		for _, g := range info {
			on[g.UUID] = g.Containers
		}
		if on[uuids[2]] != 1 || on[uuids[0]] != 1 || on[uuids[1]] != 0 {
			return fmt.Errorf("containers scheduled per GPU %v, want one on %s and %s", on, uuids[2], uuids[0])
		}
		var resp agentapi.ContainersResponse
		agent.GetJSON(t, "/api/v1/containers", &resp)
		for _, gpu := range ordinalGPU {
			var e *agentapi.ContainerDevice
			for i, c := range resp.Containers {
				if c.CgroupID == cg.ID && c.GPU == gpu {
					e = &resp.Containers[i]
				}
			}
			if e == nil {
				return fmt.Errorf("the container is not listed on GPU %d: %+v", gpu, resp.Containers)
			}
			if e.UUID != uuids[gpu] || e.Launches == 0 || !slices.Contains(e.PIDs, pids[gpu]) || len(e.PIDs) != 1 {
				return fmt.Errorf("on GPU %d: uuid %s, launches %v, pids %v; want %s, some launches, pid %d alone",
					gpu, e.UUID, e.Launches, e.PIDs, uuids[gpu], pids[gpu])
			}
		}
		return nil
	})
}

// TestOneProcessLaunchesReportedPerGPU: one process of a container that
// sees two GPUs (ordinal 0 is GPU 2, ordinal 1 GPU 0) launches on both, 6
// kernels a step on one and 2 on the other; /metrics reports each GPU's
// launches on that GPU (not all on the first the process holds memory on).
func TestOneProcessLaunchesReportedPerGPU(t *testing.T) {
	simtest.RequirePrivileged(t, "eBPF and cgroups")
	m := simtest.NewMachine(t, 3, "16Gi")
	agent := simtest.StartAgent(t, m)
	uuids := gpuUUIDs(t, agent, 3)
	cg := simtest.NewCgroup(t, "split")
	const steps, onFirst, onSecond = 400, 6, 2
	// It idles a while first, so that its launches are made under the
	// enforcer's gate, where the interposer knows each launch's device.
	cmd := cg.Place(m.Command(simtest.Bin(t, "simgpu/workload"), "--alloc", "256Mi", "--steps", fmt.Sprint(steps),
		"--kernels", fmt.Sprint(onFirst), "--kernel-ns", "100000", "--device", "0",
		"--also-device", "1", "--also-kernels", fmt.Sprint(onSecond), "--start-after", "3", "--hold-after"))
	cmd.Env = append(cmd.Env, "LD_PRELOAD="+simtest.Bin(t, "libgpuwarden.so"), "GPUWARDEN_CONTROL_DIR="+agent.ControlDir,
		"GPUWARDEN_COMPUTE_WEIGHT=2", "CUDA_VISIBLE_DEVICES="+uuids[2]+","+uuids[0])
	w := simtest.Start(t, cmd)
	w.WaitLine(t, "ready", 20*time.Second)
	done := w.WaitLine(t, "done", 60*time.Second)
	if want := fmt.Sprintf("done launches=%d also=%d", steps*onFirst, steps*onSecond); !strings.Contains(done, want) {
		t.Fatalf("workload: %q, want %q", done, want)
	}
	launched := map[int]float64{2: steps * onFirst, 0: steps * onSecond}
	simtest.Eventually(t, 15*time.Second, func() error {
		f := agent.Scrape(t)
		for gpu, n := range launched {
			s, ok := simtest.Find(f, "gpuwarden_container_kernel_launches_total",
				map[string]string{"gpu": fmt.Sprint(gpu), "uuid": uuids[gpu], "container": cg.Rel})
			if !ok {
				return fmt.Errorf("no launches series of the container on GPU %d: %v", gpu, f["gpuwarden_container_kernel_launches_total"])
			}
			if s.Value < 0.9*n || s.Value > 1.1*n {
				return fmt.Errorf("GPU %d: %v launches reported, %v launched there (want within 10%%)", gpu, s.Value, n)
			}
			t.Logf("GPU %d: %v launches reported, %v launched", gpu, s.Value, n)
		}
		if _, ok := simtest.Find(f, "gpuwarden_container_kernel_launches_total", map[string]string{"gpu": "1", "container": cg.Rel}); ok {
			return fmt.Errorf("launches reported on GPU 1, which the container does not see")
		}
		return nil
	})
}
