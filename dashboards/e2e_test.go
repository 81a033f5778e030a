package dashboards_test

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/gpuwarden/gpuwarden/enforcer/hostcgroup"
	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

// Dashboard queries that may legitimately return nothing in the end-to-end
// scenario, keyed "file: panel (refId)", with the reason. Every other query
// must return data.
var mayBeEmpty = map[string]string{}

// TestEndToEnd runs a real Prometheus (Debian's package) on loopback that
// scrapes the real agent on simgpu every second and evaluates our rules,
// with their `for:` durations cut to 2s, while three "pods" (cgroups named
// like kubelet's, so the agent labels them with a pod uid) run:
//
//	breach:  under the interposer with a 1Gi quota; allocates 940Mi, then
//	         (once Prometheus has seen its counters at zero) tries 200Mi more
//	         and is refused;
//	trainer: under the interposer with a 4Gi quota and a 50% compute cap,
//	         launching 2ms kernels;
//	bypass:  the same workload on GPU 1 without the interposer.
//
// It checks through Prometheus's HTTP API that the quota alerts fire (denied,
// near quota, unenforced) and the others do not, that every rule evaluates,
// and that every dashboard query returns data with the dashboards' variables
// set from what Prometheus has.
func TestEndToEnd(t *testing.T) {
	simtest.RequirePrivileged(t, "eBPF and cgroups")
	promBin := requireTool(t, "prometheus", "prometheus")
	start := time.Now()

	m := simtest.NewMachine(t, 2, "8Gi")
	agent := simtest.StartAgent(t, m, "GPUWARDEN_NODE_NAME=e2e-node")
	preload := []string{"LD_PRELOAD=" + simtest.Bin(t, "libgpuwarden.so"), "GPUWARDEN_CONTROL_DIR=" + agent.ControlDir}

	// The pods.
	breach, breachUID := podCgroup(t, "breach")
	trainer, trainerUID := podCgroup(t, "trainer")
	bypass, bypassUID := podCgroup(t, "bypass")

	cmd := breach.Place(m.Command(simtest.Bin(t, "interposer/gw-check"),
		"init", "ctx", "0", "alloc", "940Mi", "launch", "100", "hold", "alloc", "200Mi", "hold"))
	cmd.Env = append(cmd.Env, preload...)
	cmd.Env = append(cmd.Env, "GPUWARDEN_MEMORY_LIMIT=1Gi", "GPUWARDEN_COMPUTE_LIMIT=50")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	b := simtest.Start(t, cmd)
	if l := b.WaitLine(t, "alloc", 10*time.Second); !strings.HasPrefix(l, "alloc CUDA_SUCCESS") {
		t.Fatalf("breach: 940Mi of a 1Gi quota: %q, want CUDA_SUCCESS; stderr: %s", l, b.Stderr())
	}
	b.WaitLine(t, "ready", 10*time.Second)

	workload := simtest.Bin(t, "simgpu/workload")
	cmd = trainer.Place(m.Command(workload, "--alloc", "256Mi", "--seconds", "120", "--kernels", "4", "--kernel-ns", "2000000"))
	cmd.Env = append(cmd.Env, preload...)
	cmd.Env = append(cmd.Env, "GPUWARDEN_MEMORY_LIMIT=4Gi", "GPUWARDEN_COMPUTE_LIMIT=50")
	simtest.Start(t, cmd).WaitLine(t, "ready", 10*time.Second)
	simtest.Start(t, bypass.Place(m.Command(workload, "--device", "1", "--alloc", "2Gi", "--seconds", "120",
		"--kernels", "4", "--kernel-ns", "1000000"))).WaitLine(t, "ready", 10*time.Second)

	prom := startPrometheus(t, promBin, agent.Addr)

	// Stage the breach once Prometheus has the refusal counter at zero, so
	// the alert's increase() branch is what fires.
	sel := fmt.Sprintf(`gpuwarden_container_gpu_memory_alloc_failures_total{reason="quota", pod=%q}`, breachUID)
	simtest.Eventually(t, 20*time.Second, func() error {
		r, err := prom.query(fmt.Sprintf(`count_over_time(%s[1m]) >= 3 and %s == 0`, sel, sel))
		if err == nil && len(r) == 0 {
			err = fmt.Errorf("fewer than 3 samples of %s at 0", sel)
		}
		return err
	})
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	if l := b.WaitLine(t, "alloc", 10*time.Second); !strings.HasPrefix(l, "alloc CUDA_ERROR_OUT_OF_MEMORY") {
		t.Fatalf("breach: 200Mi more: %q, want CUDA_ERROR_OUT_OF_MEMORY", l)
	}
	b.WaitLine(t, "ready", 10*time.Second)
	t.Logf("breach staged after %v", time.Since(start).Round(time.Millisecond))

	// The quota alerts fire for the right pods.
	want := map[string]string{
		"GPUMemoryAllocationsDeniedQuota": breachUID,
		"GPUMemoryNearQuota":              breachUID,
		"GPUContainerUnenforced":          bypassUID,
	}
	simtest.Eventually(t, 30*time.Second, func() error {
		firing, err := prom.firing()
		if err != nil {
			return err
		}
		for name, pod := range want {
			if !firing[name+"/"+pod] {
				return fmt.Errorf("%s is not firing for pod %s; firing: %v", name, pod, keys(firing))
			}
		}
		return nil
	})
	firing, err := prom.firing()
	if err != nil {
		t.Fatal(err)
	}
	// The agent's probes see every process on the host that uses
	// bin/simgpu/libcuda.so.1, other tests' too (labelled by their cgroup
	// paths, with no pod): only our pods and the node-wide alerts count.
	ours := map[string]bool{breachUID: true, trainerUID: true, bypassUID: true}
	for k := range firing {
		name, pod, _ := strings.Cut(k, "/")
		nodeWide := name == "GPUWardenAgentDown" || name == "GPUMemoryQuotaOvercommitted" || name == "GPUWardenCollectorFailing"
		if (ours[pod] || nodeWide) && want[name] != pod {
			t.Errorf("alert %s fires, which the scenario does not stage", k)
		}
	}
	t.Logf("alerts firing after %v: %v", time.Since(start).Round(time.Millisecond), keys(firing))

	// Every rule evaluates without error.
	if errs := prom.ruleErrors(t); len(errs) > 0 {
		t.Errorf("rules failing in Prometheus: %v", errs)
	}
	r, err := prom.query(fmt.Sprintf(`container:gpuwarden_gpu_memory_quota_used:ratio{pod=%q}`, breachUID))
	if err != nil || len(r) != 1 || r[0].value < 0.9 || r[0].value > 1 {
		t.Errorf("the breach pod's quota used ratio: %+v %v, want 940/1024", r, err)
	}

	// The trainer's target, achieved and scheduled shares, as the node and
	// pod dashboards show them.
	simtest.Eventually(t, 10*time.Second, func() error {
		target, err := prom.query(fmt.Sprintf(`gpuwarden_container_compute_limit_ratio{pod=%q}`, trainerUID))
		if err != nil || len(target) != 1 || target[0].value != 0.5 {
			return fmt.Errorf("the trainer's target share: %+v %v, want 0.5", target, err)
		}
		share, err := prom.query(fmt.Sprintf(`max_over_time(gpuwarden_container_compute_share_ratio{pod=%q}[1m]) > 0`, trainerUID))
		if err != nil || len(share) != 1 {
			return fmt.Errorf("the trainer's achieved share is never above 0: %+v %v", share, err)
		}
		scheduled, err := prom.query(fmt.Sprintf(`max_over_time(gpuwarden_container_scheduled_share_ratio{pod=%q}[1m]) > 0`, trainerUID))
		if err != nil || len(scheduled) != 1 {
			return fmt.Errorf("the trainer's share on the scheduler's clock is never above 0: %+v %v", scheduled, err)
		}
		charged, err := prom.query(fmt.Sprintf(`increase(gpuwarden_container_scheduled_seconds_total{pod=%q}[1m]) > 0`, trainerUID))
		if err != nil || len(charged) != 1 {
			return fmt.Errorf("the scheduler's clock never charged the trainer: %+v %v", charged, err)
		}
		return nil
	})

	// Every dashboard query returns data.
	checkDashboards(t, prom, map[string]string{"node": "e2e-node", "pod": breachUID})

	// The names every query uses are in a real scrape of the agent.
	scraped := agent.Scrape(t)
	for _, q := range append(dashboardQueries(t), ruleQueries(t)...) {
		for _, n := range metricNames(q.Expr) {
			if _, ok := scraped[n]; !ok && !strings.Contains(n, ":") {
				t.Errorf("%s: %s is not in the agent's /metrics", q.Where, n)
			}
		}
	}
	t.Logf("done in %v", time.Since(start).Round(time.Millisecond))
}

// podCgroup makes a cgroup whose path names a pod as kubelet's cgroupfs
// driver does (".../kubepods/pod<uid>/..."), so the agent labels it pod=<uid>.
func podCgroup(t *testing.T, name string) (*simtest.Cgroup, string) {
	t.Helper()
	uid := fmt.Sprintf("%08x-%04x-4%03x-8%03x-%012x", rand.Uint32(), rand.Uint32()&0xffff,
		rand.Uint32()&0xfff, rand.Uint32()&0xfff, rand.Uint64()&0xffffffffffff)
	mnt, err := hostcgroup.Mount("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	parent := filepath.Join(mnt, "gpuwarden-test", "kubepods", "pod"+uid)
	// Registered first, so it runs after simtest removes the cgroup itself.
	t.Cleanup(func() {
		_ = os.Remove(parent)
		_ = os.Remove(filepath.Dir(parent)) // fails while other tests use it
	})
	return simtest.NewCgroup(t, filepath.Join("kubepods", "pod"+uid, name)), uid
}

// promServer is a Prometheus server the test started.
type promServer struct{ base string }

func startPrometheus(t *testing.T, bin, target string) *promServer {
	t.Helper()
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yml")
	if err := os.WriteFile(rules, shortenFor(t, 2*time.Second), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "prometheus.yml")
	// The job is named as the Helm chart's ServiceMonitor names it.
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files: [%q]
scrape_configs:
  - job_name: gpuwarden-agent
    static_configs:
      - targets: [%q]
`, rules, target)), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := freePort(t)
	logf, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config.file="+cfg, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("start prometheus: %v", err)
	}
	log := func() string { b, _ := os.ReadFile(logf.Name()); return string(b) }
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			t.Errorf("prometheus did not stop within 10s of SIGINT")
		}
		if t.Failed() {
			t.Logf("prometheus log:\n%s", log())
		}
	})
	p := &promServer{base: "http://" + addr}
	deadline := time.Now().Add(20 * time.Second)
	for {
		select {
		case <-exited:
			t.Fatalf("prometheus exited: %s", log())
		default:
		}
		if resp, err := http.Get(p.base + "/-/ready"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus not ready within 20s: %s", log())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// shortenFor rewrites the rules file with every alert's `for:` cut to d.
func shortenFor(t *testing.T, d time.Duration) []byte {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var f map[string]any
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	for _, g := range f["groups"].([]any) {
		for _, r := range g.(map[string]any)["rules"].([]any) {
			if r := r.(map[string]any); r["for"] != nil {
				r["for"] = d.String()
			}
		}
	}
	out, err := yaml.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func (p *promServer) get(path string, params url.Values, v any) error {
	resp, err := http.Get(p.base + path + "?" + params.Encode())
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	var env struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(b, &env); err != nil {
		return fmt.Errorf("%s: %d %s", path, resp.StatusCode, b)
	}
	if env.Status != "success" {
		return fmt.Errorf("%s %v: %s", path, params, env.Error)
	}
	return json.Unmarshal(env.Data, v)
}

type promSample struct {
	labels map[string]string
	value  float64
}

// query runs an instant query that must give a vector.
func (p *promServer) query(q string) ([]promSample, error) {
	var data struct {
		ResultType string `json:"resultType"`
		Result     []struct {
			Metric map[string]string `json:"metric"`
			Value  [2]any            `json:"value"`
		} `json:"result"`
	}
	if err := p.get("/api/v1/query", url.Values{"query": {q}}, &data); err != nil {
		return nil, err
	}
	if data.ResultType != "vector" {
		return nil, fmt.Errorf("%s gives a %s, want a vector", q, data.ResultType)
	}
	var out []promSample
	for _, r := range data.Result {
		s, _ := r.Value[1].(string)
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: value %v", q, r.Value)
		}
		out = append(out, promSample{labels: r.Metric, value: v})
	}
	return out, nil
}

// firing lists the firing alerts as "name/pod".
func (p *promServer) firing() (map[string]bool, error) {
	var data struct {
		Alerts []struct {
			Labels map[string]string `json:"labels"`
			State  string            `json:"state"`
		} `json:"alerts"`
	}
	if err := p.get("/api/v1/alerts", nil, &data); err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, a := range data.Alerts {
		if a.State == "firing" {
			out[a.Labels["alertname"]+"/"+a.Labels["pod"]] = true
		}
	}
	return out, nil
}

// ruleErrors lists the rules whose last evaluation failed.
func (p *promServer) ruleErrors(t *testing.T) []string {
	var data struct {
		Groups []struct {
			Rules []struct {
				Name      string `json:"name"`
				Health    string `json:"health"`
				LastError string `json:"lastError"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := p.get("/api/v1/rules", nil, &data); err != nil {
		return []string{err.Error()}
	}
	var errs []string
	n := 0
	for _, g := range data.Groups {
		for _, r := range g.Rules {
			n++
			if r.Health != "ok" {
				errs = append(errs, fmt.Sprintf("%s: %s %s", r.Name, r.Health, r.LastError))
			}
		}
	}
	if want := len(readRules(t).rules()); n != want {
		errs = append(errs, fmt.Sprintf("Prometheus loaded %d rules, the file has %d", n, want))
	}
	return errs
}

// labelValues answers a Grafana label_values(selector, label) query as
// Grafana does, through the labels API.
func (p *promServer) labelValues(selector, label string) ([]string, error) {
	var vals []string
	params := url.Values{}
	if selector != "" {
		params.Set("match[]", selector)
	}
	err := p.get("/api/v1/label/"+label+"/values", params, &vals)
	return vals, err
}

var labelValuesRe = regexp.MustCompile(`^label_values\((?:(.*),\s*)?([a-zA-Z_][a-zA-Z0-9_]*)\)$`)

// checkDashboards sets each dashboard's variables from Prometheus, as
// Grafana would (prefer: a value to pick where the variable offers it;
// variables with "All" take it, as the dashboards open), and checks that
// every query returns data.
func checkDashboards(t *testing.T, p *promServer, prefer map[string]string) {
	t.Helper()
	builtins := map[string]string{"__rate_interval": "5s", "__interval": "1s", "__range": "1m"}
	ds := readDashboards(t)
	files := keysOf(ds)
	for _, file := range files {
		d := ds[file]
		vars := map[string]string{}
		for _, v := range d.Templating.List {
			if v.Type != "query" {
				continue
			}
			m := labelValuesRe.FindStringSubmatch(variableQuery(v))
			if m == nil {
				t.Errorf("%s: variable %s: cannot read %q", file, v.Name, variableQuery(v))
				continue
			}
			vals, err := p.labelValues(substitute(m[1], vars, builtins), m[2])
			if err != nil {
				t.Errorf("%s: variable %s: %v", file, v.Name, err)
				continue
			}
			switch {
			case v.IncludeAll:
				vars[v.Name] = v.AllValue
			case contains(vals, prefer[v.Name]):
				vars[v.Name] = prefer[v.Name]
			case len(vals) > 0:
				vars[v.Name] = vals[0]
			default:
				t.Errorf("%s: variable %s (no All) has no values", file, v.Name)
			}
		}
		t.Logf("%s: variables %v", file, vars)
		type pending struct{ where, expr string }
		var todo []pending
		for _, pn := range d.panels() {
			for _, tg := range pn.Targets {
				where := fmt.Sprintf("%s: %s (%s)", file, pn.Title, tg.RefID)
				if _, ok := mayBeEmpty[where]; ok {
					continue
				}
				todo = append(todo, pending{where, substitute(tg.Expr, vars, builtins)})
			}
		}
		// Rates need a few samples: retry the empty ones for a while.
		deadline := time.Now().Add(15 * time.Second)
		for len(todo) > 0 {
			var again []pending
			var errs []string
			for _, q := range todo {
				r, err := p.query(q.expr)
				if err == nil && len(r) == 0 {
					err = fmt.Errorf("no data")
				}
				if err != nil {
					again = append(again, q)
					errs = append(errs, fmt.Sprintf("%s: %s: %v", q.where, q.expr, err))
				}
			}
			todo = again
			if len(todo) > 0 && time.Now().After(deadline) {
				for _, e := range errs {
					t.Error(e)
				}
				break
			}
			if len(todo) > 0 {
				time.Sleep(time.Second)
			}
		}
	}
}

var varRe = regexp.MustCompile(`\$\{(\w+)\}|\$(\w+)`)

func substitute(expr string, vars, builtins map[string]string) string {
	return varRe.ReplaceAllStringFunc(expr, func(s string) string {
		m := varRe.FindStringSubmatch(s)
		name := m[1] + m[2]
		if v, ok := vars[name]; ok {
			return v
		}
		if v, ok := builtins[name]; ok {
			return v
		}
		return s
	})
}

// ruleQueries lists the rules' expressions.
func ruleQueries(t *testing.T) []query {
	var qs []query
	for _, r := range readRules(t).rules() {
		qs = append(qs, query{Where: rulesFile + ": " + r.Alert + r.Record, Expr: r.Expr})
	}
	return qs
}

func contains(vals []string, v string) bool {
	for _, x := range vals {
		if v != "" && x == v {
			return true
		}
	}
	return false
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func keysOf[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
