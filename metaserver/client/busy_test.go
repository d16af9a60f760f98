package client_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/protocol"
)

// TestCloserIsUnreachable: a server that takes every connection and closes
// it without answering has proved nothing (a metaserver shutting down does
// that): it is unreachable (ErrNoNode: ferryctl exits 3, a producer
// retries), never "not a metaserver".
func TestCloserIsUnreachable(t *testing.T) {
	closer := fakeServer(t, func(c net.Conn) { _, _ = c.Read(make([]byte, 512)) })
	_, err := newClient(t, 300*time.Millisecond, closer).Topics(context.Background())
	if !errors.Is(err, client.ErrNoNode) || errors.Is(err, client.ErrNotMetaserver) {
		t.Fatalf("a server that closes unanswered: %v; want ErrNoNode, not ErrNotMetaserver", err)
	}
}

// TestMetaserverAtItsCap: a server at its connection cap answers a new
// connection's request BUSY, saying why, and closes it: the client retries
// (the error says the server is over its cap, and is ErrNoNode, not "not a
// metaserver"), and gets its answer once a connection is free.
func TestMetaserverAtItsCap(t *testing.T) {
	srv := transport.NewServer(transport.ServerConfig{MaxConns: 1})
	srv.Handle(protocol.CodeAdminTopics, func(r *transport.Request) { _ = r.Reply([]byte("[]")) })
	bound, err := srv.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	addr := bound.String()
	hog, err := net.Dial("tcp", addr) // the one connection the server takes
	if err != nil {
		t.Fatal(err)
	}
	defer hog.Close()
	// The hog is counted once the server accepted it; a connection dialled
	// before that could take the slot instead.
	testwait.For(t, 10*time.Second, "the server to take the first connection", func() bool { return srv.Stats().Conns == 1 })

	_, err = newClient(t, 300*time.Millisecond, addr).Topics(context.Background())
	if err == nil || !errors.Is(err, client.ErrNoNode) || errors.Is(err, client.ErrNotMetaserver) ||
		!errors.Is(err, protocol.ErrBusy) || !strings.Contains(err.Error(), "over its connection cap") {
		t.Fatalf("a metaserver at its cap: %v; want ErrNoNode with BUSY: over its connection cap", err)
	}

	cl := newClient(t, 10*time.Second, addr)
	_ = hog.Close()
	if _, err := cl.Topics(context.Background()); err != nil {
		t.Fatalf("once a connection is free: %v", err)
	}
}
