package pki

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestIdentityURI(t *testing.T) {
	id := Identity{Namespace: "team-a", Pod: "train-0", Container: "main"}
	u, err := id.URI()
	if err != nil {
		t.Fatal(err)
	}
	if u.String() != "spiffe://gpuwarden/ns/team-a/pod/train-0/container/main" {
		t.Fatalf("URI %s", u)
	}
	back, err := ParseURI(u)
	if err != nil || back != id {
		t.Fatalf("parsed back %+v %v", back, err)
	}
	for _, bad := range []string{
		"spiffe://gpuwarden/ns/a/pod/b",
		"spiffe://other/ns/a/pod/b/container/c",
		"spiffe://gpuwarden/ns/A/pod/b/container/c",
		"spiffe://gpuwarden/ns/a/pod/b/container/c/extra/x",
		"spiffe://gpuwarden/ns/a/pod/-b/container/c",
		"spiffe://gpuwarden/ns/a/pod/b/container/c?x=1",
		"spiffe://gpuwarden/ns/../pod/b/container/c",
		"https://gpuwarden/ns/a/pod/b/container/c",
	} {
		u, err := url.Parse(bad)
		if err != nil {
			continue
		}
		if id, err := ParseURI(u); err == nil {
			t.Errorf("%s parsed as %+v", bad, id)
		}
	}
}

func FuzzParseURI(f *testing.F) {
	f.Add("spiffe://gpuwarden/ns/a/pod/b/container/c")
	f.Add("spiffe://gpuwarden/ns/a%2Fb/pod/b/container/c")
	f.Fuzz(func(t *testing.T, s string) {
		u, err := url.Parse(s)
		if err != nil {
			return
		}
		id, err := ParseURI(u)
		if err != nil {
			return
		}
		for _, n := range []string{id.Namespace, id.Pod, id.Container} {
			if strings.ContainsAny(n, "/%?#") || n == "" {
				t.Fatalf("%q gave %+v", s, id)
			}
		}
		u2, err := id.URI()
		if err != nil {
			t.Fatal(err)
		}
		if id2, err := ParseURI(u2); err != nil || id2 != id {
			t.Fatalf("%+v does not round-trip", id)
		}
	})
}

// issueAll makes a CA with a server and a client certificate in dir.
func issueAll(t *testing.T, dir string, id Identity) {
	t.Helper()
	if err := CreateCA(dir, "test CA", time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := Issue(dir, dir, Request{Name: "server", Hosts: []string{"127.0.0.1", "gpu-node"}, Validity: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if err := Issue(dir, dir, Request{Name: "client", Client: &id, Validity: time.Hour}); err != nil {
		t.Fatal(err)
	}
}

func files(dir, name string) Files {
	return Files{Cert: filepath.Join(dir, name+".crt"), Key: filepath.Join(dir, name+".key"), CA: filepath.Join(dir, "ca.crt")}
}

// handshake runs one TLS handshake over loopback and returns the identity
// the server read, or the errors of both ends.
func handshake(t *testing.T, server *tls.Config, client *tls.Config) (Identity, error, error) {
	t.Helper()
	lis, err := tls.Listen("tcp", "127.0.0.1:0", server)
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	type res struct {
		id  Identity
		err error
	}
	got := make(chan res, 1)
	go func() {
		c, err := lis.Accept()
		if err != nil {
			got <- res{err: err}
			return
		}
		defer c.Close()
		tc := c.(*tls.Conn)
		tc.SetDeadline(time.Now().Add(5 * time.Second))
		if err := tc.Handshake(); err != nil {
			got <- res{err: err}
			return
		}
		p, err := PeerIdentity(tc.ConnectionState())
		got <- res{p.Identity, err}
	}()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", lis.Addr().String(), client)
	var cerr error
	if err != nil {
		cerr = err
	} else {
		// TLS 1.3: the client learns of a refused certificate on its first read.
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, cerr = c.Read(make([]byte, 1))
		c.Close()
	}
	r := <-got
	return r.id, r.err, cerr
}

func TestMutualTLS(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir()
	id := Identity{Namespace: "ns1", Pod: "pod1", Container: "c1"}
	issueAll(t, dir, id)
	issueAll(t, other, Identity{Namespace: "evil", Pod: "p", Container: "c"})
	srv, err := ServerConfig(files(dir, "server"))
	if err != nil {
		t.Fatal(err)
	}

	cli, err := ClientConfig(files(dir, "client"), "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	got, serr, _ := handshake(t, srv, cli)
	if serr != nil || got != id {
		t.Fatalf("server read %+v, %v; want %+v", got, serr, id)
	}

	// A client certificate of another CA is refused.
	foreign := files(other, "client")
	foreign.CA = filepath.Join(dir, "ca.crt")
	cli, err = ClientConfig(foreign, "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	if _, serr, cerr := handshake(t, srv, cli); serr == nil || cerr == nil {
		t.Fatalf("a foreign client certificate was taken: server %v, client %v", serr, cerr)
	}

	// No client certificate at all is refused.
	pool := x509.NewCertPool()
	b, _ := os.ReadFile(filepath.Join(dir, "ca.crt"))
	pool.AppendCertsFromPEM(b)
	if _, serr, cerr := handshake(t, srv, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS13}); serr == nil || cerr == nil {
		t.Fatalf("a client without a certificate was taken: server %v, client %v", serr, cerr)
	}

	// The client refuses a server of another CA.
	srvOther, _ := ServerConfig(files(other, "server"))
	cli, _ = ClientConfig(files(dir, "client"), "127.0.0.1")
	if _, _, cerr := handshake(t, srvOther, cli); cerr == nil {
		t.Fatal("the client took a server certificate of another CA")
	}

	// TLS 1.2 is not offered.
	old := cli.Clone()
	old.MinVersion, old.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
	if _, serr, _ := handshake(t, srv, old); serr == nil {
		t.Fatal("the server spoke TLS 1.2")
	}
}

func TestIssueRefusesOverwriteAndBadRequests(t *testing.T) {
	dir := t.TempDir()
	issueAll(t, dir, Identity{Namespace: "a", Pod: "b", Container: "c"})
	if err := CreateCA(dir, "again", time.Hour); err == nil {
		t.Error("a CA was overwritten")
	}
	if err := Issue(dir, dir, Request{Name: "client", Client: &Identity{"a", "b", "c"}, Validity: time.Hour}); err == nil {
		t.Error("a certificate was overwritten")
	}
	if err := Issue(dir, dir, Request{Name: "x", Validity: time.Hour}); err == nil {
		t.Error("issued a certificate for neither a server nor a client")
	}
	if err := Issue(dir, dir, Request{Name: "../x", Hosts: []string{"h"}, Validity: time.Hour}); err == nil {
		t.Error("issued to a path outside the directory")
	}
	if err := Issue(dir, dir, Request{Name: "y", Client: &Identity{"A", "b", "c"}, Validity: time.Hour}); err == nil {
		t.Error("issued a client certificate with an invalid namespace")
	}
	st, err := os.Stat(filepath.Join(dir, "client.key"))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("client key mode %v %v, want 0600", st.Mode(), err)
	}
	b, _ := os.ReadFile(filepath.Join(dir, "client.crt"))
	p, _ := pem.Decode(b)
	cert, err := x509.ParseCertificate(p.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if id, err := IdentityOf(cert); err != nil || id != (Identity{"a", "b", "c"}) {
		t.Errorf("identity %+v %v", id, err)
	}
}

// TestNodeCertificate: a node's certificate names the node (no workload),
// serves as a client and, with hosts, as a server; a node name is checked.
func TestNodeCertificate(t *testing.T) {
	dir := t.TempDir()
	if err := CreateCA(dir, "test", time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := Issue(dir, dir, Request{Name: "node-a", Node: "node-a", Hosts: []string{"10.0.0.7"}, Validity: time.Hour}); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(dir, "node-a.crt"))
	blk, _ := pem.Decode(b)
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	p, err := PeerOf(cert)
	if err != nil || p.Node != "node-a" || p.Identity != (Identity{}) || p.String() != "node/node-a" {
		t.Fatalf("peer %+v %v", p, err)
	}
	if _, err := IdentityOf(cert); err == nil {
		t.Fatal("a node's certificate read as a workload's identity")
	}
	if len(cert.ExtKeyUsage) != 2 || len(cert.IPAddresses) != 1 {
		t.Fatalf("usages %v, addresses %v: want client and server, 10.0.0.7", cert.ExtKeyUsage, cert.IPAddresses)
	}
	for _, bad := range []Request{{Name: "x", Node: "Node_A", Validity: time.Hour},
		{Name: "y", Node: "n", Client: &Identity{"a", "b", "c"}, Validity: time.Hour}} {
		if err := Issue(dir, dir, bad); err == nil {
			t.Errorf("issued %+v", bad)
		}
	}
}
