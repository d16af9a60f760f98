// Package tlsconf loads ferrymq's TLS material from PEM files and makes it:
// a throwaway certificate authority and per-node certificates, with Go's
// crypto only (no openssl).
//
// The three flags of every program map onto Files: -tls-cert and -tls-key
// are the node's certificate and private key, -tls-ca the CA that signs the
// peers' certificates. A server needs a certificate and its key to speak
// TLS at all; given a CA as well it requires every client to present a
// certificate signed by it. A client verifies the server's certificate with
// the CA (the system's roots without one) and presents its own certificate,
// if it has one, to servers that require it.
//
// Every config made here accepts TLS 1.2 at least; Go negotiates 1.3 with
// any peer that has it.
package tlsconf

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// MinVersion is the oldest TLS version the configs of this package accept.
const MinVersion = tls.VersionTLS12

// Files names a node's PEM files. An empty Files means no TLS.
type Files struct {
	Cert string // the node's certificate chain (-tls-cert)
	Key  string // its private key (-tls-key)
	CA   string // the CA that signs the peers' certificates (-tls-ca)
}

// Enabled reports whether any file is named.
func (f Files) Enabled() bool { return f.Cert != "" || f.Key != "" || f.CA != "" }

// Server is the config of a server that speaks TLS with f: the certificate
// and its key are required; with a CA, clients must present a certificate
// signed by it (tls.RequireAndVerifyClientCert).
func (f Files) Server() (*tls.Config, error) {
	if f.Cert == "" || f.Key == "" {
		return nil, errors.New("tls: a server needs a certificate and its key (-tls-cert and -tls-key)")
	}
	cert, err := loadPair(f.Cert, f.Key)
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{MinVersion: MinVersion, Certificates: []tls.Certificate{cert}}
	if f.CA != "" {
		pool, err := loadPool(f.CA)
		if err != nil {
			return nil, err
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// Client is the config of a client with f: it verifies servers with the CA
// (the system's roots when none is named) and presents the certificate, if
// one is named, to servers that ask for one. A certificate needs its key
// and the other way round. The certificate is presented whatever CAs the
// server says it accepts, so that a server with another CA refuses it by
// name.
func (f Files) Client() (*tls.Config, error) {
	if (f.Cert == "") != (f.Key == "") {
		return nil, errors.New("tls: a client certificate needs its key and a key its certificate (-tls-cert and -tls-key)")
	}
	cfg := &tls.Config{MinVersion: MinVersion}
	if f.CA != "" {
		pool, err := loadPool(f.CA)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	if f.Cert != "" {
		cert, err := loadPair(f.Cert, f.Key)
		if err != nil {
			return nil, err
		}
		// Always presented, even to a server that names other CAs as the
		// ones it accepts (Go's default would then send none): the server
		// can then say which CA is wrong rather than "no certificate".
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }
	}
	return cfg, nil
}

// ServerConfig is Files{cert, key, ca}.Server().
func ServerConfig(certFile, keyFile, caFile string) (*tls.Config, error) {
	return Files{Cert: certFile, Key: keyFile, CA: caFile}.Server()
}

// ClientConfig is Files{cert, key, ca}.Client(): caFile verifies the
// server; certFile and keyFile, both or neither, are the client's own.
func ClientConfig(caFile, certFile, keyFile string) (*tls.Config, error) {
	return Files{Cert: certFile, Key: keyFile, CA: caFile}.Client()
}

func loadPair(certFile, keyFile string) (tls.Certificate, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("tls: certificate %s with key %s: %w", certFile, keyFile, err)
	}
	return cert, nil
}

func loadPool(caFile string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("tls: CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("tls: CA file %s holds no PEM certificate", caFile)
	}
	return pool, nil
}
