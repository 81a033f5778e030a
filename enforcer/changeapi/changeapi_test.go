package changeapi

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/agentapi"
	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
	"github.com/gpuwarden/gpuwarden/enforcer/membership"
	"github.com/gpuwarden/gpuwarden/enforcer/settings"
)

// noBreaches is an agent that froze nothing.
type noBreaches struct{}

func (noBreaches) Events() []agentapi.Event   { return nil }
func (noBreaches) Unfreeze(path string) error { return ErrNotFrozen }

// serve runs the change API over membership of an empty control directory,
// without NVML; it returns the server's address and the token.
func serve(t *testing.T) (string, string) {
	t.Helper()
	dir := t.TempDir()
	store, err := settings.Load(filepath.Join(dir, "settings.json"))
	if err != nil {
		t.Fatal(err)
	}
	e := membership.Start(membership.Config{ControlDir: filepath.Join(dir, "control"), GracePeriod: time.Minute, Settings: store,
		Verify: func(string, *controlblock.UsageSnapshot) (string, error) { return "", os.ErrNotExist },
		Alive:  func(uint64) bool { return false }, CgroupOf: func(int) (string, error) { return "", os.ErrNotExist },
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	t.Cleanup(func() { _ = e.Close() })
	mux := http.NewServeMux()
	tokenFile := filepath.Join(dir, "token")
	if err := Register(mux, tokenFile, e, noBreaches{}); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	tok, err := os.ReadFile(tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	return srv.URL, strings.TrimSpace(string(tok))
}

// Each refusal has its status and says why; a change without the token
// is refused before anything else is read.
func TestChangeAnswers(t *testing.T) {
	url, tok := serve(t)
	gpu := "GPU-a0010203-0405-0607-0809-0a0b0c0d0e0f"
	for _, tt := range []struct {
		name, method, path, token, body string
		code                            int
		says                            string
	}{
		{"no token", "POST", "/api/v1/gpus/" + gpu + "/settings", "", `{"maxInst":2}`, 401, "token"},
		{"wrong token", "POST", "/api/v1/gpus/" + gpu + "/settings", "x", `{"maxInst":2}`, 401, "token"},
		{"unknown container", "POST", "/api/v1/containers/nope/settings", tok, `{"weight":2}`, 404, `no container \"nope\"`},
		{"never frozen", "POST", "/api/v1/containers/a/b/unfreeze", tok, ``, 404, "froze no cgroup"},
		{"GPU by index without NVML", "POST", "/api/v1/gpus/0/settings", tok, `{"maxInst":2}`, 404, `no GPU \"0\"`},
		{"bad policy", "POST", "/api/v1/gpus/" + gpu + "/settings", tok, `{"policy":"fastest"}`, 400, `policy \"fastest\": want 0-5 or one of fair-share`},
		{"max_inst out of range", "POST", "/api/v1/gpus/" + gpu + "/settings", tok, `{"maxInst":129}`, 400, "max_inst 129"},
		{"unknown field", "POST", "/api/v1/gpus/" + gpu + "/settings", tok, `{"maxInstances":2}`, 400, `unknown field \"maxInstances\"`},
		{"GPU change", "POST", "/api/v1/gpus/" + gpu + "/settings", tok, `{"policy":"weighted","maxInst":2}`, 200, `"maxInst":2`},
		{"GPU read", "GET", "/api/v1/gpus/" + gpu, "", ``, 200, `"policy":"weighted"`},
	} {
		req, err := http.NewRequest(tt.method, url+tt.path, strings.NewReader(tt.body))
		if err != nil {
			t.Fatal(err)
		}
		if tt.token != "" {
			req.Header.Set("Authorization", "Bearer "+tt.token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tt.code || !strings.Contains(string(b), tt.says) {
			t.Errorf("%s: %d %s, want %d saying %s", tt.name, resp.StatusCode, b, tt.code, tt.says)
		}
	}
}
