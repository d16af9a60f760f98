package producer

import (
	"context"
	"runtime/metrics"
	"testing"

	"github.com/ferrymq/ferrymq/routing"
	"github.com/ferrymq/ferrymq/sdk"
)

// goroutinesCreated is how many goroutines this process has started.
func goroutinesCreated() uint64 {
	s := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// TestSendSendsOnCaller: Send, one message at a time, sends its batch from
// the caller's goroutine (which waits for the answer anyway), not from a
// goroutine started per batch: a lone message's round trip wakes no
// goroutine of the producer's but the connection's reader.
func TestSendSendsOnCaller(t *testing.T) {
	addr := startNullBroker(t)
	rt := newFakeRoutes()
	rt.set("t", routing.QueueRoute{Queue: 0, Group: "g1", Master: addr, Epoch: 1, Writable: true})
	p, err := New(sdk.MetaAddrs("127.0.0.1:1"), withRouteSource(rt), withIdentitySource(&countingIDs{}))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Close() }()
	ctx := context.Background()
	send := func(i int) {
		r, err := p.Send(ctx, &Message{Topic: "t", Body: []byte("x")})
		if err != nil {
			t.Fatal(err)
		}
		if r.Seq != int64(i) || r.QueueOffset != int64(i) {
			t.Fatalf("send %d: seq %d offset %d", i, r.Seq, r.QueueOffset)
		}
	}
	send(0) // connects, takes the identity
	const n = 200
	before := goroutinesCreated()
	for i := 1; i <= n; i++ {
		send(i)
	}
	if made := goroutinesCreated() - before; made > n/10 {
		t.Fatalf("%d goroutines started for %d Sends one at a time, want at most %d", made, n, n/10)
	}
}
