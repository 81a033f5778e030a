package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// The files a directory made by CreateCA and Issue holds.
const (
	CAFile  = "ca.crt"
	CAKey   = "ca.key"
	CertExt = ".crt"
	KeyExt  = ".key"
)

// Request is one certificate to issue.
type Request struct {
	Name   string    // the subject's common name, and the files' base name
	Hosts  []string  // a server's DNS names and addresses
	Client *Identity // a client's identity (its URI SAN)
	// Node makes a node's certificate (URI spiffe://gpuwarden/node/NODE),
	// good as a client (its agent relays its pods' sessions) and, with
	// Hosts, as a server.
	Node     string
	Validity time.Duration // from now
}

// CreateCA makes a new CA in dir: ca.crt and ca.key (0600). It refuses to
// overwrite a CA already there.
func CreateCA(dir, name string, validity time.Duration) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("generate CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(validity),
		IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return fmt.Errorf("create CA certificate: %w", err)
	}
	return writePair(dir, filepath.Join(dir, CAFile), filepath.Join(dir, CAKey), der, key)
}

// Issue signs a certificate with the CA in caDir and writes <name>.crt and
// <name>.key (0600) to dir. A request has hosts (a server) or a client
// identity, not both; a node's has a node name and may have hosts.
func Issue(caDir, dir string, r Request) error {
	switch {
	case r.Node != "" && r.Client != nil:
		return errors.New("a certificate is a node's or a workload's, not both")
	case r.Node == "" && (len(r.Hosts) == 0) == (r.Client == nil):
		return errors.New("a certificate is for a server (hosts), a client (identity) or a node (name)")
	}
	if r.Name == "" || filepath.Base(r.Name) != r.Name || r.Name[0] == '.' {
		return fmt.Errorf("name %q: want a plain file name", r.Name)
	}
	ca, caKey, err := loadCA(caDir)
	if err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("generate key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: r.Name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(r.Validity),
		KeyUsage: x509.KeyUsageDigitalSignature,
	}
	if r.Node != "" {
		u, err := NodeURI(r.Node)
		if err != nil {
			return err
		}
		tmpl.URIs = append(tmpl.URIs, u)
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	if r.Client != nil {
		u, err := r.Client.URI()
		if err != nil {
			return err
		}
		tmpl.URIs = append(tmpl.URIs, u)
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	} else if len(r.Hosts) > 0 {
		for _, h := range r.Hosts {
			if ip := net.ParseIP(h); ip != nil {
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			} else {
				tmpl.DNSNames = append(tmpl.DNSNames, h)
			}
		}
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return fmt.Errorf("sign certificate: %w", err)
	}
	return writePair(dir, filepath.Join(dir, r.Name+CertExt), filepath.Join(dir, r.Name+KeyExt), der, key)
}

func loadCA(dir string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	cb, err := os.ReadFile(filepath.Join(dir, CAFile))
	if err != nil {
		return nil, nil, fmt.Errorf("read CA: %w", err)
	}
	kb, err := os.ReadFile(filepath.Join(dir, CAKey))
	if err != nil {
		return nil, nil, fmt.Errorf("read CA key: %w", err)
	}
	cp, _ := pem.Decode(cb)
	kp, _ := pem.Decode(kb)
	if cp == nil || kp == nil {
		return nil, nil, fmt.Errorf("CA in %s: not PEM", dir)
	}
	ca, err := x509.ParseCertificate(cp.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("parse CA: %w", err)
	}
	key, err := x509.ParseECPrivateKey(kp.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("parse CA key: %w", err)
	}
	return ca, key, nil
}

func writePair(dir, certPath, keyPath string, der []byte, key *ecdsa.PrivateKey) error {
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return fmt.Errorf("encode key: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("make %s: %w", dir, err)
	}
	if err := writeNew(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		return err
	}
	return writeNew(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
}

// writeNew writes a file that must not exist yet: credentials are never
// overwritten by accident.
func writeNew(path string, b []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Close()
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}
