package client_test

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
)

// TestPausedFirstAddress: a paused node listed first does not take the
// whole call: reads, leader calls and meta status reach the live nodes
// after it within the call's timeout (ferryctl's default, 5 s), again and
// again.
func TestPausedFirstAddress(t *testing.T) {
	m := testcluster.StartMeta(t, 3, nil)
	testcluster.StartGroup(t, m.Addrs(), "g1", testcluster.GroupOpts{Edit: testcluster.SteadyBroker})
	cl := newClient(t, 5*time.Second, append([]string{testcluster.SilentAddr(t)}, m.Addrs()...)...)
	ctx := context.Background()
	for i := range 2 {
		if _, err := cl.Topics(ctx); err != nil {
			t.Fatalf("topics %d: %v", i, err)
		}
		if _, err := cl.CreateTopic(ctx, api.CreateTopicRequest{Name: "t" + string(rune('a'+i)), Queues: 1}); err != nil {
			t.Fatalf("topic create %d: %v", i, err)
		}
		if _, err := cl.RouteExisting(ctx, "ta"); err != nil {
			t.Fatalf("routes %d: %v", i, err)
		}
		if _, err := cl.Groups(ctx); err != nil {
			t.Fatalf("groups %d: %v", i, err)
		}
	}
	// Each call a fresh client, with the paused node first every time.
	for name, call := range map[string]func(*client.Client) error{
		"topics": func(c *client.Client) error { _, err := c.Topics(ctx); return err },
		"routes": func(c *client.Client) error { _, err := c.Route(ctx, "ta"); return err },
		"groups": func(c *client.Client) error { _, err := c.Groups(ctx); return err },
	} {
		if err := call(newClient(t, 5*time.Second, append([]string{testcluster.SilentAddr(t)}, m.Addrs()...)...)); err != nil {
			t.Errorf("%s with a paused node first: %v", name, err)
		}
	}
	st, err := newClient(t, 5*time.Second, append([]string{testcluster.SilentAddr(t)}, m.Addrs()...)...).MetaStatus(ctx, time.Second)
	if err != nil {
		t.Fatalf("meta status with a paused node first: %v", err)
	}
	reachable := 0
	for _, ms := range st.Members {
		if ms.Reachable {
			reachable++
		}
	}
	if len(st.Members) != 3 || reachable != 3 || st.LeaderID == "" {
		t.Fatalf("meta status with a paused node first: %+v; want 3 members, all reachable, and the leader", st)
	}
}

// TestEveryNodeSlow: nodes that answer, but each slower than a first
// pass gives it (loaded, not paused), are still answered within the call:
// later passes give each address longer.
func TestEveryNodeSlow(t *testing.T) {
	m := testcluster.StartMeta(t, 1, nil)
	// Two addresses and a 5 s call: the first pass gives each 1 s.
	const delay = 1200 * time.Millisecond
	cl := newClient(t, 5*time.Second, delayProxy(t, m.Addr(), delay), delayProxy(t, m.Addr(), delay))
	if _, err := cl.Topics(context.Background()); err != nil {
		t.Fatalf("topics from nodes that answer after %v: %v", delay, err)
	}
}

// delayProxy forwards connections to target, holding each answer back by
// delay (a node that answers, slowly).
func delayProxy(t *testing.T, target string, delay time.Duration) string {
	t.Helper()
	return fakeServer(t, func(c net.Conn) {
		up, err := net.Dial("tcp", target)
		if err != nil {
			return
		}
		defer up.Close()
		go func() {
			_, _ = io.Copy(up, c)
			_ = up.Close() // the client hung up: so does the proxy
		}()
		buf := make([]byte, 64<<10)
		for {
			n, err := up.Read(buf)
			if err != nil {
				return
			}
			time.Sleep(delay)
			if _, err := c.Write(buf[:n]); err != nil {
				return
			}
		}
	})
}
