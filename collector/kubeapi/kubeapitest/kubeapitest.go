// Package kubeapitest is a test Kubernetes API server for the agent's pod reads.
package kubeapitest

import (
	"encoding/json"
	"encoding/pem"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/gpuwarden/gpuwarden/collector/kubeapi"
)

// TestServer is a test API server: it answers pod lists over real HTTPS,
// checking the bearer token and the node field selector, with pods the test
// sets. (A real API server cannot run here; this speaks its protocol.)
type TestServer struct {
	URL, TokenFile, CAFile string

	mu    sync.Mutex
	pods  map[string][]kubeapi.Pod // by node
	lists int                      // pod lists answered
}

// StartTestServer serves on loopback until the test ends.
func StartTestServer(t testing.TB) *TestServer {
	t.Helper()
	return StartTestServerOn(t, nil)
}

// StartTestServerOn serves on lis (nil: a loopback port of the test's
// network namespace; a listener made in another namespace serves there).
// Its certificate is valid for 127.0.0.1.
func StartTestServerOn(t testing.TB, lis net.Listener) *TestServer {
	t.Helper()
	s := &TestServer{pods: map[string][]kubeapi.Pod{}}
	const token = "test-token"
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+token {
			http.Error(w, `{"kind":"Status","code":401}`, http.StatusUnauthorized)
			return
		}
		node, ok := strings.CutPrefix(r.URL.Query().Get("fieldSelector"), "spec.nodeName=")
		if r.URL.Path != "/api/v1/pods" || !ok {
			http.Error(w, `{"kind":"Status","code":400}`, http.StatusBadRequest)
			return
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		s.lists++
		type meta struct {
			Namespace   string            `json:"namespace"`
			Name        string            `json:"name"`
			UID         string            `json:"uid,omitempty"`
			Annotations map[string]string `json:"annotations,omitempty"`
		}
		type item struct {
			Metadata meta `json:"metadata"`
		}
		list := struct {
			Kind  string `json:"kind"`
			Items []item `json:"items"`
		}{Kind: "PodList", Items: []item{}}
		for _, p := range s.pods[node] {
			list.Items = append(list.Items, item{meta{p.Namespace, p.Name, p.UID, p.Annotations}})
		}
		_ = json.NewEncoder(w).Encode(list)
	}))
	if lis != nil {
		srv.Listener.Close()
		srv.Listener = lis
	}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	s.URL, s.TokenFile, s.CAFile = srv.URL, filepath.Join(dir, "token"), filepath.Join(dir, "ca.crt")
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	if err := os.WriteFile(s.CAFile, ca, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.TokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return s
}

// SetPods sets the pods scheduled to node.
func (s *TestServer) SetPods(node string, pods ...kubeapi.Pod) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pods[node] = pods
}

// Lists is how many pod lists the server has answered.
func (s *TestServer) Lists() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lists
}
