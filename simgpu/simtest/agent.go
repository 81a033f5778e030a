package simtest

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gpuwarden/gpuwarden/enforcer/agentapi"
)

// Agent is a real `gpuwarden agent` process serving on loopback.
type Agent struct {
	Proc       *Proc
	Addr       string // host:port
	ControlDir string
	TokenFile  string // the change API's token (enforcement.apiTokenFile)
	StateFile  string // where ctl's changes are kept (enforcement.stateFile)
	// Client fetches from the agent (nil: http.DefaultClient); an agent in
	// a network namespace of its own is reached through the namespace's.
	Client *http.Client
	stderr *os.File
}

// StartAgent runs bin/gpuwarden agent on the machine, listening on a free
// loopback port, with NVML and eBPF pointed at simgpu and no pinning; env
// adds or overrides GPUWARDEN_* settings. It returns once the agent is
// ready (agentapi.AwaitReady), and stops it (SIGINT) when the test ends.
func StartAgent(t testing.TB, m *Machine, env ...string) *Agent {
	t.Helper()
	return StartAgentIn(t, m, nil, env...)
}

// StartAgentIn is StartAgent with the agent in a network namespace (nil:
// the test's own).
func StartAgentIn(t testing.TB, m *Machine, ns *NetNS, env ...string) *Agent {
	t.Helper()
	dir := t.TempDir()
	a := &Agent{ControlDir: filepath.Join(dir, "control"), TokenFile: filepath.Join(dir, "token"),
		StateFile: filepath.Join(dir, "settings.json")}
	cmd := m.Command(Bin(t, "gpuwarden"), "agent", "--listen", "127.0.0.1:0")
	cmd.Env = append(cmd.Env,
		"GPUWARDEN_CONTROL_DIR="+a.ControlDir,
		"GPUWARDEN_ENFORCEMENT_API_TOKEN_FILE="+a.TokenFile,
		"GPUWARDEN_ENFORCEMENT_STATE_FILE="+a.StateFile,
		"GPUWARDEN_NVML_LIBRARY="+Bin(t, "simgpu/libnvidia-ml.so.1"),
		"GPUWARDEN_EBPF_LIBRARIES="+Bin(t, "simgpu/libcuda.so.1"),
		"GPUWARDEN_EBPF_LDCONFIG_SONAME=",
		"GPUWARDEN_EBPF_PIN_DIR=",
		"GPUWARDEN_KUBELET_POD_RESOURCES_SOCKET=",
		"GPUWARDEN_LOG_LEVEL=debug",
		// Its onBreach stops test containers only: the probes see every
		// process on the machine that maps a libcuda (a benchmark's, a
		// developer's own), and those are not this agent's to stop.
		"GPUWARDEN_ENFORCEMENT_BREACH_SCOPE="+cgroupRoot,
	)
	cmd.Env = append(cmd.Env, env...) // later entries win
	for _, kv := range env {
		switch k, v, _ := strings.Cut(kv, "="); k {
		case "GPUWARDEN_CONTROL_DIR":
			a.ControlDir = v
		case "GPUWARDEN_ENFORCEMENT_API_TOKEN_FILE":
			a.TokenFile = v
		case "GPUWARDEN_ENFORCEMENT_STATE_FILE":
			a.StateFile = v
		}
	}
	logFile, err := os.Create(filepath.Join(t.TempDir(), "agent.log"))
	if err != nil {
		t.Fatal(err)
	}
	a.stderr = logFile
	cmd.Stderr = logFile
	if ns != nil {
		ns.Wrap(cmd)
		a.Client = ns.HTTPClient()
	}
	ready, err := agentapi.AwaitReady(cmd)
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		ready.Close()
		t.Fatalf("start agent: %v", err)
	}
	a.Proc = &Proc{Cmd: cmd}
	t.Cleanup(func() {
		a.Stop(t)
		if t.Failed() {
			t.Logf("agent log:\n%s", a.Log())
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if a.Addr, err = ready.Wait(ctx, a.Log); err != nil {
		t.Fatal(err)
	}
	return a
}

// Stop stops the agent with SIGINT, as an operator would; it is done at
// the end of the test too.
func (a *Agent) Stop(t testing.TB) {
	t.Helper()
	cmd := a.Proc.Cmd
	if cmd.ProcessState != nil {
		return
	}
	_ = cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Errorf("agent did not stop within 10s of SIGINT; log:\n%s", a.Log())
	}
}

// Kill stops the agent with SIGKILL and reaps it, for a test about what an
// agent leaves behind, or one whose orderly stop could outlast Stop's 10 s
// on a loaded machine.
func (a *Agent) Kill(t testing.TB) {
	t.Helper()
	cmd := a.Proc.Cmd
	if cmd.ProcessState != nil {
		return
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatalf("kill agent: %v", err)
	}
	_ = cmd.Wait()
}

// Log returns what the agent logged so far.
func (a *Agent) Log() string {
	b, _ := os.ReadFile(a.stderr.Name())
	return string(b)
}

// Get fetches a path and returns the status code and body.
func (a *Agent) Get(t testing.TB, path string) (int, []byte) {
	t.Helper()
	c := a.Client
	if c == nil {
		c = http.DefaultClient
	}
	resp, err := c.Get("http://" + a.Addr + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	return resp.StatusCode, b
}

// GetJSON fetches a path and decodes its JSON body into v.
func (a *Agent) GetJSON(t testing.TB, path string, v any) {
	t.Helper()
	code, b := a.Get(t, path)
	if code != http.StatusOK {
		t.Fatalf("GET %s: %d %s", path, code, b)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("GET %s: %v: %s", path, err, b)
	}
}

// Sample is one scraped series.
type Sample struct {
	Labels map[string]string
	Value  float64
}

// Scrape fetches /metrics and returns every series of each family.
func (a *Agent) Scrape(t testing.TB) map[string][]Sample {
	t.Helper()
	code, b := a.Get(t, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("GET /metrics: %d", code)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(b)))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	out := map[string][]Sample{}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			s := Sample{Labels: map[string]string{}}
			for _, l := range m.GetLabel() {
				s.Labels[l.GetName()] = l.GetValue()
			}
			s.Value = value(f.GetType(), m)
			out[name] = append(out[name], s)
		}
	}
	return out
}

func value(t dto.MetricType, m *dto.Metric) float64 {
	switch t {
	case dto.MetricType_COUNTER:
		return m.GetCounter().GetValue()
	case dto.MetricType_GAUGE:
		return m.GetGauge().GetValue()
	case dto.MetricType_UNTYPED:
		return m.GetUntyped().GetValue()
	}
	return 0
}

// Find returns the one series of a family whose labels include want, or false.
func Find(fams map[string][]Sample, name string, want map[string]string) (Sample, bool) {
	for _, s := range fams[name] {
		match := true
		for k, v := range want {
			if s.Labels[k] != v {
				match = false
				break
			}
		}
		if match {
			return s, true
		}
	}
	return Sample{}, false
}

// Eventually polls f until it returns nil or the timeout passes.
func Eventually(t testing.TB, timeout time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var err error
	for time.Now().Before(deadline) {
		if err = f(); err == nil {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("not within %v: %v", timeout, err)
}
