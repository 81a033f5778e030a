package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/gpuwarden/gpuwarden/enforcer/agentapi"

	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

var updateGolden = flag.Bool("update", false, "rewrite the golden files under testdata/")

const smiMiB = 1 << 20

// smiFixture is an agent's answer on a two-GPU node: Kubernetes containers,
// one labelled only by its cgroup path, one by the ids in its path, one
// that bypasses the interposer, high priority, with and without quotas.
func smiFixture() (agentapi.ContainersResponse, agentapi.DevicesResponse) {
	at := time.Date(2025, 3, 1, 12, 30, 0, 0, time.UTC)
	const (
		uuid0 = "GPU-5a4b7869-1e0f-3c2d-d2c3-f0e19687b400"
		uuid1 = "GPU-45546776-0110-2332-cddc-effe8998ab01"
	)
	dr := agentapi.DevicesResponse{Node: "node-a", Time: at, Devices: []agentapi.Device{
		{Node: "node-a", Index: 0, UUID: uuid0, Name: "NVIDIA A100-SXM4-80GB", MemoryTotalBytes: 81920 * smiMiB,
			MemoryUsedBytes: 7360 * smiMiB, Utilization: 0.734},
		{Node: "node-a", Index: 1, UUID: uuid1, Name: "NVIDIA A100-SXM4-80GB", MemoryTotalBytes: 81920 * smiMiB,
			MemoryUsedBytes: 12352 * smiMiB, Utilization: 0.125},
	}}
	cr := agentapi.ContainersResponse{Node: "node-a", Time: at, Sources: []agentapi.SourceState{
		{Name: "ebpf", OK: true}, {Name: "kubelet", OK: true}, {Name: "ledger", OK: true}, {Name: "nvml", OK: true},
	}, Containers: []agentapi.ContainerDevice{
		{Node: "node-a", GPU: 0, UUID: uuid0, Namespace: "ml", Pod: "trainer-0", Container: "pytorch", CgroupID: 101,
			CgroupPath: "/kubepods.slice/kubepods-pod1.slice/cri-containerd-aaaa.scope", Enforced: true, HighPriority: true,
			MemoryUsedBytes: 1024 * smiMiB, MemorySource: "ebpf", MemoryLimitBytes: 4096 * smiMiB, LedgerBytes: 1088 * smiMiB,
			ComputeShare: 0.374, ComputeLimit: 0.5, PIDs: []int{4242}},
		{Node: "node-a", GPU: 0, UUID: uuid0, Namespace: "ml", Pod: "notebook-5f7c9d8b6-x2x9q", Container: "jupyter",
			CgroupID: 102, Enforced: true, MemoryUsedBytes: 3000 * smiMiB, MemorySource: "ebpf",
			MemoryLimitBytes: 6144 * smiMiB, ComputeShare: 0.36, ComputeLimit: 0.35},
		{Node: "node-a", GPU: 0, UUID: uuid0, Container: "/system.slice/render-farm.service", CgroupID: 103,
			CgroupPath: "/system.slice/render-farm.service", Unenforced: true, MemoryUsedBytes: 2048 * smiMiB,
			MemorySource: "ebpf", ComputeShare: 0.0, PIDs: []int{5151}},
		{Node: "node-a", GPU: 1, UUID: uuid1, Namespace: "inference", Pod: "llm-server-0", Container: "vllm",
			CgroupID: 201, Enforced: true, MemoryUsedBytes: 10240 * smiMiB, MemorySource: "ebpf", ComputeShare: 0.125},
		{Node: "node-a", GPU: 1, UUID: uuid1, Pod: "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0", Container: "3b2a1c0d9e8f",
			CgroupID: 202, Enforced: true, HighPriority: true, MemoryUsedBytes: 64 * smiMiB, MemorySource: "ledger",
			MemoryLimitBytes: 2048 * smiMiB, ComputeLimit: 1},
		{Node: "node-a", GPU: 1, UUID: uuid1, Namespace: "very-long-namespace-name-for-a-team",
			Pod: "batch-job-with-a-long-generated-name-28391-abcde", Container: "worker", CgroupID: 203,
			Enforced: true, MemoryUsedBytes: 0, MemoryLimitBytes: 1024 * smiMiB},
	}}
	return cr, dr
}

func TestSmiGolden(t *testing.T) {
	cr, dr := smiFixture()
	noEBPF := cr
	noEBPF.Sources = []agentapi.SourceState{{Name: "ledger", OK: true}, {Name: "nvml", OK: false, Error: "nvml init: ERROR_LIBRARY_NOT_FOUND"}}
	noEBPF.Containers = []agentapi.ContainerDevice{
		{GPU: 0, Container: "/gpuwarden-test/evil\x1b[2J-name", CgroupID: 7, Enforced: true, MemoryUsedBytes: 1088 * smiMiB,
			MemoryLimitBytes: 4096 * smiMiB, ComputeShare: 0.2},
		{GPU: 3, CgroupID: 9, CgroupPath: "/user.slice/user-1000.slice/session-2.scope", Unenforced: true, MemoryUsedBytes: 512 * smiMiB},
	}

	for _, tc := range []struct {
		name  string
		view  *smiView
		watch time.Duration
	}{
		{"two_gpus", viewFromAPI(cr, dr), 0},
		{"watch", viewFromAPI(cr, dr), 2 * time.Second},
		// An agent without eBPF nor NVML: notes, a GPU without device data, a name with an escape sequence.
		{"degraded", viewFromAPI(noEBPF, agentapi.DevicesResponse{}), 0},
		{"empty", viewFromAPI(agentapi.ContainersResponse{Node: "node-b", Time: cr.Time, Sources: cr.Sources}, agentapi.DevicesResponse{}), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.view.Agent == "" {
				tc.view.Agent = defaultAgentURL
			}
			var b bytes.Buffer
			if err := renderSmi(&b, tc.view, tc.watch); err != nil {
				t.Fatal(err)
			}
			checkGolden(t, filepath.Join("testdata", "smi", tc.name+".golden"), b.Bytes())
			for i, l := range strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n") {
				if n := len([]rune(l)); n > smiWidth {
					t.Errorf("line %d is %d columns, more than %d: %q", i+1, n, smiWidth, l)
				}
				if strings.ContainsRune(l, 0x1b) {
					t.Errorf("line %d holds an escape character: %q", i+1, l)
				}
			}
		})
	}
}

func checkGolden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *updateGolden {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to write it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("output differs from %s (run with -update to rewrite it)\n--- got:\n%s\n--- want:\n%s", path, got, want)
	}
}

// fakeAgent serves the fixture as the agent's API does.
func fakeAgent(t *testing.T) *httptest.Server {
	cr, dr := smiFixture()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/v1/containers", func(w http.ResponseWriter, r *http.Request) { _ = json.NewEncoder(w).Encode(cr) })
	mux.HandleFunc("GET /api/v1/devices", func(w http.ResponseWriter, r *http.Request) { _ = json.NewEncoder(w).Encode(dr) })
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// TestSmiShowsFreeWeight: with the enforcer's answer, each GPU's line shows
// its policy, max_inst and cGPU's free_weight, within the table's width.
func TestSmiShowsFreeWeight(t *testing.T) {
	cr, dr := smiFixture()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/v1/containers", func(w http.ResponseWriter, r *http.Request) { _ = json.NewEncoder(w).Encode(cr) })
	mux.HandleFunc("GET /api/v1/devices", func(w http.ResponseWriter, r *http.Request) { _ = json.NewEncoder(w).Encode(dr) })
	mux.HandleFunc("GET /api/v1/gpus", func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode([]agentapi.GPUInfo{{Index: 1, Policy: "fair-share", PolicySet: true, MaxInst: 128, FreeWeight: 125, Containers: 3}})
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	var out, errb bytes.Buffer
	if code := run([]string{"smi", "--agent", srv.URL}, &out, &errb); code != 0 {
		t.Fatalf("smi: exit %d, stderr %s", code, errb.String())
	}
	var shown int
	for _, l := range strings.Split(out.String(), "\n") {
		if utf8.RuneCountInString(l) > smiWidth {
			t.Errorf("line of %d columns: %q", utf8.RuneCountInString(l), l)
		}
		if strings.Contains(l, "fair-share  max_inst 128  free_weight 125") {
			shown++
			if !strings.Contains(l, dr.Devices[1].UUID) {
				t.Errorf("GPU 1's state on another GPU's line: %q", l)
			}
		}
	}
	if shown != 1 {
		t.Errorf("GPU 1's policy, max_inst and free_weight shown %d times, want once:\n%s", shown, out.String())
	}
}

// tableOf drops the title line (its time is in the local zone).
func tableOf(s string) string {
	_, rest, _ := strings.Cut(s, "\n")
	return rest
}

// smi reads the agent's API over HTTP and prints what the golden shows.
func TestSmiReadsAgentAPI(t *testing.T) {
	srv := fakeAgent(t)
	var out, errb bytes.Buffer
	if code := run([]string{"smi", "--agent", srv.URL}, &out, &errb); code != 0 {
		t.Fatalf("smi: exit %d, stderr %s", code, errb.String())
	}
	want, err := os.ReadFile(filepath.Join("testdata", "smi", "two_gpus.golden"))
	if err != nil {
		t.Fatal(err)
	}
	if got := tableOf(out.String()); got != tableOf(string(want)) {
		t.Errorf("smi --agent %s:\n%s\nwant the table of two_gpus.golden:\n%s", srv.URL, got, tableOf(string(want)))
	}
	if !strings.Contains(out.String(), "agent "+srv.URL) {
		t.Errorf("title does not name the agent: %q", strings.SplitN(out.String(), "\n", 2)[0])
	}

	out.Reset()
	if code := run([]string{"smi", "--agent", strings.TrimPrefix(srv.URL, "http://"), "--json"}, &out, &errb); code != 0 {
		t.Fatalf("smi --json: exit %d, stderr %s", code, errb.String())
	}
	var v smiView
	if err := json.Unmarshal(out.Bytes(), &v); err != nil {
		t.Fatalf("smi --json: %v\n%s", err, out.String())
	}
	cr, dr := smiFixture()
	if v.Source != "agent" || v.Node != "node-a" || len(v.Devices) != len(dr.Devices) || len(v.Containers) != len(cr.Containers) ||
		v.Containers[0].MemoryLimitBytes != 4096*smiMiB || !v.Time.Equal(cr.Time) {
		t.Errorf("smi --json decoded to %+v", v)
	}
}

func TestSmiErrors(t *testing.T) {
	broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "collector exploded", http.StatusInternalServerError)
	}))
	defer broken.Close()
	closed := closedAddr(t)
	missing := filepath.Join(t.TempDir(), "missing")
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--frobnicate"}, 2, "unknown flag: --frobnicate"},
		{[]string{"--watch", "soon"}, 2, `invalid argument "soon" for "--watch"`},
		{[]string{"--watch", "-1s"}, 2, "bad --watch"},
		{[]string{"--agent", "ftp://host"}, 2, "bad --agent"},
		{[]string{"extra"}, 2, `unexpected argument "extra"`},
		{[]string{"--agent", broken.URL}, 1, "500 Internal Server Error: collector exploded"},
		{[]string{"--agent", closed, "--control-dir", missing, "--nvml-library", missing}, 1,
			"no agent answers at http://" + closed + " (connection refused), and no local data: no control directory " + missing},
	} {
		var out, errb bytes.Buffer
		code := run(append([]string{"smi"}, tc.args...), &out, &errb)
		msg := errb.String()
		if code != tc.code || !strings.Contains(msg, tc.want) || strings.Count(msg, "\n") != 1 || !strings.HasPrefix(msg, "gpuwarden smi: ") {
			t.Errorf("smi %q: exit %d, stderr %q; want exit %d and one line with %q", tc.args, code, msg, tc.code, tc.want)
		}
		if out.Len() != 0 {
			t.Errorf("smi %q printed on stdout: %q", tc.args, out.String())
		}
	}
	var out, errb bytes.Buffer
	if code := run([]string{"smi", "-h"}, &out, &errb); code != 0 || !strings.Contains(out.String(), "--control-dir") {
		t.Errorf("smi -h: exit %d, stdout %q", code, out.String())
	}
}

// closedAddr is a loopback address where nothing listens.
func closedAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// --watch redraws until interrupted, then exits 0.
func TestSmiWatch(t *testing.T) {
	srv := fakeAgent(t)
	cmd := exec.Command(simtest.Bin(t, "gpuwarden"), "smi", "--agent", srv.URL, "--watch", "100ms")
	var out simtest.LockedBuffer
	var errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	simtest.Eventually(t, 5*time.Second, func() error {
		if n := strings.Count(out.String(), "\x1b[H\x1b[2J"); n < 3 {
			return fmt.Errorf("%d redraws so far", n)
		}
		return nil
	})
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("smi --watch after SIGINT: %v; stderr %s", err, errb.String())
	}
	screens := strings.Split(out.String(), "\x1b[H\x1b[2J")
	if last := screens[len(screens)-1]; !strings.Contains(last, "every 100ms") || !strings.Contains(last, "ml/trainer-0/pytorch") {
		t.Errorf("last screen:\n%s", last)
	}
}

// TestSmiLiveAgent runs the real agent on simgpu with a container under
// the interposer, and the built smi against it.
func TestSmiLiveAgent(t *testing.T) {
	simtest.RequirePrivileged(t, "eBPF and cgroups")
	m := simtest.NewMachine(t, 2, "16Gi")
	agent := simtest.StartAgent(t, m, "GPUWARDEN_NODE_NAME=node-smi")
	cg := simtest.NewCgroup(t, "smi")
	cmd := cg.Place(m.Command(simtest.Bin(t, "simgpu/workload"), "--alloc", "1Gi", "--hold"))
	cmd.Env = append(cmd.Env, "LD_PRELOAD="+simtest.Bin(t, "libgpuwarden.so"), "GPUWARDEN_CONTROL_DIR="+agent.ControlDir,
		"GPUWARDEN_MEMORY_LIMIT=4Gi", "GPUWARDEN_PRIORITY=high")
	w := simtest.Start(t, cmd)
	w.WaitLine(t, "ready", 10*time.Second)

	smi := func(args ...string) string {
		out, err := exec.Command(simtest.Bin(t, "gpuwarden"), append([]string{"smi", "--agent", "http://" + agent.Addr}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("gpuwarden smi %q: %v\n%s", args, err, out)
		}
		return string(out)
	}
	// eBPF sees the allocation byte for byte (1 GiB; the 64 MiB context
	// reserve is the interposer's and NVML's figure, not an allocation).
	// Alone on its GPU, the enforcer holds it to the whole device.
	wantRow := smiRow{gpu: "0", name: truncate(cg.Rel, colName), prio: "yes", util: "0% / 100%", mem: "1024MiB / 4096MiB", enf: "enforced"}
	var out string
	simtest.Eventually(t, 15*time.Second, func() error {
		out = smi()
		for _, want := range []string{
			"gpuwarden smi  node node-smi", "agent http://" + agent.Addr,
			wantRow.String(),
			smiRow{gpu: "0", name: "simgpu H200 (simulated)", util: "0%", mem: "1088MiB / 16384MiB"}.String(),
			smiRow{gpu: "1", name: "simgpu H200 (simulated)", util: "0%", mem: "0MiB / 16384MiB"}.String(),
		} {
			if !strings.Contains(out, want) {
				return fmt.Errorf("smi output lacks %q in\n%s", want, out)
			}
		}
		return nil
	})
	if strings.Contains(out, "note:") {
		t.Errorf("the agent runs all its parts, yet smi prints notes:\n%s", out)
	}

	var v smiView
	if err := json.Unmarshal([]byte(smi("--json")), &v); err != nil {
		t.Fatalf("smi --json does not decode: %v", err)
	}
	found := false
	for _, c := range v.Containers {
		if c.CgroupID == cg.ID {
			found = true
			if c.GPU != 0 || c.MemoryUsedBytes != 1<<30 || c.MemoryLimitBytes != 4<<30 || !c.Enforced || !c.HighPriority {
				t.Errorf("smi --json entry for the container: %+v", c)
			}
		}
	}
	if !found || len(v.Devices) != 2 || !strings.Contains(out, v.Devices[0].UUID) {
		t.Errorf("smi --json: container found %v, devices %+v; table:\n%s", found, v.Devices, out)
	}
}

// TestSmiLocalFallback: no agent listens; smi reads the ledger a real
// workload keeps under the interposer, and NVML, and says what it cannot see.
func TestSmiLocalFallback(t *testing.T) {
	simtest.RequirePrivileged(t, "cgroups")
	m := simtest.NewMachine(t, 2, "16Gi")
	control := filepath.Join(t.TempDir(), "control")
	cg := simtest.NewCgroup(t, "smilocal")
	cmd := cg.Place(m.Command(simtest.Bin(t, "simgpu/workload"), "--alloc", "1Gi", "--hold"))
	cmd.Env = append(cmd.Env, "LD_PRELOAD="+simtest.Bin(t, "libgpuwarden.so"), "GPUWARDEN_CONTROL_DIR="+control,
		"GPUWARDEN_MEMORY_LIMIT=4Gi", "GPUWARDEN_COMPUTE_LIMIT=30")
	w := simtest.Start(t, cmd)
	w.WaitLine(t, "ready", 10*time.Second)

	closed := closedAddr(t)
	smi := func(args ...string) string {
		c := m.Command(simtest.Bin(t, "gpuwarden"), append([]string{"smi", "--agent", "http://" + closed, "--control-dir", control,
			"--nvml-library", simtest.Bin(t, "simgpu/libnvidia-ml.so.1")}, args...)...)
		out, err := c.CombinedOutput()
		if err != nil {
			t.Fatalf("gpuwarden smi %q: %v\n%s", args, err, out)
		}
		return string(out)
	}
	out := smi()
	// Without eBPF, the memory is NVML's per-process figure: the allocation
	// and the context.
	for _, want := range []string{
		"read locally",
		"note: no agent answers at http://" + closed + " (connection refused): reading the control blocks",
		"no eBPF view:",
		smiRow{gpu: "0", name: truncate(cg.Rel, colName), prio: "no", util: "0% / 30%", mem: "1088MiB / 4096MiB", enf: "enforced"}.String(),
		smiRow{gpu: "0", name: "simgpu H200 (simulated)", util: "0%", mem: "1088MiB / 16384MiB"}.String(),
		smiRow{gpu: "1", name: "simgpu H200 (simulated)", util: "0%", mem: "0MiB / 16384MiB"}.String(),
	} {
		if !strings.Contains(out, want) {
			t.Errorf("smi without an agent lacks %q:\n%s", want, out)
		}
	}
	var v smiView
	if err := json.Unmarshal([]byte(smi("--json")), &v); err != nil {
		t.Fatalf("smi --json does not decode: %v", err)
	}
	if v.Source != "local" || len(v.Containers) != 1 || v.Containers[0].CgroupID != cg.ID || len(v.Notes) < 2 {
		t.Errorf("smi --json without an agent: %+v", v)
	}
}
