package metaserverd

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/cmd/internal/brokerd"
	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/internal/testtls"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
)

// TestMetricsPortTLSAndDescribe: with TLS and authorization on, the
// metrics port of a metaserver and of a broker serves HTTPS with the
// server's certificate; /healthz and /readyz answer anyone (probes);
// /metrics, and any other path, needs a principal holding describe: 401
// without credentials or with a token nobody has, 403 for a principal
// without describe, 200 for describe (a bearer token, or a client
// certificate naming the principal) and for the admin. Plain HTTP gets
// nothing of it.
func TestMetricsPortTLSAndDescribe(t *testing.T) {
	dir := t.TempDir()
	ca := testtls.CA(t, dir)
	node := testtls.Cert(t, ca, "node", dir)
	tokenFile := func(name, tok string) string {
		path := filepath.Join(dir, name+".token")
		if err := os.WriteFile(path, []byte(tok+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	adminTok, clusterTok := auth.NewToken(), auth.NewToken()
	tlsArgs := []string{"-tls-cert", node.Cert, "-tls-key", node.Key, "-tls-ca", node.CA,
		"-auth-cluster-token-file", tokenFile("cluster", clusterTok)}

	rpc, raft := testcluster.FreeAddr(t), testcluster.FreeAddr(t)
	ms := run(t, "metaserver", Run, append([]string{"-id", "m1", "-dir", t.TempDir(), "-rpc-addr", rpc, "-raft-addr", raft,
		"-peers", fmt.Sprintf("m1=%s/%s", raft, rpc), "-metrics-addr", "127.0.0.1:0",
		"-auth-admin-token-file", tokenFile("admin", adminTok), "-raft-secret-file", tokenFile("raft", auth.NewToken())}, tlsArgs...)...)
	metaHTTP := ms.logged(t, `serving metrics: addr=(\S+)`)
	ms.logged(t, `(metaserver running)`)
	br := run(t, "broker", brokerd.Run, append([]string{"-id", "b1", "-group", "g1", "-dir", t.TempDir(),
		"-addr", "127.0.0.1:0", "-ha-addr", "127.0.0.1:0", "-meta", rpc, "-heartbeat", "200ms", "-metrics-addr", "127.0.0.1:0"}, tlsArgs...)...)
	brokerHTTP := br.logged(t, `serving metrics: addr=(\S+)`)

	admin, err := client.New(client.Config{Addrs: []string{rpc}, Token: adminTok,
		Transport: transport.ClientConfig{TLS: testtls.ClientConfig(t, node)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close() })
	principal := func(name, tok string, perms ...string) {
		t.Helper()
		h := ""
		if tok != "" {
			h = auth.HashToken(tok).String()
		}
		if _, err := admin.SetPrincipal(context.Background(), api.ACLSetRequest{Name: name, TokenSHA256: h, Permissions: perms}); err != nil {
			t.Fatal(err)
		}
	}
	describeTok, produceTok := auth.NewToken(), auth.NewToken()
	principal("ops", describeTok, "describe")
	principal("app", produceTok, "produce:orders")
	principal("scraper", "", "describe") // known by its client certificate
	scraperCert := testtls.Cert(t, ca, "scraper", dir)
	strangerCert := testtls.Cert(t, ca, "stranger", dir)

	// get fetches https://addr+path with a bearer token (if any) and a
	// client certificate (if any).
	get := func(addr, path, token string, cert *tls.Config) (int, string) {
		t.Helper()
		cfg := testtls.ClientConfig(t, node)
		cfg.Certificates = nil
		if cert != nil {
			cfg = cert
		}
		hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
		defer hc.CloseIdleConnections()
		req, _ := http.NewRequest(http.MethodGet, "https://"+addr+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("GET %s%s: %v", addr, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	for _, srv := range []struct{ name, addr string }{{"metaserver", metaHTTP}, {"broker", brokerHTTP}} {
		// The broker answers once it loaded its first table and is named.
		testwait.For(t, 20*time.Second, srv.name+"'s /readyz to answer 200 over HTTPS without credentials", func() bool {
			code, _ := get(srv.addr, "/readyz", "", nil)
			return code == http.StatusOK
		})
		if code, body := get(srv.addr, "/healthz", "", nil); code != http.StatusOK || body != "ok\n" {
			t.Fatalf("%s /healthz without credentials: %d %q, want 200 ok", srv.name, code, body)
		}
		for _, c := range []struct {
			what, path, token string
			cert              *tls.Config
			want              int
		}{
			{"no credentials", "/metrics", "", nil, http.StatusUnauthorized},
			{"no credentials, another path", "/other", "", nil, http.StatusUnauthorized},
			{"a token nobody has", "/metrics", auth.NewToken(), nil, http.StatusUnauthorized},
			{"a client certificate naming no principal", "/metrics", "", testtls.ClientConfig(t, strangerCert), http.StatusUnauthorized},
			{"produce:orders", "/metrics", produceTok, nil, http.StatusForbidden},
			{"describe", "/metrics", describeTok, nil, http.StatusOK},
			{"describe by client certificate", "/metrics", "", testtls.ClientConfig(t, scraperCert), http.StatusOK},
			{"the bootstrap admin", "/metrics", adminTok, nil, http.StatusOK},
		} {
			code, body := get(srv.addr, c.path, c.token, c.cert)
			if code != c.want {
				t.Fatalf("%s %s with %s: %d %q, want %d", srv.name, c.path, c.what, code, body, c.want)
			}
			if code == http.StatusOK && !strings.Contains(body, "go_goroutines") {
				t.Fatalf("%s %s with %s: 200 without the metrics: %q", srv.name, c.path, c.what, body)
			}
			if code == http.StatusForbidden && !strings.Contains(body, `principal "app" lacks describe`) {
				t.Fatalf("%s's 403 does not say what is missing: %q", srv.name, body)
			}
		}
		// Plain HTTP on the HTTPS port shows nothing.
		resp, err := http.Get("http://" + srv.addr + "/metrics")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if strings.Contains(string(b), "go_goroutines") {
				t.Fatalf("%s served its metrics over plain HTTP", srv.name)
			}
		}
	}
	// The metaserver's web console is on the same HTTPS port, outside the
	// describe guard: its own login page, whatever the credentials.
	if code, body := get(metaHTTP, "/console/login", "", nil); code != http.StatusOK || !strings.Contains(body, `id="token-login"`) {
		t.Fatalf("metaserver /console/login without credentials: %d %q, want 200 and the login form", code, body)
	}
	if code, _ := get(brokerHTTP, "/console/login", "", nil); code != http.StatusUnauthorized {
		t.Fatalf("broker /console/login: %d, want 401 (a broker serves no console)", code)
	}
}
