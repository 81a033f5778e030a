package agent

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/gpuwarden/gpuwarden/collector/kubeapi"
	"github.com/gpuwarden/gpuwarden/collector/kubeapi/kubeapitest"
)

// A pod that started since the last list is found by listing again, but
// no more often than missRefetch, however many unknown names are asked.
func TestNewPodListedAgain(t *testing.T) {
	api := kubeapitest.StartTestServer(t)
	pod := func(name string) kubeapi.Pod { return kubeapi.Pod{Namespace: "ml", Name: name, UID: "uid-" + name} }
	api.SetPods("node-a", pod("old"))
	c, err := kubeapi.New(api.URL, api.TokenFile, api.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	p := &podAnnotations{client: c, node: "node-a", refresh: time.Hour}
	a := &Agent{log: slog.Default()}
	ctx := context.Background()

	if uid := p.uid(ctx, a, "ml", "old"); uid != "uid-old" || api.Lists() != 1 {
		t.Fatalf("uid %q after %d lists, want uid-old after 1", uid, api.Lists())
	}
	api.SetPods("node-a", pod("old"), pod("new"))
	if uid := p.uid(ctx, a, "ml", "new"); uid != "" || api.Lists() != 1 {
		t.Errorf("uid %q after %d lists: the list was made again within %v", uid, api.Lists(), missRefetch)
	}
	time.Sleep(missRefetch + 100*time.Millisecond)
	if uid := p.uid(ctx, a, "ml", "new"); uid != "uid-new" || api.Lists() != 2 {
		t.Errorf("uid %q after %d lists, want uid-new after 2", uid, api.Lists())
	}
	for range 10 {
		p.uid(ctx, a, "ml", "never")
	}
	if api.Lists() != 2 {
		t.Errorf("%d lists: unknown names listed again within %v", api.Lists(), missRefetch)
	}
}
