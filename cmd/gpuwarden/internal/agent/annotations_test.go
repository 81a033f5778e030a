package agent

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"encoding/pem"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/gpuwarden/gpuwarden/collector/kubeapi"
)

// podServer answers the agent's pod list for its node: the pods it holds
// now, counting the lists.
type podServer struct {
	mu    sync.Mutex
	pods  []string // names in namespace ml
	lists int
}

func (f *podServer) start(t *testing.T) *kubeapi.Client {
	t.Helper()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if r.URL.Path != "/api/v1/pods" || r.URL.Query().Get("fieldSelector") != "spec.nodeName=node-a" {
			http.Error(w, r.URL.String(), http.StatusNotFound)
			return
		}
		f.lists++
		items := []any{}
		for _, p := range f.pods {
			items = append(items, map[string]any{"metadata": map[string]any{"namespace": "ml", "name": p, "uid": "uid-" + p}})
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"items": items})
	}))
	srv.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	ca, token := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "token")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(token, []byte("tok\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := kubeapi.New(srv.URL, token, ca)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// A pod that started since the last list is found by listing again, but
// no more often than missRefetch, however many unknown names are asked.
func TestNewPodListedAgain(t *testing.T) {
	f := &podServer{pods: []string{"old"}}
	p := &podAnnotations{client: f.start(t), node: "node-a", refresh: time.Hour}
	a := &Agent{log: slog.Default()}
	ctx := context.Background()
	lists := func() int { f.mu.Lock(); defer f.mu.Unlock(); return f.lists }

	if uid := p.uid(ctx, a, "ml", "old"); uid != "uid-old" || lists() != 1 {
		t.Fatalf("uid %q after %d lists, want uid-old after 1", uid, lists())
	}
	f.mu.Lock()
	f.pods = append(f.pods, "new")
	f.mu.Unlock()
	if uid := p.uid(ctx, a, "ml", "new"); uid != "" || lists() != 1 {
		t.Errorf("uid %q after %d lists: the list was made again within %v", uid, lists(), missRefetch)
	}
	time.Sleep(missRefetch + 100*time.Millisecond)
	if uid := p.uid(ctx, a, "ml", "new"); uid != "uid-new" || lists() != 2 {
		t.Errorf("uid %q after %d lists, want uid-new after 2", uid, lists())
	}
	for range 10 {
		p.uid(ctx, a, "ml", "never")
	}
	if lists() != 2 {
		t.Errorf("%d lists: unknown names listed again within %v", lists(), missRefetch)
	}
}
