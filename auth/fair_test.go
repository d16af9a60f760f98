package auth

import (
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/protocol"
)

// dialFrom dials addr from the loopback address local (127.0.0.2, ...:
// distinct sources on Linux's loopback), or skips the test where that
// address cannot be bound.
func dialFrom(t *testing.T, local, addr string) (net.Conn, error) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}, Timeout: 5 * time.Second}
	nc, err := d.Dial("tcp", addr)
	if err != nil && strings.Contains(err.Error(), "assign requested address") {
		t.Skipf("cannot dial from %s here: %v", local, err)
	}
	return nc, err
}

// servedFrom dials gs from local, authenticates with appToken and asks
// who it is; it reports whether it was answered "app1".
func servedFrom(t *testing.T, gs *gateServer, local string) error {
	t.Helper()
	nc, err := dialFrom(t, local, gs.addr)
	if err != nil {
		return err
	}
	defer func() { _ = nc.Close() }()
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	if f, err := request(t, nc, protocol.CodeAuth, appToken); err != nil || f.Status != protocol.StatusOK {
		return errors.Join(err, errors.New("AUTH: "+f.Status.String()+" "+string(f.Body)))
	}
	if f, err := request(t, nc, codeWhoIs, ""); err != nil || string(f.Body) != "app1" {
		return errors.Join(err, errors.New("who-is: "+f.Status.String()+" "+string(f.Body)))
	}
	return nil
}

// One host that floods a port with silent connections, and dials again
// each one refused, holds only its share of the connections that have not
// authenticated: 12 new clients from another host all authenticate and
// are served meanwhile.
func TestOneHostCannotCrowdOutNewClients(t *testing.T) {
	gs := startGateServer(t, GateConfig{MaxUnauthConns: 32}, transport.ServerConfig{HandshakeTimeout: time.Minute})
	if _, err := dialFrom(t, "127.0.0.2", gs.addr); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var held []net.Conn
	defer func() {
		close(stop)
		wg.Wait()
		for _, nc := range held {
			_ = nc.Close()
		}
	}()
	wg.Add(1)
	go func() { // the flood: at most 2,000 dials, each held open and silent
		defer wg.Done()
		for range 2000 {
			select {
			case <-stop:
				return
			default:
			}
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}, Timeout: 5 * time.Second}
			nc, err := d.Dial("tcp", gs.addr)
			if err != nil {
				continue
			}
			mu.Lock()
			held = append(held, nc)
			mu.Unlock()
		}
	}()
	testwait.For(t, 20*time.Second, "the flood to fill its share and be refused", func() bool {
		return gs.Stats().Refused >= 20
	})
	for i := range 12 {
		if err := servedFrom(t, gs, "127.0.0.3"); err != nil {
			t.Fatalf("new client %d of 12 during the flood: %v", i+1, err)
		}
	}
	if n := gs.gate.Unauthenticated(); n > 4 {
		t.Fatalf("%d connections that have not authenticated open, want at most the flooder's share of 4", n)
	}
}

// At the cap, a new connection evicts the oldest that has not
// authenticated: four hosts each holding their share cannot keep a fifth
// out.
func TestOldestStrangerEvictedAtTheCap(t *testing.T) {
	gs := startGateServer(t, GateConfig{MaxUnauthConns: 8, MaxUnauthPerSource: 2}, transport.ServerConfig{HandshakeTimeout: time.Minute})
	var silent []net.Conn
	for _, src := range []string{"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"} {
		for range 2 {
			nc, err := dialFrom(t, src, gs.addr)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = nc.Close() })
			silent = append(silent, nc)
			testwait.For(t, 5*time.Second, "the connection from "+src+" counted", func() bool {
				return gs.gate.Unauthenticated() == int64(len(silent))
			})
		}
	}
	if err := servedFrom(t, gs, "127.0.0.6"); err != nil {
		t.Fatalf("a new client with the cap full: %v", err)
	}
	if n := gs.gate.Evicted(); n != 1 {
		t.Fatalf("%d connections evicted, want 1", n)
	}
	_ = silent[0].SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := silent[0].Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("the oldest silent connection: read %v, want EOF (evicted)", err)
	}
	if n := gs.gate.Unauthenticated(); n != 7 {
		t.Fatalf("%d connections that have not authenticated, want the 7 not evicted", n)
	}
	if st := gs.Stats(); st.Dropped != 1 {
		t.Fatalf("%d connections dropped, want the one evicted", st.Dropped)
	}
}
