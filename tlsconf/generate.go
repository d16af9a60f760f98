package tlsconf

import (
	"crypto"
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
	"strings"
	"time"
)

// File names in a directory of generated material.
const (
	CAFile    = "ca.pem"     // the CA's certificate: every node's -tls-ca
	CAKeyFile = "ca-key.pem" // the CA's private key: keep it off the nodes
)

// CertFile and KeyFile are the names GenerateCert gives a node's files.
func CertFile(name string) string { return name + ".pem" }

// KeyFile is the name of the private key of CertFile(name).
func KeyFile(name string) string { return name + "-key.pem" }

// CA is a certificate authority that signs node certificates.
type CA struct {
	Cert     *x509.Certificate
	Key      crypto.Signer
	CertFile string // where its certificate is (a node's -tls-ca)
}

// Default validity of generated material when no window is given.
const (
	DefaultCAValidity   = 10 * 365 * 24 * time.Hour
	DefaultCertValidity = 365 * 24 * time.Hour
	// backdate starts a default window an hour ago, so a peer whose clock
	// is a little behind still accepts a fresh certificate.
	backdate = time.Hour
)

// GenerateCA makes a new CA (an ECDSA P-256 key and a self-signed
// certificate valid for DefaultCAValidity) and writes it to dir as CAFile
// and CAKeyFile (the key readable by its owner only). dir is created if
// needed; existing files are overwritten.
func GenerateCA(dir string) (*CA, error) {
	return GenerateCAValid(dir, time.Time{}, time.Time{})
}

// GenerateCAValid is GenerateCA with a validity window; zero times take
// the defaults (from an hour ago, for DefaultCAValidity).
func GenerateCAValid(dir string, notBefore, notAfter time.Time) (*CA, error) {
	notBefore, notAfter = window(notBefore, notAfter, DefaultCAValidity)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("tls: CA key: %w", err)
	}
	serial, err := serialNumber()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{"ferrymq"}, CommonName: "ferrymq CA " + serial.Text(16)[:8]},
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("tls: CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("tls: CA certificate: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("tls: %w", err)
	}
	certPath := filepath.Join(dir, CAFile)
	if err := writePEM(certPath, "CERTIFICATE", der, 0o644); err != nil {
		return nil, err
	}
	if err := writeKey(filepath.Join(dir, CAKeyFile), key); err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key, CertFile: certPath}, nil
}

// LoadCA reads a CA that GenerateCA wrote to dir, to issue more
// certificates with it.
func LoadCA(dir string) (*CA, error) {
	certPath := filepath.Join(dir, CAFile)
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, fmt.Errorf("tls: %w", err)
	}
	block, _ := pem.Decode(certPEM)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("tls: %s holds no PEM certificate", certPath)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("tls: %s: %w", certPath, err)
	}
	keyPath := filepath.Join(dir, CAKeyFile)
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, fmt.Errorf("tls: %w", err)
	}
	block, _ = pem.Decode(keyPEM)
	if block == nil {
		return nil, fmt.Errorf("tls: %s holds no PEM key", keyPath)
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("tls: %s: %w", keyPath, err)
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("tls: %s: not a signing key", keyPath)
	}
	return &CA{Cert: cert, Key: signer, CertFile: certPath}, nil
}

// GenerateCert issues a certificate for a node named name, valid for hosts
// (each an IP address or a DNS name, as the node's peers dial it) from
// notBefore to notAfter (zero times take the defaults: from an hour ago,
// for DefaultCertValidity), signed by ca. It serves both as a server's and
// as a client's certificate (nodes are both). It writes CertFile(name) and
// KeyFile(name) to dir and returns the node's Files, its CA included.
func GenerateCert(ca *CA, name string, hosts []string, dir string, notBefore, notAfter time.Time) (Files, error) {
	if len(hosts) == 0 {
		return Files{}, errors.New("tls: a node certificate needs at least one host (IP or DNS name)")
	}
	return generate(ca, name, hosts, dir, notBefore, notAfter)
}

// GenerateClientCert issues a client's certificate, as GenerateCert does a
// node's, but for client authentication only (ExtKeyUsageClientAuth) and
// with no host names or addresses: its common name is name. No server can
// present it, whatever the name looks like.
func GenerateClientCert(ca *CA, name string, dir string, notBefore, notAfter time.Time) (Files, error) {
	return generate(ca, name, nil, dir, notBefore, notAfter)
}

// generate issues a node's certificate (hosts given: server and client
// usage) or a client's (no hosts: client usage only).
func generate(ca *CA, name string, hosts []string, dir string, notBefore, notAfter time.Time) (Files, error) {
	if name == "" || strings.ContainsAny(name, `/\`) || name != filepath.Base(name) {
		return Files{}, fmt.Errorf("tls: certificate name %q must be a plain file name", name)
	}
	notBefore, notAfter = window(notBefore, notAfter, DefaultCertValidity)
	if !notAfter.After(notBefore) {
		return Files{}, fmt.Errorf("tls: certificate window %v to %v is empty", notBefore, notAfter)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Files{}, fmt.Errorf("tls: key: %w", err)
	}
	serial, err := serialNumber()
	if err != nil {
		return Files{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{Organization: []string{"ferrymq"}, CommonName: name},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if len(hosts) > 0 {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return Files{}, fmt.Errorf("tls: certificate for %s: %w", name, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Files{}, fmt.Errorf("tls: %w", err)
	}
	f := Files{Cert: filepath.Join(dir, CertFile(name)), Key: filepath.Join(dir, KeyFile(name)), CA: ca.CertFile}
	if err := writePEM(f.Cert, "CERTIFICATE", der, 0o644); err != nil {
		return Files{}, err
	}
	if err := writeKey(f.Key, key); err != nil {
		return Files{}, err
	}
	return f, nil
}

func window(notBefore, notAfter time.Time, validity time.Duration) (time.Time, time.Time) {
	if notBefore.IsZero() {
		notBefore = time.Now().Add(-backdate)
	}
	if notAfter.IsZero() {
		notAfter = notBefore.Add(validity)
	}
	return notBefore, notAfter
}

func serialNumber() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("tls: serial number: %w", err)
	}
	return n.Add(n, big.NewInt(1)), nil // never zero
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("tls: key: %w", err)
	}
	return writePEM(path, "PRIVATE KEY", der, 0o600)
}

func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	data := pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
	// Remove first, so that a key file left by an earlier run with wider
	// permissions does not keep them.
	_ = os.Remove(path)
	if err := os.WriteFile(path, data, mode); err != nil {
		return fmt.Errorf("tls: %w", err)
	}
	return nil
}
