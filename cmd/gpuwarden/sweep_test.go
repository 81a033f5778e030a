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

	"github.com/gpuwarden/gpuwarden/collector/kubelet/kubelettest"
	"github.com/gpuwarden/gpuwarden/deploy/allocation"
	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
	"github.com/gpuwarden/gpuwarden/enforcer/hostcgroup"
	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

// TestAgentRemovesControlDirsOfPodsGone: the agent's device plugin allocates
// two containers through the test kubelet; one pod runs a workload under the
// interposer (so the agent reads its ledger), then exits and vanishes from
// pod-resources. After controlDirGrace its directory is gone, the other
// pod's stays, and settings saved for containers that no longer exist are
// dropped from the state file.
func TestAgentRemovesControlDirsOfPodsGone(t *testing.T) {
	simtest.RequirePrivileged(t, "the device plugin's control directory")
	kl, pods := kubelettest.StartDevicePlugins(t), kubelettest.StartPodResources(t)
	m := simtest.NewMachine(t, 1, "8Gi")
	state := filepath.Join(t.TempDir(), "settings.json")
	const stale = "mem-GPU-gone-0123456789abcdef"
	if err := os.WriteFile(state, []byte(`{"containers":{"`+stale+`":{}},"gpus":{}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	agent := simtest.StartAgent(t, m, "GPUWARDEN_EBPF_ENABLED=false", "GPUWARDEN_DEVICE_PLUGIN_ENABLED=true",
		"GPUWARDEN_DEVICE_PLUGIN_KUBELET_DIR="+kl.Dir, "GPUWARDEN_DEVICE_PLUGIN_INTERPOSER_PATH="+simtest.Bin(t, "libgpuwarden.so"),
		"GPUWARDEN_KUBELET_POD_RESOURCES_SOCKET="+pods.Socket, "GPUWARDEN_CONTROL_DIR_GRACE=2s",
		"GPUWARDEN_ENFORCEMENT_STATE_FILE="+state)
	t.Cleanup(func() { agent.Kill(t) }) // a clean stop is not what this test is about
	mem := kl.WaitDevices(t, allocation.ResourceMemory, func(d []*pluginapi.Device) bool { return len(d) == 8 })
	memc := kl.Client(t, allocation.ResourceMemory)
	goneIDs, liveIDs := []string{mem[0].ID}, []string{mem[1].ID, mem[2].ID}
	for _, ids := range [][]string{goneIDs, liveIDs} {
		if _, err := memc.Allocate(context.Background(), &pluginapi.AllocateRequest{
			ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}}); err != nil {
			t.Fatal(err)
		}
	}
	podOf := func(name string, ids []string) kubelettest.Pod {
		return kubelettest.Pod{Namespace: "ml", Name: name, Containers: []kubelettest.Container{
			{Name: "main", Devices: map[string][]string{allocation.ResourceMemory: ids}}}}
	}
	pods.SetPods(podOf("gone", goneIDs), podOf("live", liveIDs))
	gone, live := filepath.Join(agent.ControlDir, allocation.DirName(goneIDs)), filepath.Join(agent.ControlDir, allocation.DirName(liveIDs))

	// The pod's workload, finding its allocation's files under its own key.
	cg, err := hostcgroup.Of("/proc", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	view := t.TempDir()
	if err := os.Symlink(gone, filepath.Join(view, controlblock.ContainerKey(cg))); err != nil {
		t.Fatal(err)
	}
	cmd := m.Command(simtest.Bin(t, "simgpu/workload"), "--alloc", "64Mi", "--hold")
	cmd.Env = append(cmd.Env, "LD_PRELOAD="+simtest.Bin(t, "libgpuwarden.so"), "GPUWARDEN_CONTROL_DIR="+view)
	w := simtest.Start(t, cmd)
	w.WaitLine(t, "ready", 10*time.Second)
	simtest.Eventually(t, 15*time.Second, func() error {
		if _, ok := simtest.Find(agent.Scrape(t), "gpuwarden_container_gpu_memory_limit_bytes", map[string]string{"pod": "gone"}); !ok {
			return fmt.Errorf("the agent does not report pod gone's ledger yet")
		}
		return nil
	})
	time.Sleep(4 * time.Second) // past the grace period: a listed pod's directory stays
	if _, err := os.Stat(gone); err != nil {
		t.Fatalf("a listed pod's directory was removed: %v", err)
	}

	if err := w.Cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_, _ = w.Wait()
	pods.SetPods(podOf("live", liveIDs))
	simtest.Eventually(t, 20*time.Second, func() error {
		if _, err := os.Lstat(gone); err == nil {
			return fmt.Errorf("%s is still there", gone)
		}
		b, err := os.ReadFile(state)
		if err != nil {
			return err
		}
		if strings.Contains(string(b), stale) {
			return fmt.Errorf("the state file still holds %s: %s", stale, b)
		}
		return nil
	})
	if _, err := os.Stat(filepath.Join(live, "limits")); err != nil {
		t.Errorf("the live pod's directory: %v", err)
	}
}
