package tlsconf

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

// handshake runs a TLS handshake between a server and a client config over
// an in-memory pipe and returns both sides' errors.
func handshake(t *testing.T, srv, cli *tls.Config, serverName string) (serverErr, clientErr error) {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	deadline := time.Now().Add(10 * time.Second)
	_ = a.SetDeadline(deadline)
	_ = b.SetDeadline(deadline)
	cli = cli.Clone()
	cli.ServerName = serverName
	done := make(chan error, 1)
	go func() {
		s := tls.Server(a, srv)
		err := s.Handshake()
		if err == nil {
			// TLS 1.3: the server checks the client's certificate after the
			// client's handshake returned; the client learns of a refusal
			// on its first read.
			_, err = s.Write([]byte{1})
		}
		if err != nil {
			_ = a.Close()
		}
		done <- err
	}()
	c := tls.Client(b, cli)
	clientErr = c.Handshake()
	if clientErr == nil {
		var one [1]byte
		_, clientErr = c.Read(one[:])
	}
	_ = b.Close()
	return <-done, clientErr
}

func TestGeneratedMaterialHandshakes(t *testing.T) {
	dir := t.TempDir()
	ca, err := GenerateCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	srvFiles, err := GenerateCert(ca, "m1", []string{"127.0.0.1", "meta-1.ferry.svc"}, dir, time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	cliFiles, err := GenerateCert(ca, "b1", []string{"127.0.0.1"}, dir, time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if srvFiles.CA != ca.CertFile {
		t.Fatalf("GenerateCert's Files name CA %q, want %q", srvFiles.CA, ca.CertFile)
	}
	st, err := os.Stat(srvFiles.Key)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v, want 0600", st.Mode().Perm())
	}
	srv, err := srvFiles.Server()
	if err != nil {
		t.Fatal(err)
	}
	if srv.ClientAuth != tls.RequireAndVerifyClientCert {
		t.Fatalf("a server with a CA has ClientAuth %v, want RequireAndVerifyClientCert", srv.ClientAuth)
	}
	if srv.MinVersion != tls.VersionTLS12 {
		t.Fatalf("MinVersion %x, want TLS 1.2", srv.MinVersion)
	}
	cli, err := cliFiles.Client()
	if err != nil {
		t.Fatal(err)
	}
	// By IP SAN and by DNS SAN.
	for _, name := range []string{"127.0.0.1", "meta-1.ferry.svc"} {
		if serr, cerr := handshake(t, srv, cli, name); serr != nil || cerr != nil {
			t.Fatalf("handshake as %s: server %v, client %v", name, serr, cerr)
		}
	}
	// A name the certificate does not carry.
	if _, cerr := handshake(t, srv, cli, "other.host"); !errors.As(cerr, new(x509.HostnameError)) {
		t.Fatalf("handshake as a name not in the SANs: client error %v, want a HostnameError", cerr)
	}
	// A client without a certificate, against a server that requires one.
	anon, err := ClientConfig(ca.CertFile, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if serr, _ := handshake(t, srv, anon, "127.0.0.1"); serr == nil {
		t.Fatal("a server with a CA accepted a client without a certificate")
	}
	// Without a CA the server takes any client.
	open, err := ServerConfig(srvFiles.Cert, srvFiles.Key, "")
	if err != nil {
		t.Fatal(err)
	}
	if serr, cerr := handshake(t, open, anon, "127.0.0.1"); serr != nil || cerr != nil {
		t.Fatalf("server without a CA, client without a certificate: server %v, client %v", serr, cerr)
	}
}

func TestWrongCAAndExpiredAreRefused(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir()
	ca, err := GenerateCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	ca2, err := GenerateCA(other)
	if err != nil {
		t.Fatal(err)
	}
	good, err := GenerateCert(ca, "good", []string{"127.0.0.1"}, dir, time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := GenerateCert(ca2, "stranger", []string{"127.0.0.1"}, other, time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	expired, err := GenerateCert(ca, "expired", []string{"127.0.0.1"}, dir, time.Now().Add(-48*time.Hour), time.Now().Add(-24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	srv, _ := good.Server()
	goodCli, _ := good.Client()

	// A server certificate from another CA: the client refuses it.
	strangerSrv, _ := stranger.Server()
	if _, cerr := handshake(t, strangerSrv, goodCli, "127.0.0.1"); !errors.As(cerr, new(x509.UnknownAuthorityError)) {
		t.Fatalf("server certificate from another CA: client error %v, want UnknownAuthorityError", cerr)
	}
	// A client certificate from another CA: the server refuses it.
	strangerCli, _ := ClientConfig(ca.CertFile, stranger.Cert, stranger.Key)
	if serr, _ := handshake(t, srv, strangerCli, "127.0.0.1"); !errors.As(serr, new(x509.UnknownAuthorityError)) {
		t.Fatalf("client certificate from another CA: server error %v, want UnknownAuthorityError", serr)
	}
	// An expired server certificate.
	expiredSrv, _ := expired.Server()
	var invalid x509.CertificateInvalidError
	if _, cerr := handshake(t, expiredSrv, goodCli, "127.0.0.1"); !errors.As(cerr, &invalid) || invalid.Reason != x509.Expired {
		t.Fatalf("expired server certificate: client error %v, want CertificateInvalidError Expired", cerr)
	}
	// An expired client certificate.
	expiredCli, _ := expired.Client()
	if serr, _ := handshake(t, srv, expiredCli, "127.0.0.1"); !errors.As(serr, &invalid) || invalid.Reason != x509.Expired {
		t.Fatalf("expired client certificate: server error %v, want CertificateInvalidError Expired", serr)
	}
}

func TestLoadCAIssuesMore(t *testing.T) {
	dir := t.TempDir()
	ca, err := GenerateCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	loaded, err := LoadCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !loaded.Cert.Equal(ca.Cert) {
		t.Fatal("LoadCA read another certificate")
	}
	f, err := GenerateCert(loaded, "later", []string{"10.0.0.7"}, dir, time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("a certificate issued by the loaded CA does not verify against the original: %v", err)
	}
}

func TestBadFilesNameTheFlag(t *testing.T) {
	dir := t.TempDir()
	ca, err := GenerateCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	f, err := GenerateCert(ca, "n", []string{"localhost"}, dir, time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		run  func() error
		want string
	}{
		{"server without key", func() error { _, err := ServerConfig(f.Cert, "", f.CA); return err }, "-tls-key"},
		{"client cert without key", func() error { _, err := ClientConfig(f.CA, f.Cert, ""); return err }, "-tls-key"},
		{"missing CA file", func() error { _, err := ClientConfig(dir+"/nope.pem", "", ""); return err }, "nope.pem"},
		{"CA file not PEM", func() error { _, err := ServerConfig(f.Cert, f.Key, f.Key); return err }, "no PEM certificate"},
		{"key of another cert", func() error { _, err := ServerConfig(f.Cert, ca.CertFile, ""); return err }, f.Cert},
		{"bad name", func() error {
			_, err := GenerateCert(ca, "../x", []string{"h"}, dir, time.Time{}, time.Time{})
			return err
		}, "plain file name"},
		{"no hosts", func() error { _, err := GenerateCert(ca, "x", nil, dir, time.Time{}, time.Time{}); return err }, "at least one host"},
	} {
		err := c.run()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one naming %q", c.name, err, c.want)
		}
	}
}

// A client's certificate authenticates the client to a server and is
// refused when a server presents it, even when its name looks like the
// host the client dials; a node's certificate serves and authenticates.
func TestClientCertCannotServe(t *testing.T) {
	dir := t.TempDir()
	ca, err := GenerateCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	node, err := GenerateCert(ca, "m1", []string{"127.0.0.1", "m1.example"}, dir, time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	client, err := GenerateClientCert(ca, "m1.example", dir, time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	certOf := func(f Files) *x509.Certificate {
		t.Helper()
		c, err := loadPair(f.Cert, f.Key)
		if err != nil {
			t.Fatal(err)
		}
		x, err := x509.ParseCertificate(c.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	c := certOf(client)
	if c.Subject.CommonName != "m1.example" || len(c.DNSNames) != 0 || len(c.IPAddresses) != 0 ||
		len(c.ExtKeyUsage) != 1 || c.ExtKeyUsage[0] != x509.ExtKeyUsageClientAuth {
		t.Fatalf("client certificate: CN %q, DNS %v, IP %v, usage %v; want CN m1.example, no SAN, client auth only",
			c.Subject.CommonName, c.DNSNames, c.IPAddresses, c.ExtKeyUsage)
	}

	nodeSrv, err := node.Server()
	if err != nil {
		t.Fatal(err)
	}
	clientCli, err := client.Client()
	if err != nil {
		t.Fatal(err)
	}
	// The client's certificate authenticates it to a node.
	if serr, cerr := handshake(t, nodeSrv, clientCli, "m1.example"); serr != nil || cerr != nil {
		t.Fatalf("client certificate to a node: server %v, client %v", serr, cerr)
	}
	// Presented by a server, a verifying client refuses it.
	clientSrv, err := ServerConfig(client.Cert, client.Key, "")
	if err != nil {
		t.Fatal(err)
	}
	anon, err := ClientConfig(ca.CertFile, "", "")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"m1.example", "127.0.0.1"} {
		if _, cerr := handshake(t, clientSrv, anon, name); cerr == nil {
			t.Fatalf("a server presenting a client certificate passed a verifying client as %s", name)
		}
	}
	// A node's certificate still serves.
	openSrv, err := ServerConfig(node.Cert, node.Key, "")
	if err != nil {
		t.Fatal(err)
	}
	if serr, cerr := handshake(t, openSrv, anon, "m1.example"); serr != nil || cerr != nil {
		t.Fatalf("a node certificate does not serve: server %v, client %v", serr, cerr)
	}
}
