package cli

import (
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferrymq/ferrymq/internal/testtls"
	"github.com/ferrymq/ferrymq/tlsconf"
)

// tlsMaterial makes a CA and two node certificates (a and b) in a temp dir.
func tlsMaterial(t *testing.T) (dir string, a, b tlsconf.Files) {
	t.Helper()
	dir = t.TempDir()
	ca := testtls.CA(t, dir)
	return dir, testtls.Cert(t, ca, "a", dir), testtls.Cert(t, ca, "b", dir)
}

// parseTLS parses args (and a config file, if given) into a TLSFlags.
func parseTLS(t *testing.T, args ...string) *TLSFlags {
	t.Helper()
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var f TLSFlags
	f.Register(fs)
	if err := Parse(fs, args); err != nil {
		t.Fatal(err)
	}
	return &f
}

func TestTLSFlags(t *testing.T) {
	dir, a, b := tlsMaterial(t)

	t.Run("none: no TLS", func(t *testing.T) {
		s, c, err := parseTLS(t).Configs()
		if s != nil || c != nil || err != nil {
			t.Fatalf("got %v, %v, %v; want no TLS and no error", s, c, err)
		}
	})

	t.Run("all three, also from a config file", func(t *testing.T) {
		file := filepath.Join(dir, "c.json")
		body := fmt.Sprintf(`{"tls-cert": %q, "tls-key": %q, "tls-ca": %q}`, a.Cert, a.Key, a.CA)
		if err := os.WriteFile(file, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, args := range [][]string{
			{"-tls-cert", a.Cert, "-tls-key", a.Key, "-tls-ca", a.CA},
			{"-config", file},
		} {
			s, c, err := parseTLS(t, args...).Configs()
			if err != nil {
				t.Fatalf("%v: %v", args, err)
			}
			if len(s.Certificates) != 1 || s.ClientCAs == nil || s.ClientAuth != tls.RequireAndVerifyClientCert {
				t.Errorf("%v: the server config must serve the certificate and require client certificates signed by the CA", args)
			}
			if c.RootCAs == nil || c.GetClientCertificate == nil {
				t.Errorf("%v: the client config must verify with the CA and present the certificate", args)
			}
		}
	})

	t.Run("a certificate and key without a CA: a server that takes any client", func(t *testing.T) {
		s, c, err := parseTLS(t, "-tls-cert", a.Cert, "-tls-key", a.Key).Configs()
		if err != nil || s == nil || c == nil || s.ClientAuth == tls.RequireAndVerifyClientCert {
			t.Fatalf("got %v, %v, %v", s, c, err)
		}
	})

	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.pem")
	for _, tc := range []struct {
		name string
		args []string
		want []string // in the error
	}{
		{"a certificate without its key", []string{"-tls-cert", a.Cert, "-tls-ca", a.CA}, []string{"-tls-cert and -tls-key go together"}},
		{"a key without its certificate", []string{"-tls-key", a.Key}, []string{"-tls-cert and -tls-key go together"}},
		{"a CA alone", []string{"-tls-ca", a.CA}, []string{"-tls-cert and -tls-key"}},
		{"a CA file that is not there", []string{"-tls-cert", a.Cert, "-tls-key", a.Key, "-tls-ca", missing}, []string{"-tls-ca " + missing, "no such file"}},
		{"a CA file that is not PEM", []string{"-tls-cert", a.Cert, "-tls-key", a.Key, "-tls-ca", notPEM}, []string{"-tls-ca " + notPEM, "no PEM certificate"}},
		{"a certificate file that is not there", []string{"-tls-cert", missing, "-tls-key", a.Key}, []string{"-tls-cert " + missing, "no such file"}},
		{"a certificate file that is a key", []string{"-tls-cert", a.Key, "-tls-key", a.Key}, []string{"-tls-cert " + a.Key, "no PEM certificate"}},
		{"a key file that is not there", []string{"-tls-cert", a.Cert, "-tls-key", missing}, []string{"-tls-key " + missing, "no such file"}},
		{"the key of another certificate", []string{"-tls-cert", a.Cert, "-tls-key", b.Key}, []string{"-tls-key " + b.Key, "-tls-cert " + a.Cert}},
		{"a key file that is not PEM", []string{"-tls-cert", a.Cert, "-tls-key", notPEM}, []string{"-tls-key " + notPEM}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := parseTLS(t, tc.args...).Configs()
			var ce *ConfigError
			if !errors.As(err, &ce) || ExitCode(err) != ExitConfig {
				t.Fatalf("got %v (exit %d), want a config error (exit 2)", err, ExitCode(err))
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}
