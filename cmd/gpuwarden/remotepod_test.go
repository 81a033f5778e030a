package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuwarden/gpuwarden/collector/kubeapi"
	"github.com/gpuwarden/gpuwarden/collector/kubeapi/kubeapitest"
	"github.com/gpuwarden/gpuwarden/collector/kubelet/kubelettest"
	"github.com/gpuwarden/gpuwarden/deploy/allocation"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/client"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/pki"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/session"
	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

// The pods of the client node, as the test API server knows them.
const (
	podUIDA = "0b0a0c0d-1111-2222-3333-444455556666"
	podUIDB = "0b0a0c0d-1111-2222-3333-777788889999"
)

// clientNode is a node without GPUs in the remote rig's client namespace:
// its agent runs the device plugin for remote GPUs (no NVML, no libcuda)
// against a test kubelet and a test API server.
type clientNode struct {
	agent *simtest.Agent
	kl    *kubelettest.DevicePlugins
	pr    *kubelettest.PodResources
	api   *kubeapitest.TestServer
}

func startClientNode(t *testing.T, r *remoteRig, env ...string) *clientNode {
	t.Helper()
	if err := pki.Issue(r.creds, r.creds, pki.Request{Name: "node-c", Node: "node-c", Validity: time.Hour}); err != nil {
		t.Fatal(err)
	}
	lis, err := r.client.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n := &clientNode{kl: kubelettest.StartDevicePlugins(t), pr: kubelettest.StartPodResources(t),
		api: kubeapitest.StartTestServerOn(t, lis)}
	env = append([]string{
		"GPUWARDEN_NODE_NAME=node-c",
		"GPUWARDEN_NVML_ENABLED=false", "GPUWARDEN_EBPF_ENABLED=false", "GPUWARDEN_ENFORCEMENT_ENABLED=false",
		"GPUWARDEN_DEVICE_PLUGIN_ENABLED=true", "GPUWARDEN_DEVICE_PLUGIN_KUBELET_DIR=" + n.kl.Dir,
		"GPUWARDEN_DEVICE_PLUGIN_MAX_INST=4", "GPUWARDEN_DEVICE_PLUGIN_HEALTH_INTERVAL=500ms",
		"GPUWARDEN_KUBELET_POD_RESOURCES_SOCKET=" + n.pr.Socket,
		"GPUWARDEN_KUBERNETES_API_SERVER=" + n.api.URL, "GPUWARDEN_KUBERNETES_TOKEN_FILE=" + n.api.TokenFile,
		"GPUWARDEN_KUBERNETES_CA_FILE=" + n.api.CAFile,
		"GPUWARDEN_REMOTE_SERVERS=" + serverAddr,
		"GPUWARDEN_REMOTE_CERT=" + filepath.Join(r.creds, "node-c.crt"),
		"GPUWARDEN_REMOTE_KEY=" + filepath.Join(r.creds, "node-c.key"),
		"GPUWARDEN_REMOTE_CA=" + filepath.Join(r.creds, "ca.crt"),
		"GPUWARDEN_REMOTE_TIMEOUT=2s", "GPUWARDEN_CONTROL_DIR_GRACE=2s",
		"GPUWARDEN_REMOTE_LIBRARY_DIR=" + filepath.Dir(simtest.Bin(t, "remote/libcuda.so.1"))}, env...)
	n.agent = simtest.StartAgentIn(t, simtest.NewMachine(t, 0, "1Gi"), r.client, env...)
	return n
}

// healthy is a WaitDevices condition: n devices, all healthy (or none).
func healthy(n int, want string) func([]*pluginapi.Device) bool {
	return func(d []*pluginapi.Device) bool {
		if len(d) != n {
			return false
		}
		for _, x := range d {
			if x.Health != want {
				return false
			}
		}
		return true
	}
}

// TestRemotePod: on a node without GPUs the device plugin advertises the
// server's GPU as gpuwarden.io/remote-gpu slots; a pod allocated two of
// them runs simgpu's workload remotely through its node's relay, and the
// server labels the session with the pod (asserted by the node's
// certificate, proven by the pod's cgroup) and gives it the allocation's
// memory; a process of another pod that reaches the socket is refused, and
// so is a workload's certificate naming the pod; the devices go unhealthy
// while the server is silent or down, healthy when it is back; the
// allocation's directory goes with its pod.
func TestRemotePod(t *testing.T) {
	for _, path := range dataPaths {
		t.Run(path, func(t *testing.T) { testRemotePod(t, path) })
	}
}

func testRemotePod(t *testing.T, path string) {
	r := newRemoteRig(t, false)
	n := startClientNode(t, r, "GPUWARDEN_REMOTE_DATA_PATH="+path)
	devs := n.kl.WaitDevices(t, allocation.ResourceRemote, healthy(4, pluginapi.Healthy))
	uuid, _, _ := strings.Cut(devs[0].ID, "::")
	if !strings.HasPrefix(uuid, "GPU-") {
		t.Fatalf("device %s: want a server GPU's UUID", devs[0].ID)
	}

	ids := []string{uuid + "::remote-0", uuid + "::remote-1"}
	resp, err := n.kl.Client(t, allocation.ResourceRemote).Allocate(context.Background(),
		&pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}})
	if err != nil {
		t.Fatalf("allocate %v: %v", ids, err)
	}
	car := resp.ContainerResponses[0]
	if car.Envs["GPUWARDEN_REMOTE"] != "unix:/run/gpuwarden/remote/driver.sock" || car.Envs["LD_LIBRARY_PATH"] != allocation.ContainerRemoteLib {
		t.Fatalf("env %v", car.Envs)
	}
	mounts := map[string]string{}
	for _, m := range car.Mounts {
		mounts[m.ContainerPath] = m.HostPath
	}
	sock := filepath.Join(mounts[allocation.ContainerRemoteDir], session.RelaySocket)
	if fi, err := os.Stat(sock); err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("the relay's socket %s: %v", sock, err)
	}
	if _, err := os.Stat(filepath.Join(mounts[allocation.ContainerRemoteLib], "libnvidia-ml.so.1")); err != nil {
		t.Fatalf("the client library's mount: %v", err)
	}
	n.pr.SetPods(kubelettest.Pod{Namespace: "ml", Name: "infer-0", Containers: []kubelettest.Container{
		{Name: "main", Devices: map[string][]string{allocation.ResourceRemote: ids}}}},
		kubelettest.Pod{Namespace: "ml", Name: "other", Containers: []kubelettest.Container{{Name: "main"}}})
	n.api.SetPods("node-c", kubeapi.Pod{Namespace: "ml", Name: "infer-0", UID: podUIDA},
		kubeapi.Pod{Namespace: "ml", Name: "other", UID: podUIDB})

	// The pod: in its cgroup, with its container's environment and the
	// relay's directory mounted read-only where the allocation says (in a
	// mount namespace of its own, over a /run of its own); the library by
	// its host path.
	pod := func(cg *simtest.Cgroup, args ...string) *simtest.Proc {
		cmd := cg.Place(r.client.Command("unshare", append([]string{"--mount", "--propagation", "private",
			"sh", "-c", `mount -t tmpfs none /run && mkdir -p "$1" && mount --bind "$0" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"`,
			mounts[allocation.ContainerRemoteDir], allocation.ContainerRemoteDir, filepath.Join(r.clientBin, "workload")}, args...)...))
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "GPUWARDEN_REMOTE=" + car.Envs["GPUWARDEN_REMOTE"],
			"LD_LIBRARY_PATH=" + mounts[allocation.ContainerRemoteLib]}
		return simtest.Start(t, cmd)
	}
	p := pod(podCgroup(t, "remotepod", podUIDA), "--alloc", "1Gi", "--seconds", "60", "--kernels", "8", "--kernel-ns", "200000")
	p.WaitLine(t, "ready", 30*time.Second)
	simtest.Eventually(t, 15*time.Second, func() error {
		e, ok := remoteEntries(t, r.agent)["ml"]
		if !ok {
			return fmt.Errorf("the server lists no session of namespace ml")
		}
		// Two of four slots of a 16Gi GPU: 8Gi, weight 2.
		if e.Pod != "infer-0" || e.Container != "main" || !e.Enforced || e.MemoryLimitBytes != 8<<30 || e.MemoryUsedBytes < 1<<30 {
			return fmt.Errorf("entry %+v", e)
		}
		return nil
	})
	if l := r.agent.Log(); !strings.Contains(l, "client=node/node-c pod=ml/infer-0/main") {
		t.Errorf("the server's log does not name the session's node and pod:\n%s", l)
	}
	// The relay handed the session to the pod's client library, or relays it.
	if l := n.agent.Log(); !strings.Contains(l, "remote relay: session started") || !strings.Contains(l, "path="+path) {
		t.Errorf("the relay did not log the session on the %s path:\n%s", path, l)
	}

	// A process of another pod that reaches the socket gets nothing.
	other := podCgroup(t, "remotepod", podUIDB)
	q := pod(other, "--alloc", "1Gi", "--steps", "1")
	if out, err := q.Wait(); err == nil {
		t.Fatalf("a process of pod ml/other ran on ml/infer-0's allocation: %s", out)
	}
	if l := n.agent.Log(); !strings.Contains(l, "is not pod ml/infer-0's") {
		t.Errorf("the relay did not say why it refused ml/other:\n%s", l)
	}
	// Nor does one in a cgroup its container made and named after the pod.
	named := simtest.NestedCgroup(t, other, "pod"+podUIDA)
	q = pod(named, "--alloc", "1Gi", "--steps", "1")
	if out, err := q.Wait(); err == nil {
		t.Fatalf("a process of pod ml/other in its cgroup %s ran on ml/infer-0's allocation: %s", named.Rel, out)
	}
	if l := n.agent.Log(); !strings.Contains(l, "cgroup="+named.Rel+" err=") {
		t.Errorf("the relay did not refuse %s:\n%s", named.Rel, l)
	}
	if _, ok := remoteEntries(t, r.agent)["ml"]; !ok {
		t.Error("the pod's session is gone")
	}
	_ = p.Cmd.Process.Kill()
	_, _ = p.Wait()

	// A workload's certificate naming the pod is refused by the server:
	// only a node's certificate names other pods.
	d, err := client.NewDialer(serverAddr, pki.Files{Cert: filepath.Join(r.creds, "a.crt"), Key: filepath.Join(r.creds, "a.key"),
		CA: filepath.Join(r.creds, "ca.crt")}, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	err = r.client.Do(func() error {
		l, _, err := d.Open(context.Background(), session.Request{MemoryBytes: 1 << 30,
			For: &session.Workload{Namespace: "ml", Pod: "infer-0", Container: "main"}})
		if err == nil {
			l.Close()
		}
		return err
	})
	if err == nil || !strings.Contains(err.Error(), "cannot open a session for ml/infer-0/main") {
		t.Errorf("team-a's certificate asserting ml/infer-0: %v, want the server's refusal", err)
	}

	// The server falls silent (the link is cut): its devices go unhealthy
	// once a list request times out; the link is back: healthy.
	r.server.Run(t, "ip", "link", "set", "gw0", "down")
	cut := time.Now()
	n.kl.WaitDevices(t, allocation.ResourceRemote, healthy(4, pluginapi.Unhealthy))
	t.Logf("unhealthy %v after the link was cut", time.Since(cut))
	r.server.Run(t, "ip", "link", "set", "gw0", "up")
	n.kl.WaitDevices(t, allocation.ResourceRemote, healthy(4, pluginapi.Healthy))

	// The server goes: its devices go unhealthy; it comes back: healthy.
	down := time.Now()
	r.agent.Stop(t)
	n.kl.WaitDevices(t, allocation.ResourceRemote, healthy(4, pluginapi.Unhealthy))
	t.Logf("unhealthy %v after the server stopped", time.Since(down))
	r.restart(t)
	n.kl.WaitDevices(t, allocation.ResourceRemote, healthy(4, pluginapi.Healthy))

	// All along the kubelet listed the allocation, so its directory stayed;
	// once the pod is gone, the directory and its socket go.
	if _, err := os.Stat(sock); err != nil {
		t.Fatalf("the listed allocation's socket: %v", err)
	}
	n.pr.SetPods()
	simtest.Eventually(t, 15*time.Second, func() error {
		if _, err := os.Stat(filepath.Dir(mounts[allocation.ContainerRemoteDir])); !os.IsNotExist(err) {
			return fmt.Errorf("the gone pod's allocation directory: %v", err)
		}
		return nil
	})
}
