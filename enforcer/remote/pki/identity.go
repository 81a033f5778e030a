// Package pki holds the credentials of remote GPU sessions: who a client
// certificate says it is, the mutual-TLS configurations of both ends, and
// the issuing of a CA and its certificates, so no openssl is needed.
package pki

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// Identity is the Kubernetes container a client certificate speaks for.
type Identity struct {
	Namespace string
	Pod       string
	Container string
}

// The URI SAN of a client certificate:
//
//	spiffe://gpuwarden/ns/<namespace>/pod/<pod>/container/<container>
//
// Each name is 1-253 bytes of [a-z0-9.-] (Kubernetes' DNS subdomain
// alphabet), starting and ending with a letter or digit.
const (
	uriScheme = "spiffe"
	uriHost   = "gpuwarden"
)

// URI is the identity's URI SAN.
func (id Identity) URI() (*url.URL, error) {
	if err := id.Validate(); err != nil {
		return nil, err
	}
	return &url.URL{Scheme: uriScheme, Host: uriHost,
		Path: "/ns/" + id.Namespace + "/pod/" + id.Pod + "/container/" + id.Container}, nil
}

// String is namespace/pod/container.
func (id Identity) String() string { return id.Namespace + "/" + id.Pod + "/" + id.Container }

// Validate checks each name.
func (id Identity) Validate() error {
	for _, f := range []struct{ what, v string }{{"namespace", id.Namespace}, {"pod", id.Pod}, {"container", id.Container}} {
		if err := checkName(f.v); err != nil {
			return fmt.Errorf("%s %q: %w", f.what, f.v, err)
		}
	}
	return nil
}

func checkName(s string) error {
	if len(s) == 0 || len(s) > 253 {
		return errors.New("want 1-253 bytes")
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
		if !alnum && (c != '-' && c != '.' || i == 0 || i == len(s)-1) {
			return errors.New("want lower-case letters, digits, '-' and '.', starting and ending with a letter or digit")
		}
	}
	return nil
}

// ParseURI reads an identity from its URI SAN.
func ParseURI(u *url.URL) (Identity, error) {
	if u.Scheme != uriScheme || u.Host != uriHost || u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" {
		return Identity{}, fmt.Errorf("URI %q: want %s://%s/ns/NS/pod/POD/container/C", u, uriScheme, uriHost)
	}
	p := strings.Split(strings.TrimPrefix(u.Path, "/"), "/")
	if len(p) != 6 || p[0] != "ns" || p[2] != "pod" || p[4] != "container" {
		return Identity{}, fmt.Errorf("URI %q: want %s://%s/ns/NS/pod/POD/container/C", u, uriScheme, uriHost)
	}
	id := Identity{Namespace: p[1], Pod: p[3], Container: p[5]}
	if err := id.Validate(); err != nil {
		return Identity{}, fmt.Errorf("URI %q: %w", u, err)
	}
	return id, nil
}

// NodeURI is a node certificate's URI SAN, spiffe://gpuwarden/node/<name>:
// a node's agent relays its pods' sessions and may name the pod of each.
func NodeURI(node string) (*url.URL, error) {
	if err := checkName(node); err != nil {
		return nil, fmt.Errorf("node %q: %w", node, err)
	}
	return &url.URL{Scheme: uriScheme, Host: uriHost, Path: "/node/" + node}, nil
}

// Peer is who a verified client certificate speaks for: a workload (its
// Identity) or a node (Node, its name), never both.
type Peer struct {
	Identity Identity
	Node     string
}

// String is the workload's namespace/pod/container, or node/NAME.
func (p Peer) String() string {
	if p.Node != "" {
		return "node/" + p.Node
	}
	return p.Identity.String()
}

// PeerOf reads a verified client certificate's one gpuwarden URI SAN. A
// certificate with none, or more than one, names no one.
func PeerOf(cert *x509.Certificate) (Peer, error) {
	var found []Peer
	for _, u := range cert.URIs {
		if u.Scheme != uriScheme || u.Host != uriHost {
			continue
		}
		if node, ok := strings.CutPrefix(u.Path, "/node/"); ok && u.User == nil && u.RawQuery == "" && u.Fragment == "" && u.Opaque == "" {
			if err := checkName(node); err != nil {
				return Peer{}, fmt.Errorf("URI %q: node %w", u, err)
			}
			found = append(found, Peer{Node: node})
			continue
		}
		id, err := ParseURI(u)
		if err != nil {
			return Peer{}, err
		}
		found = append(found, Peer{Identity: id})
	}
	switch len(found) {
	case 0:
		return Peer{}, fmt.Errorf("certificate %q has no %s://%s/... URI", cert.Subject.CommonName, uriScheme, uriHost)
	case 1:
		return found[0], nil
	}
	return Peer{}, fmt.Errorf("certificate %q has %d gpuwarden URIs, want one", cert.Subject.CommonName, len(found))
}

// IdentityOf is the workload identity of a verified client certificate; a
// node's certificate names no workload.
func IdentityOf(cert *x509.Certificate) (Identity, error) {
	p, err := PeerOf(cert)
	if err != nil {
		return Identity{}, err
	}
	if p.Node != "" {
		return Identity{}, fmt.Errorf("certificate %q is node %s's, not a workload's", cert.Subject.CommonName, p.Node)
	}
	return p.Identity, nil
}
