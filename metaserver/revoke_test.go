package metaserver_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/metaserver"
	"github.com/ferrymq/ferrymq/protocol"
)

// rawAuth dials addr and presents token with AUTH; the connection is
// returned once taken.
func rawAuth(t *testing.T, addr, token string) net.Conn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	b, _ := protocol.AppendFrame(nil, &protocol.Frame{Code: protocol.CodeAuth, Opaque: 1, Body: []byte(token)})
	if _, err := nc.Write(b); err != nil {
		t.Fatal(err)
	}
	var lenBuf [4]byte
	if _, err := io.ReadFull(nc, lenBuf[:]); err != nil {
		t.Fatal(err)
	}
	n, _ := protocol.FrameLength(lenBuf[:])
	buf := make([]byte, n)
	copy(buf, lenBuf[:])
	if _, err := io.ReadFull(nc, buf[4:]); err != nil {
		t.Fatal(err)
	}
	if f, err := protocol.DecodeFrame(buf); err != nil || f.Status != protocol.StatusOK {
		t.Fatalf("AUTH on %s: %v %q %v", addr, f.Status, f.Body, err)
	}
	return nc
}

// Every node, leader or follower, closes the connections of a principal
// as it applies the principal's removal or the replacement of its token;
// another principal's connections stay open.
func TestRevocationClosesConnectionsOnEveryNode(t *testing.T) {
	clusterTok := auth.NewToken()
	m := testcluster.StartMeta(t, 3, func(c *metaserver.Config) { c.ClusterToken = clusterTok })
	_, leader := m.Leader()
	ctx := context.Background()
	toks := map[string]string{"gone": auth.NewToken(), "rotated": auth.NewToken(), "kept": auth.NewToken()}
	for name, tok := range toks {
		if _, err := leader.SetPrincipal(ctx, name, auth.HashToken(tok), []string{"describe"}, 0); err != nil {
			t.Fatal(err)
		}
	}
	everyNodeSees(t, m, "v3 gone[describe] rotated[describe] kept[describe]", toks["gone"], toks["rotated"], toks["kept"])
	conns := map[string][]net.Conn{}
	for name, tok := range toks {
		for _, s := range m.Nodes {
			conns[name] = append(conns[name], rawAuth(t, s.RPCAddr(), tok))
		}
	}
	if _, err := leader.RemovePrincipal(ctx, "gone", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := leader.SetPrincipal(ctx, "rotated", auth.HashToken(auth.NewToken()), []string{"describe"}, 0); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"gone", "rotated"} {
		for i, nc := range conns[name] {
			_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, err := nc.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
				t.Fatalf("%s's connection to node %d: read %v, want it closed", name, i, err)
			}
		}
	}
	for i, nc := range conns["kept"] {
		_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
		b, _ := protocol.AppendFrame(nil, &protocol.Frame{Code: protocol.CodeAuth, Opaque: 2, Body: []byte(toks["kept"])})
		if _, err := nc.Write(b); err != nil {
			t.Fatalf("kept's connection to node %d: %v", i, err)
		}
		if _, err := io.ReadFull(nc, make([]byte, 4)); err != nil {
			t.Fatalf("kept's connection to node %d after the others were revoked: %v", i, err)
		}
	}
}

// A cluster token an operator chose that is weaker than ValidateToken's
// rules is refused at start, saying why.
func TestWeakClusterTokenRefused(t *testing.T) {
	cfg := testcluster.MetaConfig("m1", t.TempDir())
	cfg.ClusterToken = strings.Repeat("a", 32)
	if _, err := metaserver.New(cfg); err == nil || !strings.Contains(err.Error(), "ClusterToken: a token must hold at least 8 distinct characters; this one has 1") {
		t.Fatalf("a cluster token of 32 x a: %v", err)
	}
}
