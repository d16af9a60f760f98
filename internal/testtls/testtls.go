// Package testtls makes TLS material for tests: a CA and certificates for
// 127.0.0.1 written to a directory, and the TLS configs they make. Any
// error fails the test.
//
// It is imported only from tests (an import rule in internal/lint says so).
package testtls

import (
	"crypto/tls"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/tlsconf"
)

// CA makes a certificate authority in dir.
func CA(tb testing.TB, dir string) *tlsconf.CA {
	tb.Helper()
	ca, err := tlsconf.GenerateCA(dir)
	if err != nil {
		tb.Fatal(err)
	}
	return ca
}

// Cert makes name's certificate for 127.0.0.1, signed by ca, with
// tlsconf's default validity, in dir.
func Cert(tb testing.TB, ca *tlsconf.CA, name, dir string) tlsconf.Files {
	tb.Helper()
	f, err := tlsconf.GenerateCert(ca, name, []string{"127.0.0.1"}, dir, time.Time{}, time.Time{})
	if err != nil {
		tb.Fatal(err)
	}
	return f
}

// ServerConfig is f's server TLS config.
func ServerConfig(tb testing.TB, f tlsconf.Files) *tls.Config {
	tb.Helper()
	cfg, err := f.Server()
	if err != nil {
		tb.Fatal(err)
	}
	return cfg
}

// ClientConfig is f's client TLS config.
func ClientConfig(tb testing.TB, f tlsconf.Files) *tls.Config {
	tb.Helper()
	cfg, err := f.Client()
	if err != nil {
		tb.Fatal(err)
	}
	return cfg
}
