// Package kubeapi reads the pods of one node from the Kubernetes API server,
// for what only the API has: their annotations. It speaks plain HTTPS with
// the pod's service-account token, to keep client-go out of the agent.
package kubeapi

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// Pod is what the agent needs of a pod.
type Pod struct {
	Namespace, Name string
	UID             string // the pod's uid, which its cgroup paths carry
	Annotations     map[string]string
}

// Client lists pods through the API server.
type Client struct {
	base      string
	tokenFile string
	http      *http.Client
}

// New makes a client for the API server at base (https://host:port), with
// the bearer token in tokenFile (re-read on each call: tokens rotate) and
// the server's CA in caFile.
func New(base, tokenFile, caFile string) (*Client, error) {
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("kubernetes CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("kubernetes CA %s: no certificate", caFile)
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}
	return &Client{base: strings.TrimSuffix(base, "/"), tokenFile: tokenFile,
		http: &http.Client{Transport: tr, Timeout: 10 * time.Second}}, nil
}

// InClusterServer is the API server's address as Kubernetes tells a pod,
// or "" outside a cluster.
func InClusterServer() string {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return ""
	}
	return "https://" + strings.Trim(host, "[]") + ":" + port
}

// PodsOnNode lists the pods scheduled to node.
func (c *Client) PodsOnNode(ctx context.Context, node string) ([]Pod, error) {
	tok, err := os.ReadFile(c.tokenFile)
	if err != nil {
		return nil, fmt.Errorf("kubernetes token: %w", err)
	}
	u := c.base + "/api/v1/pods?fieldSelector=" + url.QueryEscape("spec.nodeName="+node)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
	req.Header.Set("Accept", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("list pods: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("list pods: %s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	var list struct {
		Items []struct {
			Metadata struct {
				Namespace   string            `json:"namespace"`
				Name        string            `json:"name"`
				UID         string            `json:"uid"`
				Annotations map[string]string `json:"annotations"`
			} `json:"metadata"`
		} `json:"items"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&list); err != nil {
		return nil, fmt.Errorf("list pods: %w", err)
	}
	if list.Items == nil {
		return nil, errors.New("list pods: the answer is not a pod list")
	}
	pods := make([]Pod, 0, len(list.Items))
	for _, it := range list.Items {
		pods = append(pods, Pod{Namespace: it.Metadata.Namespace, Name: it.Metadata.Name, UID: it.Metadata.UID,
			Annotations: it.Metadata.Annotations})
	}
	return pods, nil
}
