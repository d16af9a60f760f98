package main

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferrymq/ferrymq/broker"
	"github.com/ferrymq/ferrymq/internal/loadgen"
	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/metaserver"
	"github.com/ferrymq/ferrymq/tlsconf"
)

// startTLSCluster makes certificates with `ferryctl certs` and starts a
// metaserver and two groups that serve TLS and require client
// certificates; it returns --meta and the TLS flags of the client "admin".
func startTLSCluster(t *testing.T) (meta string, tlsFlags []string) {
	t.Helper()
	dir := t.TempDir()
	mustCtl(t, "certs", dir, "--node", "server=127.0.0.1", "--client", "admin")
	files := tlsconf.Files{Cert: filepath.Join(dir, "server.pem"), Key: filepath.Join(dir, "server-key.pem"), CA: filepath.Join(dir, "ca.pem")}
	srv, err := files.Server()
	if err != nil {
		t.Fatal(err)
	}
	cli, err := files.Client()
	if err != nil {
		t.Fatal(err)
	}
	set := func(s, c **tls.Config) { *s, *c = srv, cli }
	c := testcluster.Start(t, testcluster.Opts{Groups: []string{"g1", "g2"},
		MetaEdit:   func(cfg *metaserver.Config) { set(&cfg.TLSServer, &cfg.TLSClient) },
		BrokerEdit: func(cfg *broker.Config) { set(&cfg.TLSServer, &cfg.TLSClient) },
	})
	return "--meta=" + c.MetaAddr(), []string{"--tls-ca", files.CA, "--tls-cert", filepath.Join(dir, "admin.pem"), "--tls-key", filepath.Join(dir, "admin-key.pem")}
}

// Against a cluster that serves only TLS, every kind of command works with
// the TLS flags (metaserver calls, the producer, direct broker reads, the
// consumer, bench with consumers) and with the same from FERRY_TLS_*;
// without them ferryctl says the cluster requires TLS.
func TestTLS(t *testing.T) {
	meta, flags := startTLSCluster(t)
	with := func(args ...string) []string { return append(append([]string{meta}, flags...), args...) }

	mustCtl(t, with("topic", "create", "orders", "--queues", "2")...)
	var sent map[string]any
	if err := json.Unmarshal([]byte(mustCtl(t, with("send", "orders", "--body", "over tls", "--key", "k", "--json")...)), &sent); err != nil {
		t.Fatal(err)
	}
	queue := sent["queue"].(float64)
	if out := mustCtl(t, with("read", "orders", "--queue", fmt.Sprint(int(queue)))...); !strings.Contains(out, `"over tls"`) {
		t.Fatalf("read over TLS:\n%s", out)
	}
	if out := mustCtl(t, with("consume", "orders", "--group", "readers", "--count", "1", "--timeout", "10s")...); !strings.Contains(out, "over tls") {
		t.Fatalf("consume over TLS:\n%s", out)
	}
	if out := mustCtl(t, with("group", "describe", "readers")...); !strings.Contains(out, "orders") {
		t.Fatalf("group describe over TLS:\n%s", out)
	}
	var res loadgen.Result
	if err := json.Unmarshal([]byte(mustCtl(t, with("bench", "--topic", "orders", "--count", "300", "--producers", "1", "--consumers", "1", "--json")...)), &res); err != nil ||
		res.Sent != 300 || res.Errors != 0 {
		t.Fatalf("bench --consumers over TLS: %+v, %v", res, err)
	}

	// The same from the environment.
	t.Setenv("FERRY_TLS_CA", flags[1])
	t.Setenv("FERRY_TLS_CERT", flags[3])
	t.Setenv("FERRY_TLS_KEY", flags[5])
	if out := mustCtl(t, meta, "topics"); !strings.Contains(out, "orders") {
		t.Fatalf("topics with FERRY_TLS_*:\n%s", out)
	}
	// A file the environment names that is not there: refused before any
	// network call, naming the variable.
	t.Setenv("FERRY_TLS_KEY", filepath.Join(t.TempDir(), "absent.pem"))
	if code, _, errOut := ctl(meta, "topics"); code != exitUsage || !strings.Contains(errOut, "FERRY_TLS_KEY=") {
		t.Fatalf("FERRY_TLS_KEY of a missing file: exit %d, %q; want 2 naming FERRY_TLS_KEY", code, errOut)
	}
}

// A client without TLS against it is told which flags it needs (exit 2),
// at once rather than at its timeout, for a metaserver call and for the
// producer.
func TestTLSRequired(t *testing.T) {
	meta, _ := startTLSCluster(t)
	for _, args := range [][]string{{"topics"}, {"send", "orders", "--body", "b"}} {
		code, _, errOut := ctl(append([]string{meta, "--timeout", "1m"}, args...)...)
		if code != exitUsage || !strings.Contains(errOut, "requires TLS") || !strings.Contains(errOut, "--tls-ca") {
			t.Errorf("ferryctl %v without TLS against a TLS cluster: exit %d, %q; want 2 saying it requires TLS and naming --tls-ca", args, code, errOut)
		}
	}
}
