package kubeapi_test

import (
	"context"
	"os"
	"testing"

	"github.com/gpuwarden/gpuwarden/collector/kubeapi"
	"github.com/gpuwarden/gpuwarden/collector/kubeapi/kubeapitest"
)

func TestPodsOnNode(t *testing.T) {
	s := kubeapitest.StartTestServer(t)
	s.SetPods("node-a", kubeapi.Pod{Namespace: "ml", Name: "trainer-0", Annotations: map[string]string{"gpuwarden.io/weight": "3"}})
	s.SetPods("node-b", kubeapi.Pod{Namespace: "web", Name: "api"})
	c, err := kubeapi.New(s.URL, s.TokenFile, s.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	pods, err := c.PodsOnNode(context.Background(), "node-a")
	if err != nil {
		t.Fatal(err)
	}
	if len(pods) != 1 || pods[0].Name != "trainer-0" || pods[0].Annotations["gpuwarden.io/weight"] != "3" {
		t.Errorf("pods on node-a = %+v", pods)
	}
	if err := os.WriteFile(s.TokenFile, []byte("wrong"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PodsOnNode(context.Background(), "node-a"); err == nil {
		t.Error("a wrong token gave no error")
	}
	if _, err := kubeapi.New(s.URL, s.TokenFile, s.TokenFile); err == nil {
		t.Error("a CA file without a certificate gave no error")
	}
}
