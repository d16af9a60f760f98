package main

import (
	"bytes"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(b)
	if block == nil {
		t.Fatalf("%s holds no PEM", path)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// certs makes a CA and a certificate per node (valid for its hosts, as a
// server and as a client) and per client, each signed by the CA, with the
// keys readable by their owner only; it refuses to replace a CA without
// --force.
func TestCerts(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")
	out := mustCtl(t, "certs", dir, "--node", "m1=127.0.0.1,localhost", "--node", "b1=10.0.0.2,b1.example", "--client", "admin", "--days", "2")
	for _, name := range []string{"ca", "m1", "b1", "admin"} {
		if !strings.Contains(out, filepath.Join(dir, name+".pem")) || !strings.Contains(out, filepath.Join(dir, name+"-key.pem")) {
			t.Errorf("the output does not name %s's files:\n%s", name, out)
		}
		st, err := os.Stat(filepath.Join(dir, name+"-key.pem"))
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s-key.pem: %v, mode %v; want 0600", name, err, st.Mode().Perm())
		}
	}
	ca := readCert(t, filepath.Join(dir, "ca.pem"))
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	for _, tc := range []struct {
		name  string
		hosts []string
		usage x509.ExtKeyUsage
	}{
		{"m1", []string{"127.0.0.1", "localhost"}, x509.ExtKeyUsageServerAuth},
		{"m1", nil, x509.ExtKeyUsageClientAuth},
		{"b1", []string{"10.0.0.2", "b1.example"}, x509.ExtKeyUsageServerAuth},
		{"admin", nil, x509.ExtKeyUsageClientAuth},
	} {
		c := readCert(t, filepath.Join(dir, tc.name+".pem"))
		if _, err := c.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{tc.usage}}); err != nil {
			t.Errorf("%s as %v: %v", tc.name, tc.usage, err)
		}
		for _, h := range tc.hosts {
			if err := c.VerifyHostname(h); err != nil {
				t.Errorf("%s for %s: %v", tc.name, h, err)
			}
		}
		if left := time.Until(c.NotAfter); left < 47*time.Hour || left > 48*time.Hour {
			t.Errorf("%s valid for %v more, want about 2 days (--days 2)", tc.name, left)
		}
	}
	// A client's certificate is for client authentication only and names
	// no host, so a client named like a host cannot serve as it.
	admin := readCert(t, filepath.Join(dir, "admin.pem"))
	if admin.Subject.CommonName != "admin" || len(admin.DNSNames) != 0 || len(admin.IPAddresses) != 0 {
		t.Errorf("admin's certificate: CN %q, DNS %v, IP %v; want CN admin and no SAN", admin.Subject.CommonName, admin.DNSNames, admin.IPAddresses)
	}
	if _, err := admin.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err == nil {
		t.Error("admin's client certificate is valid for server authentication")
	}
	if err := readCert(t, filepath.Join(dir, "b1.pem")).VerifyHostname("127.0.0.1"); err == nil {
		t.Error("b1's certificate is valid for a host it was not given")
	}

	before, _ := os.ReadFile(filepath.Join(dir, "ca.pem"))
	code, _, errOut := ctl("certs", dir, "--node", "m2=127.0.0.1")
	if code != exitUsage || !strings.Contains(errOut, "--force") || !strings.Contains(errOut, "ca.pem exists") {
		t.Fatalf("certs into a directory with a CA: exit %d, %q; want 2 saying --force", code, errOut)
	}
	if after, _ := os.ReadFile(filepath.Join(dir, "ca.pem")); !bytes.Equal(before, after) {
		t.Fatal("a refused certs replaced the CA")
	}
	if _, err := os.Stat(filepath.Join(dir, "m2.pem")); err == nil {
		t.Fatal("a refused certs wrote a certificate")
	}
	var res []certJSON
	if err := json.Unmarshal([]byte(mustCtl(t, "certs", dir, "--node", "m2=127.0.0.1", "--force", "--json")), &res); err != nil ||
		len(res) != 2 || res[0].Kind != "ca" || res[1].Name != "m2" || res[1].Hosts[0] != "127.0.0.1" {
		t.Fatalf("certs --force --json: %+v, %v", res, err)
	}
	if after, _ := os.ReadFile(filepath.Join(dir, "ca.pem")); bytes.Equal(before, after) {
		t.Fatal("certs --force kept the old CA")
	}

	for _, args := range [][]string{
		{"certs", t.TempDir()},                                         // nothing to make
		{"certs", t.TempDir(), "--node", "m1"},                         // no hosts
		{"certs", t.TempDir(), "--node", "m1=127.0.0.1,,x"},            // an empty host
		{"certs", t.TempDir(), "--node", "m1=a b"},                     // not a host
		{"certs", t.TempDir(), "--node", "../m1=127.0.0.1"},            // not a file name
		{"certs", t.TempDir(), "--node", "m1=h", "--client", "m1"},     // twice
		{"certs", t.TempDir(), "--node", "m1=h", "--days", "0"},        // no validity
		{"certs", t.TempDir(), "--node", "ca=127.0.0.1"},               // the CA's files
		{"certs", t.TempDir(), "--node", "m1=h", "--tls-ca", "absent"}, // the TLS flags are not read: certs dials nothing
	} {
		want := exitUsage
		if args[len(args)-2] == "--tls-ca" {
			want = exitOK
		}
		if code, _, errOut := ctl(args...); code != want {
			t.Errorf("ferryctl %q: exit %d (%s), want %d", args, code, errOut, want)
		}
	}
}
