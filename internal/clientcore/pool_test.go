package clientcore

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/protocol"
)

// startEcho is a server that answers SEND with the request's body, once
// hold is closed (nil: at once); with a hold, it says on arrived when a
// request came.
func startEcho(t *testing.T, hold, arrived chan struct{}) *transport.Server {
	t.Helper()
	srv := transport.NewServer(transport.ServerConfig{})
	srv.Handle(protocol.CodeSend, func(r *transport.Request) {
		if hold != nil {
			arrived <- struct{}{}
			<-hold
		}
		_ = r.Reply(r.Body)
	})
	if _, err := srv.Listen("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	return srv
}

// However many goroutines ask for an address at once, the pool makes one
// connection to it, and the same client serves them all.
func TestPoolOneConnectionPerAddress(t *testing.T) {
	a, b := startEcho(t, nil, nil), startEcho(t, nil, nil)
	p := NewPool(PoolConfig{})
	defer p.Close()
	const n = 32
	var wg sync.WaitGroup
	clients := make([]*transport.Client, 2*n)
	errs := make([]error, 2*n)
	for i := range 2 * n {
		srv := a
		if i%2 == 1 {
			srv = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			tc, err := p.Get(srv.Addr().String())
			if err == nil {
				_, err = tc.Call(context.Background(), protocol.CodeSend, []byte("x"))
			}
			clients[i], errs[i] = tc, err
		}()
	}
	wg.Wait()
	for i := range 2 * n {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if clients[i] != clients[i%2] {
			t.Fatalf("call %d used another client of its address", i)
		}
	}
	if clients[0] == clients[1] {
		t.Fatal("two addresses share a client")
	}
	for _, srv := range []*transport.Server{a, b} {
		if st := srv.Stats(); st.PeakConns != 1 {
			t.Fatalf("%s saw %d connections at once, want 1", srv.Addr(), st.PeakConns)
		}
	}
}

// Close closes every connection: a call under way fails with
// transport.ErrClosed, and the pool hands out nothing more (goleak, in
// TestMain, checks that no connection goroutine is left).
func TestPoolClose(t *testing.T) {
	hold, arrived := make(chan struct{}), make(chan struct{}, 1)
	defer close(hold)
	srv := startEcho(t, hold, arrived)
	dialed := ""
	p := NewPool(PoolConfig{Dial: func(addr string) string { dialed = addr; return srv.Addr().String() }})
	tc, err := p.Get("broker-1:7200")
	if err != nil {
		t.Fatal(err)
	}
	if dialed != "broker-1:7200" || tc.Addr() != srv.Addr().String() {
		t.Fatalf("dialed %q for broker-1:7200 (client of %s)", dialed, tc.Addr())
	}
	called := make(chan error, 1)
	go func() {
		_, err := tc.Call(context.Background(), protocol.CodeSend, []byte("x"))
		called <- err
	}()
	select {
	case <-arrived: // the request went: the call waits for its answer
	case <-time.After(5 * time.Second):
		t.Fatal("the request did not arrive")
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-called:
		if !errors.Is(err, transport.ErrClosed) {
			t.Fatalf("a call under way at Close got %v, want transport.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a call under way outlived Close")
	}
	if _, err := p.Get("broker-1:7200"); !errors.Is(err, transport.ErrClosed) {
		t.Fatalf("Get after Close: %v", err)
	}
}
