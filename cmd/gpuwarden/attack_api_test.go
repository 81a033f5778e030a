package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

// Without eBPF: these tests are about the agent's own files and API, and
// an agent without probes stops at once.
const noEBPF = "GPUWARDEN_EBPF_ENABLED=false"

// TestAgentTokenFileIsPrivate: the change API's token never goes through a
// symlink, and an existing token file is made 0600 before the token is in it.
func TestAgentTokenFileIsPrivate(t *testing.T) {
	simtest.RequirePrivileged(t, "cgroups")
	m := simtest.NewMachine(t, 1, "8Gi")
	dir := t.TempDir()

	// A symlink planted where the token goes: whatever it leads to is left
	// alone, and the change API stays off rather than use it.
	victim, link := filepath.Join(dir, "victim"), filepath.Join(dir, "token-link")
	if err := os.WriteFile(victim, []byte("world-readable\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, link); err != nil {
		t.Fatal(err)
	}
	agent := simtest.StartAgent(t, m, noEBPF, "GPUWARDEN_ENFORCEMENT_API_TOKEN_FILE="+link)
	simtest.Eventually(t, 10*time.Second, func() error {
		if !strings.Contains(agent.Log(), "the change API is off") {
			return fmt.Errorf("the agent did not refuse the symlinked token file")
		}
		return nil
	})
	if b, _ := os.ReadFile(victim); string(b) != "world-readable\n" {
		t.Errorf("the token went through the symlink: the file it leads to now holds %q", b)
	}
	agent.Stop(t)

	// An existing, world-readable token file, which a reader opened while
	// it was: the token goes into a new 0600 file renamed over it, so what
	// the reader holds never shows a token.
	tok := filepath.Join(dir, "token")
	if err := os.WriteFile(tok, []byte("old\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	held, err := os.Open(tok)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	agent = simtest.StartAgent(t, m, noEBPF, "GPUWARDEN_ENFORCEMENT_API_TOKEN_FILE="+tok)
	st, err := os.Stat(tok)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("token file mode %v, want 0600", st.Mode().Perm())
	}
	if b, _ := os.ReadFile(tok); len(b) != 65 {
		t.Errorf("token file holds %q, want a fresh token", b)
	}
	if b, err := io.ReadAll(held); err != nil || string(b) != "old\n" {
		t.Errorf("the file opened before the agent started reads %q, %v; want what it held then", b, err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".token.*")); len(left) != 0 {
		t.Errorf("temporary token files left: %v", left)
	}
	if out, err := ctl(t, agent, "gpu", "0", "--max-inst", "4"); err != nil {
		t.Errorf("ctl with the token: %v: %s", err, out)
	}
}

// TestChangeAPIBoundsRequests: a change's body is bounded (a large one is
// refused with 413 before it is read, and costs the agent nothing), and
// refusals name the field without repeating what the request sent.
func TestChangeAPIBoundsRequests(t *testing.T) {
	simtest.RequirePrivileged(t, "cgroups")
	m := simtest.NewMachine(t, 1, "16Gi")
	agent := simtest.StartAgent(t, m, noEBPF)
	cg := startEnforced(t, m, agent, "api")
	simtest.Eventually(t, 15*time.Second, func() error {
		if e, _ := entry(t, agent, cg); e.ComputeLimit == 0 {
			return fmt.Errorf("%s is not under the enforcer yet", cg.Rel)
		}
		return nil
	})

	// 200 MB, generated as it is sent: a policy name that never ends.
	huge := io.MultiReader(strings.NewReader(`{"policy":"`), io.LimitReader(repeatByte('z'), 200<<20), strings.NewReader(`"}`))
	code, body := postChange(t, agent, "/api/v1/gpus/0/settings", huge)
	if code != http.StatusRequestEntityTooLarge || len(body) > 1024 {
		t.Errorf("200 MB body: %d, %d bytes of answer; want 413 and a short answer", code, len(body))
	}
	if rss := agentRSS(t, agent); rss > rssBound {
		t.Errorf("agent RSS %d MiB after a 200 MB body, bound %d MiB", rss>>20, rssBound>>20)
	}

	long := strings.Repeat("q", 1000)
	for _, tc := range []struct {
		path, body, field string
	}{
		{"/api/v1/gpus/0/settings", `{"policy":"` + long + `"}`, "policy"},
		{"/api/v1/containers" + cg.Rel + "/settings", `{"priority":"` + long + `"}`, "priority"},
		{"/api/v1/containers" + cg.Rel + "/settings", `{"memoryLimit":"` + long + `"}`, "memoryLimit"},
		{"/api/v1/containers" + cg.Rel + "/settings", `{"` + long + `":1}`, "unknown field"},
		{"/api/v1/containers" + cg.Rel + "/settings", `{"weight":"` + long + `"}`, "weight"},
		{"/api/v1/containers/" + long + "/settings", `{"weight":2}`, "no container"},
	} {
		code, body := postChange(t, agent, tc.path, strings.NewReader(tc.body))
		if code/100 != 4 || !strings.Contains(string(body), tc.field) || strings.Contains(string(body), long) || len(body) > 1024 {
			t.Errorf("%s %.40s...: %d %q; want refused naming %q, without the value", tc.path, tc.body, code, body, tc.field)
		}
	}
}

// postChange POSTs a change with the agent's token.
func postChange(t *testing.T, agent *simtest.Agent, path string, body io.Reader) (int, []byte) {
	t.Helper()
	tok, err := os.ReadFile(agent.TokenFile)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodPost, "http://"+agent.Addr+path, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+string(bytes.TrimSpace(tok)))
	c := http.Client{Timeout: 60 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<30))
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	return resp.StatusCode, b
}

// repeatByte is an endless reader of one byte.
type repeatByte byte

func (r repeatByte) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(r)
	}
	return len(p), nil
}
