package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/producer"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/sdk"
)

// TestLocalClusterOverTLS starts the local cluster with FERRY_TLS=1 (every
// server on TLS, client certificates required, certificates made by
// ferryctl certs): messages sent with the producer SDK over TLS are read
// back with ferryctl (which dials the brokers over TLS); a producer, a
// metaserver client and a broker connection without TLS are refused,
// saying the port requires TLS, before their timeouts; and ferryctl
// without --tls-ca exits 2 naming it.
func TestLocalClusterOverTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	c := startLocalCluster(t, "FERRY_TLS=1")
	c.ctl("topic", "create", "secure", "--queues", "4")
	metas := strings.Split(c.meta, ",")

	p, err := producer.New(sdk.MetaAddrs(metas...), sdk.TLS(c.tls))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sent := map[uint32]map[string]bool{} // queue: bodies
	for i := range 20 {
		body := fmt.Sprintf("tls message %d", i)
		r, err := p.Send(ctx, &producer.Message{Topic: "secure", Body: []byte(body), Key: fmt.Sprint(i)})
		if err != nil {
			t.Fatalf("send %d over TLS: %v", i, err)
		}
		if sent[r.Queue] == nil {
			sent[r.Queue] = map[string]bool{}
		}
		sent[r.Queue][body] = true
	}
	for q, bodies := range sent {
		var msgs []struct {
			Body string `json:"body"`
		}
		out := c.ctl("read", "secure", "--queue", fmt.Sprint(q), "--from", "0", "--json")
		if err := json.Unmarshal([]byte(out), &msgs); err != nil {
			t.Fatalf("read queue %d: %v\n%s", q, err, out)
		}
		for _, m := range msgs {
			delete(bodies, m.Body)
		}
		if len(bodies) > 0 {
			t.Errorf("queue %d: sent over TLS but not read back: %v", q, bodies)
		}
	}

	// Without TLS: refused in words, well before the timeouts.
	requiresTLS := func(what string, err error) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), "requires TLS") {
			t.Errorf("%s without TLS: got %v, want a refusal saying the port requires TLS", what, err)
		}
	}
	pctx, pcancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer pcancel()
	plain, err := producer.New(sdk.MetaAddrs(metas...), producer.DeliveryTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	_, err = plain.Send(pctx, &producer.Message{Topic: "secure", Body: []byte("x")})
	plain.Close()
	requiresTLS("a producer", err)

	mc, err := client.New(client.Config{Addrs: metas, CallTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer mc.Close()
	_, err = mc.Topics(pctx)
	requiresTLS("a metaserver client", err)

	for _, addr := range []string{c.addr("g1-master"), c.haAddr("g1-master")} {
		tc := transport.NewClient(addr, transport.ClientConfig{CallTimeout: 10 * time.Second})
		_, err := tc.Call(pctx, protocol.CodePull, nil)
		tc.Close()
		requiresTLS("a connection to the broker's port "+addr, err)
	}

	cmd := exec.Command(filepath.Join(c.home, "bin", "ferryctl"), "--meta", c.meta, "--timeout", "20s", "topics")
	out, err := cmd.CombinedOutput()
	if code := cmd.ProcessState.ExitCode(); code != 2 || !strings.Contains(string(out), "requires TLS") || !strings.Contains(string(out), "--tls-ca") {
		t.Errorf("ferryctl without --tls-ca: exit %d (%v): %s; want 2 saying the cluster requires TLS and naming --tls-ca", code, err, out)
	}
}
