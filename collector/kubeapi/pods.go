// Package kubeapi talks to the Kubernetes API server for what only the API
// has: the annotations of a node's pods, and the DRA driver's ResourceSlices
// and ResourceClaims. It speaks plain HTTPS and JSON with the pod's
// service-account token, to keep client-go out of the agent: client-go and
// its scheme of every API type cost the agent about 36 MiB of resident
// memory whether or not it uses them.
package kubeapi

import (
	"bytes"
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

// StatusError is the API server's answer other than success.
type StatusError struct {
	Code    int    // the HTTP status: 404 not found, 409 conflict, ...
	Message string // the answer's start
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("%d %s: %s", e.Code, http.StatusText(e.Code), e.Message)
}

// IsNotFound says whether err is the API server's 404.
func IsNotFound(err error) bool {
	var se *StatusError
	return errors.As(err, &se) && se.Code == http.StatusNotFound
}

// maxAnswer bounds what is read of one answer.
const maxAnswer = 64 << 20

// Do sends method to path (with its query), in as the JSON body when not
// nil, and decodes a successful answer into out when not nil.
func (c *Client) Do(ctx context.Context, method, path string, in, out any) error {
	tok, err := os.ReadFile(c.tokenFile)
	if err != nil {
		return fmt.Errorf("kubernetes token: %w", err)
	}
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return &StatusError{Code: resp.StatusCode, Message: strings.TrimSpace(string(b))}
	}
	if out == nil {
		return nil
	}
	return json.NewDecoder(io.LimitReader(resp.Body, maxAnswer)).Decode(out)
}

// PodsOnNode lists the pods scheduled to node.
func (c *Client) PodsOnNode(ctx context.Context, node string) ([]Pod, error) {
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
	err := c.Do(ctx, http.MethodGet, "/api/v1/pods?fieldSelector="+url.QueryEscape("spec.nodeName="+node), nil, &list)
	if err != nil {
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
