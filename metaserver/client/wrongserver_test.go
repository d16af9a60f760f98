package client_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/protocol"
)

// newClient is a metaserver client of addrs, closed by Cleanup.
func newClient(t *testing.T, timeout time.Duration, addrs ...string) *client.Client {
	t.Helper()
	cl, err := client.New(client.Config{Addrs: addrs, CallTimeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	return cl
}

// TestBrokerAddressIsNamed: a client given a broker's address says so,
// naming the broker, at once (not after retrying until its deadline), for
// reads and leader calls alike; the error matches ErrNotMetaserver and not
// ErrNoNode, so ferryctl can say the --meta value is wrong.
func TestBrokerAddressIsNamed(t *testing.T) {
	c := testcluster.Start(t, testcluster.Opts{Groups: []string{"g1"}})
	addr := c.Master("g1").Addr()
	cl := newClient(t, time.Minute, addr)
	ctx := context.Background()
	want := addr + " is a ferrymq broker (group g1, id g1-master), not a metaserver"
	calls := map[string]func() error{
		"topics (any node)": func() error { _, err := cl.Topics(ctx); return err },
		"routes":            func() error { _, err := cl.RouteExisting(ctx, "orders"); return err },
		"groups (leader)":   func() error { _, err := cl.Groups(ctx); return err },
	}
	for name, call := range calls {
		err := call()
		if err == nil || err.Error() != want {
			t.Errorf("%s: %v, want %q", name, err, want)
		}
		if !errors.Is(err, client.ErrNotMetaserver) || errors.Is(err, client.ErrNotFerrymq) || errors.Is(err, client.ErrNoNode) {
			t.Errorf("%s: %v matches the wrong sentinels", name, err)
		}
		var ws *client.WrongServerError
		if !errors.As(err, &ws) || ws.Identity.Kind != protocol.KindBroker || ws.Identity.Group != "g1" {
			t.Errorf("%s: %#v", name, ws)
		}
	}
}

// TestMetaserverFoundPastABroker: with a broker's address among the
// metaservers' (first, even), reads and writes reach the metaserver, every
// time.
func TestMetaserverFoundPastABroker(t *testing.T) {
	c := testcluster.Start(t, testcluster.Opts{Groups: []string{"g1"}})
	cl := newClient(t, 10*time.Second, c.Master("g1").Addr(), c.MetaAddr())
	ctx := context.Background()
	for i := range 3 {
		if _, err := cl.Topics(ctx); err != nil {
			t.Fatalf("read %d: %v", i, err)
		}
		if _, err := cl.CreateTopic(ctx, api.CreateTopicRequest{Name: "t" + string(rune('a'+i)), Queues: 1}); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
		if _, err := cl.RouteExisting(ctx, "ta"); err != nil {
			t.Fatalf("route %d: %v", i, err)
		}
	}
}

// TestWrongServerBesideAnUnreachableOne: a broker's address and one where
// nothing listens: the cluster is unreachable (ErrNoNode, not
// ErrNotMetaserver: the other address may be a metaserver that is down),
// and the error says what the broker is.
func TestWrongServerBesideAnUnreachableOne(t *testing.T) {
	c := testcluster.Start(t, testcluster.Opts{Groups: []string{"g1"}})
	cl := newClient(t, 2*time.Second, c.Master("g1").Addr(), closedAddr(t))
	_, err := cl.Topics(context.Background())
	if !errors.Is(err, client.ErrNoNode) || errors.Is(err, client.ErrNotMetaserver) ||
		!strings.Contains(err.Error(), "is a ferrymq broker (group g1, id g1-master), not a metaserver") {
		t.Fatalf("got %v", err)
	}
}

// TestNotAFerrymqServer: a server that answers with an HTTP error and a
// real HTTP server (a metrics port: it answers once its header timeout
// passes) are each "not a ferrymq server", never a frame error or a retry
// until the deadline.
func TestNotAFerrymqServer(t *testing.T) {
	garbage := fakeServer(t, func(c net.Conn) {
		_, _ = c.Read(make([]byte, 512))
		_, _ = io.WriteString(c, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.NotFoundHandler(), ReadHeaderTimeout: 100 * time.Millisecond}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	const notFrame = "it answered with bytes that are not a ferrymq frame"
	for _, c := range []struct{ name, addr, why string }{
		{"HTTP error", garbage, notFrame},
		{"HTTP server", ln.Addr().String(), notFrame},
	} {
		_, err := newClient(t, time.Minute, c.addr).Topics(context.Background())
		if want := c.addr + " is not a ferrymq server: " + c.why; err == nil || err.Error() != want {
			t.Errorf("%s: %v, want %q", c.name, err, want)
		}
		if !errors.Is(err, client.ErrNotFerrymq) || !errors.Is(err, client.ErrNotMetaserver) || errors.Is(err, client.ErrNoNode) {
			t.Errorf("%s: %v matches the wrong sentinels", c.name, err)
		}
	}
}

// TestEveryAddressWrong: each wrong address is named, in one error.
func TestEveryAddressWrong(t *testing.T) {
	c := testcluster.Start(t, testcluster.Opts{Groups: []string{"g1"}})
	garbage := fakeServer(t, func(c net.Conn) { _, _ = io.WriteString(c, "SSH-2.0-OpenSSH_9.6\r\n") })
	_, err := newClient(t, time.Minute, c.Master("g1").Addr(), garbage).Topics(context.Background())
	want := c.Master("g1").Addr() + " is a ferrymq broker (group g1, id g1-master), not a metaserver; " +
		garbage + " is not a ferrymq server: it answered with bytes that are not a ferrymq frame"
	if err == nil || err.Error() != want || !errors.Is(err, client.ErrNotMetaserver) {
		t.Fatalf("got %v, want %q", err, want)
	}
}

// fakeServer serves every connection with serve, then closes it; it stops
// at Cleanup.
func fakeServer(t *testing.T, serve func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				serve(c)
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		wg.Wait()
	})
	return ln.Addr().String()
}

// closedAddr is an address where nothing listens.
func closedAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}
