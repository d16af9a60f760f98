package cli

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/ferrymq/ferrymq/tlsconf"
)

// TLSFlags are the TLS flags every server has: -tls-cert and -tls-key, the
// node's certificate and its private key, and -tls-ca, the CA that signs
// its peers' certificates (clients must then present one). None of them:
// no TLS.
type TLSFlags struct {
	Cert, Key, CA string
}

// Register adds -tls-cert, -tls-key and -tls-ca to fs.
func (f *TLSFlags) Register(fs *flag.FlagSet) {
	fs.StringVar(&f.Cert, "tls-cert", "", "PEM certificate of this node: serve TLS with it and present it to the servers it dials (needs -tls-key; empty: no TLS)")
	fs.StringVar(&f.Key, "tls-key", "", "PEM private key of -tls-cert")
	fs.StringVar(&f.CA, "tls-ca", "", "PEM CA certificate that signs the peers' certificates: clients must present a certificate it signed, and servers dialed are verified with it")
}

// Enabled reports whether any TLS flag is set.
func (f *TLSFlags) Enabled() bool { return f.Cert != "" || f.Key != "" || f.CA != "" }

// Server is the config that serves TLS with the flags (nil without them).
// A missing or unreadable file, a file without what it should hold, or a
// certificate without its key is a ConfigError naming the flag.
func (f *TLSFlags) Server() (*tls.Config, error) {
	if !f.Enabled() {
		return nil, nil
	}
	if f.Cert == "" || f.Key == "" {
		return nil, &ConfigError{errors.New("-tls-cert and -tls-key go together, and a server with -tls-ca needs both: it serves TLS with its own certificate")}
	}
	if err := f.check(); err != nil {
		return nil, err
	}
	cfg, err := f.files().Server()
	if err != nil {
		return nil, &ConfigError{err}
	}
	return cfg, nil
}

// Client is the config of what the server dials (nil without the flags):
// it verifies servers with -tls-ca and presents -tls-cert.
func (f *TLSFlags) Client() (*tls.Config, error) {
	if !f.Enabled() {
		return nil, nil
	}
	if (f.Cert == "") != (f.Key == "") {
		return nil, &ConfigError{errors.New("-tls-cert and -tls-key go together: a certificate needs its private key")}
	}
	if err := f.check(); err != nil {
		return nil, err
	}
	cfg, err := f.files().Client()
	if err != nil {
		return nil, &ConfigError{err}
	}
	return cfg, nil
}

// Configs is Server and Client: a server's TLSServer and TLSClient, both
// nil without the flags.
func (f *TLSFlags) Configs() (server, client *tls.Config, err error) {
	if server, err = f.Server(); err != nil {
		return nil, nil, err
	}
	if client, err = f.Client(); err != nil {
		return nil, nil, err
	}
	return server, client, nil
}

func (f *TLSFlags) files() tlsconf.Files {
	return tlsconf.Files{Cert: f.Cert, Key: f.Key, CA: f.CA}
}

// check reads every file named and checks it holds what its flag says,
// so that an error names the flag and the file.
func (f *TLSFlags) check() error {
	label := func(flag, path string) string { return "-" + flag + " " + path }
	if err := CheckTLSFiles(f.Cert, f.Key, f.CA, label); err != nil {
		return &ConfigError{err}
	}
	return nil
}

// CheckTLSFiles checks the TLS files a program's flags tls-cert, tls-key
// and tls-ca name (each "" when not given): each file is readable, the CA
// file and the certificate file hold a PEM certificate, and the key is the
// certificate's (both are checked only when both are named). An error
// names the file as label(flag, path) says, e.g. "-tls-ca ca.pem".
func CheckTLSFiles(cert, key, ca string, label func(flag, path string) string) error {
	read := func(flag, path string) ([]byte, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", label(flag, path), err)
		}
		return b, nil
	}
	if ca != "" {
		b, err := read("tls-ca", ca)
		if err != nil {
			return err
		}
		if !x509.NewCertPool().AppendCertsFromPEM(b) {
			return fmt.Errorf("%s: holds no PEM certificate", label("tls-ca", ca))
		}
	}
	if cert == "" || key == "" {
		return nil
	}
	certPEM, err := read("tls-cert", cert)
	if err != nil {
		return err
	}
	keyPEM, err := read("tls-key", key)
	if err != nil {
		return err
	}
	if !holdsCertificate(certPEM) {
		return fmt.Errorf("%s: holds no PEM certificate", label("tls-cert", cert))
	}
	if _, err := tls.X509KeyPair(certPEM, keyPEM); err != nil {
		return fmt.Errorf("%s (the key of %s): %w", label("tls-key", key), label("tls-cert", cert), err)
	}
	return nil
}

func holdsCertificate(b []byte) bool {
	for {
		var block *pem.Block
		if block, b = pem.Decode(b); block == nil {
			return false
		}
		if block.Type == "CERTIFICATE" {
			if _, err := x509.ParseCertificate(block.Bytes); err == nil {
				return true
			}
		}
	}
}
