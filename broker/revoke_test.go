package broker_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/auth"
	tc "github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// rawAuth dials addr, presents token with AUTH and returns the connection
// once the server took it (a broker that does not know the token yet
// fetches its table for it).
func rawAuth(t *testing.T, addr, token string) net.Conn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	if f, err := rawCall(nc, protocol.CodeAuth, []byte(token)); err != nil || f.Status != protocol.StatusOK {
		t.Fatalf("AUTH on %s: %v %q %v", addr, f.Status, f.Body, err)
	}
	return nc
}

// rawCall writes one request on nc and reads its answer, within 10 s.
func rawCall(nc net.Conn, code protocol.Code, body []byte) (protocol.Frame, error) {
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	b, err := protocol.AppendFrame(nil, &protocol.Frame{Code: code, Opaque: 7, Body: body})
	if err != nil {
		return protocol.Frame{}, err
	}
	if _, err := nc.Write(b); err != nil {
		return protocol.Frame{}, err
	}
	return rawRead(nc)
}

func rawRead(nc net.Conn) (protocol.Frame, error) {
	var lenBuf [4]byte
	if _, err := io.ReadFull(nc, lenBuf[:]); err != nil {
		return protocol.Frame{}, err
	}
	n, err := protocol.FrameLength(lenBuf[:])
	if err != nil {
		return protocol.Frame{}, err
	}
	buf := make([]byte, n)
	copy(buf, lenBuf[:])
	if _, err := io.ReadFull(nc, buf[4:]); err != nil {
		return protocol.Frame{}, err
	}
	return protocol.DecodeFrame(buf)
}

// closedByServer waits (up to 20 s: a broker learns of the change within
// about a heartbeat) for the server to close nc.
func closedByServer(t *testing.T, nc net.Conn, what string) {
	t.Helper()
	_ = nc.SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := nc.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("%s: read %v, want the connection closed by the server", what, err)
	}
}

// Revocation reaches the transport: the connections of a principal removed
// (acl rm), or whose token was replaced (acl rotate), are closed by the
// metaserver and by the master's data and HA ports, and another
// principal's are served on.
func TestRevokedPrincipalsConnectionsClosed(t *testing.T) {
	ac := startAuthCluster(t)
	ctx := context.Background()
	gone, rotated, kept := ac.addPrincipal(t, "gone", "describe"), ac.addPrincipal(t, "rotated", "describe"), ac.addPrincipal(t, "kept", "describe")
	m := ac.Master("g1")
	ports := map[string]string{"metaserver": ac.MetaAddr(), "data port": m.Addr(), "HA port": m.HAAddr()}
	conns := map[string]map[string]net.Conn{}
	for who, tok := range map[string]string{"gone": gone, "rotated": rotated, "kept": kept} {
		conns[who] = map[string]net.Conn{}
		for port, addr := range ports {
			conns[who][port] = rawAuth(t, addr, tok)
		}
	}
	if _, err := ac.admin.RemovePrincipal(ctx, api.ACLRemoveRequest{Name: "gone"}); err != nil {
		t.Fatal(err)
	}
	if _, err := ac.admin.SetPrincipal(ctx, api.ACLSetRequest{Name: "rotated", TokenSHA256: auth.HashToken(auth.NewToken()).String(),
		Permissions: []string{"describe"}}); err != nil {
		t.Fatal(err)
	}
	for _, who := range []string{"gone", "rotated"} {
		for port, nc := range conns[who] {
			closedByServer(t, nc, who+"'s connection to the "+port)
		}
	}
	for port, nc := range conns["kept"] {
		if f, err := rawCall(nc, protocol.CodeAuth, []byte(kept)); err != nil || f.Status != protocol.StatusOK {
			t.Fatalf("kept's connection to the %s after the others' revocation: %v %q %v", port, f.Status, f.Body, err)
		}
	}
}

// A cluster token weaker than ValidateToken's rules is refused
// at start, saying why.
func TestWeakClusterTokenRefused(t *testing.T) {
	cfg := tc.BrokerConfig([]string{"127.0.0.1:1"}, "g1", routing.RoleMaster, t.TempDir())
	cfg.ClusterToken = "abcabcabcabcabcabcabcabcabcabcabcabc"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "broker: ClusterToken: a token must hold at least 8 distinct characters; this one has 3") {
		t.Fatalf("a cluster token of abc x 12: %v", err)
	}
}
