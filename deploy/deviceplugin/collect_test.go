package deviceplugin_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuwarden/gpuwarden/collector/kubelet"
	"github.com/gpuwarden/gpuwarden/collector/kubelet/kubelettest"
	"github.com/gpuwarden/gpuwarden/deploy/allocation"
	"github.com/gpuwarden/gpuwarden/deploy/deviceplugin"
	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
	"github.com/gpuwarden/gpuwarden/enforcer/hostcgroup"
	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

// sweepRig is a plugin with a test kubelet serving pod-resources, and the
// agent's sweeper of the plugin's control directory.
type sweepRig struct {
	*rig
	pods  *kubelettest.PodResources
	memc  pluginapi.DevicePluginClient
	sweep *deviceplugin.Sweeper
}

func startSweep(t *testing.T, grace time.Duration) *sweepRig {
	r := &sweepRig{rig: start(t, nil, nil), pods: kubelettest.StartPodResources(t)}
	r.memc = r.kubelet.Client(t, allocation.ResourceMemory)
	r.kubelet.WaitDevices(t, allocation.ResourceMemory, func(d []*pluginapi.Device) bool { return len(d) == 24 })
	pr, err := kubelet.DialPodResources(r.pods.Socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pr.Close() })
	r.sweep = &deviceplugin.Sweeper{ControlDir: r.cfg.ControlDir, ProcRoot: "/proc",
		Listed: deviceplugin.ListedDirs(pr), Lock: r.p.DirLock(), Collector: allocation.Collector{Grace: grace}}
	return r
}

func (r *sweepRig) allocate(t testing.TB, ids []string) string {
	t.Helper()
	if _, err := r.memc.Allocate(context.Background(), allocReq(ids...)); err != nil {
		t.Fatal(err)
	}
	return allocation.DirName(ids)
}

func pod(name string, ids []string) kubelettest.Pod {
	return kubelettest.Pod{Namespace: "ml", Name: name, Containers: []kubelettest.Container{
		{Name: "main", Devices: map[string][]string{allocation.ResourceMemory: ids}}}}
}

func (r *sweepRig) dirs(t testing.TB) []string {
	t.Helper()
	es, err := os.ReadDir(r.cfg.ControlDir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	sort.Strings(out)
	return out
}

func (r *sweepRig) sweepAt(t testing.TB, now time.Time) []string {
	t.Helper()
	removed, err := r.sweep.Sweep(context.Background(), now)
	if err != nil {
		t.Fatalf("sweep: %v", err)
	}
	return removed
}

// TestSweepRemovesAllocationsOfPodsGone: a pod that vanishes from
// pod-resources loses its allocation's directory after the grace period; a
// listed pod keeps its own, and so does a pod gone from pod-resources whose
// process (the interposer, on simgpu) still maps its ledger, until it exits.
func TestSweepRemovesAllocationsOfPodsGone(t *testing.T) {
	const grace = time.Minute
	r := startSweep(t, grace)
	goneIDs, liveIDs, usedIDs := []string{uuid1 + "::mem-0"}, []string{uuid1 + "::mem-1", uuid1 + "::mem-2"}, []string{uuid0 + "::mem-0"}
	gone, live, used := r.allocate(t, goneIDs), r.allocate(t, liveIDs), r.allocate(t, usedIDs)
	r.pods.SetPods(pod("gone", goneIDs), pod("live", liveIDs), pod("used", usedIDs))

	// The interposer finds the allocation's files as a container would see
	// them mounted: under its own key in its control directory.
	cg, err := hostcgroup.Of("/proc", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	view := t.TempDir()
	if err := os.Symlink(filepath.Join(r.cfg.ControlDir, used), filepath.Join(view, controlblock.ContainerKey(cg))); err != nil {
		t.Fatal(err)
	}
	cmd := machine.Command(simtest.Bin(t, "simgpu/workload"), "--alloc", "64Mi", "--hold")
	cmd.Env = append(cmd.Env, "LD_PRELOAD="+simtest.Bin(t, "libgpuwarden.so"), "GPUWARDEN_CONTROL_DIR="+view)
	w := simtest.Start(t, cmd)
	w.WaitLine(t, "ready", 10*time.Second)

	t0 := time.Now()
	if removed := r.sweepAt(t, t0); len(removed) != 0 {
		t.Fatalf("every pod is listed, yet %v were removed", removed)
	}
	r.pods.SetPods(pod("live", liveIDs))
	if removed := r.sweepAt(t, t0.Add(time.Second)); len(removed) != 0 {
		t.Errorf("removed %v as soon as their pods were gone", removed)
	}
	if removed := r.sweepAt(t, t0.Add(grace)); len(removed) != 0 {
		t.Errorf("removed %v before the grace period passed", removed)
	}
	if removed := r.sweepAt(t, t0.Add(grace+time.Second)); fmt.Sprint(removed) != fmt.Sprint([]string{gone}) {
		t.Errorf("after the grace period removed %v, want %v", removed, []string{gone})
	}
	if got, want := r.dirs(t), sorted(live, used); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("left %v, want %v (the listed pod's and the one a live process maps)", got, want)
	}

	if err := w.Cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_, _ = w.Wait()
	if removed := r.sweepAt(t, t0.Add(grace+2*time.Second)); fmt.Sprint(removed) != fmt.Sprint([]string{used}) {
		t.Errorf("once its process exited removed %v, want %v", removed, []string{used})
	}
	if got := r.dirs(t); fmt.Sprint(got) != fmt.Sprint([]string{live}) {
		t.Errorf("left %v, want only the listed pod's %s", got, live)
	}
}

func sorted(s ...string) []string { sort.Strings(s); return s }

// TestSweepKeepsDirectoriesToLivePods measures 10,000 allocations over time:
// each pod lives for 50 allocations' time, the clock moves a second per
// allocation and the agent sweeps every 100; what is left is O(live pods),
// not one directory per allocation ever made.
func TestSweepKeepsDirectoriesToLivePods(t *testing.T) {
	const (
		n, lifetime, sweepEvery = 10000, 50, 100
		grace                   = time.Minute
		step                    = time.Second
	)
	r := startSweep(t, grace)
	// Distinct device sets, so every allocation has a directory of its own.
	idsOf := func(i int) []string {
		var ids []string
		for b := 0; b < 14; b++ {
			if (i+1)&(1<<b) != 0 {
				ids = append(ids, fmt.Sprintf("%s::mem-%d", uuid1, b))
			}
		}
		return ids
	}
	t0 := time.Now()
	most := 0
	for i := 0; i < n; i++ {
		r.allocate(t, idsOf(i))
		var live []kubelettest.Pod
		for j := max(0, i-lifetime+1); j <= i; j++ {
			live = append(live, pod(fmt.Sprint("p", j), idsOf(j)))
		}
		r.pods.SetPods(live...)
		if i%sweepEvery == sweepEvery-1 {
			r.sweepAt(t, t0.Add(time.Duration(i)*step))
			most = max(most, len(r.dirs(t)))
		}
	}
	// A pod lives `lifetime` steps, its directory `grace` more, then up to a sweep interval.
	bound := lifetime + int(grace/step) + sweepEvery
	left := r.dirs(t)
	t.Logf("%d allocations: at most %d directories at a sweep, %d left; bound %d", n, most, len(left), bound)
	if most > bound || len(left) > bound {
		t.Errorf("%d allocations left up to %d directories (%d at the end), want at most %d", n, most, len(left), bound)
	}
	for j := n - lifetime; j < n; j++ {
		if _, err := os.Stat(filepath.Join(r.cfg.ControlDir, allocation.DirName(idsOf(j)))); err != nil {
			t.Errorf("a live pod's directory: %v", err)
		}
	}
}
