package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// Files are the PEM files of one end: its certificate and key, and the CA
// that must have signed the other end's certificate.
type Files struct {
	Cert, Key, CA string
}

func (f Files) load() (tls.Certificate, *x509.CertPool, error) {
	if f.Cert == "" || f.Key == "" || f.CA == "" {
		return tls.Certificate{}, nil, errors.New("a certificate, its key and a CA are all needed")
	}
	cert, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("load certificate %s: %w", f.Cert, err)
	}
	b, err := os.ReadFile(f.CA)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("read CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return tls.Certificate{}, nil, fmt.Errorf("CA %s: no PEM certificate in it", f.CA)
	}
	return cert, pool, nil
}

// ServerConfig is the GPU node's side: TLS 1.3 only, and a client
// certificate signed by the CA is required.
func ServerConfig(f Files) (*tls.Config, error) {
	cert, pool, err := f.load()
	if err != nil {
		return nil, err
	}
	return &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool}, nil
}

// ClientConfig is the client's side: TLS 1.3 only, the server's certificate
// signed by the CA and valid for serverName (a host name or an address).
func ClientConfig(f Files, serverName string) (*tls.Config, error) {
	cert, pool, err := f.load()
	if err != nil {
		return nil, err
	}
	return &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert},
		RootCAs: pool, ServerName: serverName}, nil
}

// PeerIdentity is who a handshaken server-side connection's client is:
// its verified certificate's URI.
func PeerIdentity(st tls.ConnectionState) (Peer, error) {
	if len(st.VerifiedChains) == 0 || len(st.VerifiedChains[0]) == 0 {
		return Peer{}, errors.New("no verified client certificate")
	}
	return PeerOf(st.VerifiedChains[0][0])
}
