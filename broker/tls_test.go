package broker

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/ferrymq/ferrymq/internal/testtls"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/protocol"
)

// A slave reaches a master's HA port over TLS with the broker's TLSClient,
// and a slave without TLS is told the port requires it.
func TestMasterLinkOverTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testtls.CA(t, dir)
	srvTLS := testtls.ServerConfig(t, testtls.Cert(t, ca, "master", dir))
	cliTLS := testtls.ClientConfig(t, testtls.Cert(t, ca, "slave", dir))
	ha := transport.NewServer(transport.ServerConfig{TLS: srvTLS})
	ha.Handle(protocol.CodeHAFetch, func(r *transport.Request) {
		_ = r.Reply(protocol.AppendHAFetchResponseHeader(nil, 0, 7))
	})
	addr, err := ha.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ha.Close()

	link := masterDialer(cliTLS, "")(addr.String())
	defer link.Close()
	resp, _, err := link.Fetch(context.Background(), protocol.HAFetchRequest{BrokerID: "slave", Epoch: 7})
	if err != nil {
		t.Fatalf("fetch over TLS: %v", err)
	}
	if resp.Epoch != 7 {
		t.Fatalf("answer of epoch %d, want 7", resp.Epoch)
	}

	plain := dialMaster(addr.String())
	defer plain.Close()
	_, _, err = plain.Fetch(context.Background(), protocol.HAFetchRequest{BrokerID: "slave", Epoch: 7})
	if !errors.Is(err, protocol.ErrNotAuthorized) || !strings.Contains(err.Error(), "requires TLS") {
		t.Fatalf("a plaintext slave on a TLS HA port: %v, want NOT_AUTHORIZED saying it requires TLS", err)
	}
}

func TestConfigTLSGoTogether(t *testing.T) {
	f := testtls.Cert(t, testtls.CA(t, t.TempDir()), "b", t.TempDir())
	srv, _ := f.Server()
	cfg := Config{ID: "b1", Group: "g", Role: "master", Dir: t.TempDir(), Addr: "127.0.0.1:0", MetaAddrs: []string{"127.0.0.1:1"}, TLSServer: srv}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "TLSServer and TLSClient go together") {
		t.Fatalf("TLSServer alone: %v", err)
	}
	cfg.TLSClient, _ = f.Client()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("both: %v", err)
	}
}
