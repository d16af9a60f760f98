package metaserver_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/internal/testlog"
	"github.com/ferrymq/ferrymq/metaserver"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/routing"
)

// result is what an RPC run in the background returned.
type result[T any] struct {
	v   T
	err error
}

func async[T any](f func() (T, error)) <-chan result[T] {
	ch := make(chan result[T], 1)
	go func() {
		v, err := f()
		ch <- result[T]{v, err}
	}()
	return ch
}

func await[T any](t *testing.T, ch <-chan result[T], what string) T {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("%s: %v", what, r.err)
		}
		return r.v
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no answer in 10 s", what)
	}
	panic("unreachable")
}

// watcher is g1's master watching routes through cl.
func watcher(cl *client.Client) func(version uint64, wait time.Duration) (api.RouteWatchReply, error) {
	return func(version uint64, wait time.Duration) (api.RouteWatchReply, error) {
		return cl.WatchRoutes(context.Background(), api.RouteWatch{Group: "g1", BrokerID: "g1-master", Version: version,
			WaitMillis: wait.Milliseconds()})
	}
}

// mineOf returns the queues of route on group.
func mineOf(r routing.Route, group string) []uint32 {
	var out []uint32
	for _, q := range r.Queues {
		if q.Group == group {
			out = append(out, q.Queue)
		}
	}
	return out
}

// The leader pushes a topic's creation and its queue additions to the
// watching master of every group holding its queues, answering its parked
// ROUTE_WATCH, and answers the creation only once that master asked again
// after taking it in. g2's master heartbeats but does not watch (a broker
// from before route pushes): nobody waits for it.
func TestRouteWatchPushesTopicChanges(t *testing.T) {
	m := startMeta(t, 1, fakeClock()) // the push's wait never runs out: only the acknowledgement ends it
	cl := m.Client(t)
	heartbeat(t, cl, "g1", routing.RoleMaster, nil)
	heartbeat(t, cl, "g2", routing.RoleMaster, nil)
	watch := watcher(cl)
	ctx := context.Background()

	first, err := watch(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Topics) != 0 || first.Partial {
		t.Fatalf("first watch, with no topics: %+v", first)
	}
	parked := async(func() (api.RouteWatchReply, error) { return watch(first.Version, time.Minute) })
	created := async(func() (routing.Route, error) {
		return cl.CreateTopic(ctx, api.CreateTopicRequest{Name: "orders", Queues: 3, Groups: []string{"g1", "g2"}})
	})
	got := await(t, parked, "the parked watch")
	if len(got.Topics) != 1 || got.Partial || got.Version <= first.Version {
		t.Fatalf("watch answer: %+v", got)
	}
	if pt := got.Topics[0]; pt.Name != "orders" || pt.Queues != 3 {
		t.Fatalf("pushed %+v, want orders with 3 queues", pt)
	}
	select {
	case r := <-created:
		t.Fatalf("the creation was answered (%+v, %v) before g1's master acknowledged the push", r.v, r.err)
	default:
	}
	ack, err := watch(got.Version, 0)
	if err != nil || len(ack.Topics) != 0 {
		t.Fatalf("acknowledging watch: %+v, %v", ack, err)
	}
	route := await(t, created, "the creation")
	if mine := mineOf(route, "g1"); len(mine) == 0 || !slices.Equal(got.Topics[0].Mine, mine) {
		t.Fatalf("pushed queues %v on g1, the route has %v", got.Topics[0].Mine, mine)
	}

	// Queues added: the topic again, with its new queue count.
	parked = async(func() (api.RouteWatchReply, error) { return watch(ack.Version, time.Minute) })
	grown := async(func() (routing.Route, error) { return cl.AddQueues(ctx, "orders", 4) })
	got = await(t, parked, "the parked watch after adding queues")
	if len(got.Topics) != 1 || got.Topics[0].Name != "orders" || got.Topics[0].Queues != 7 {
		t.Fatalf("watch answer after adding queues: %+v", got)
	}
	select {
	case r := <-grown:
		t.Fatalf("the queue addition was answered (%+v, %v) before g1's master acknowledged the push", r.v, r.err)
	default:
	}
	if _, err := watch(got.Version, 0); err != nil {
		t.Fatal(err)
	}
	route = await(t, grown, "the queue addition")
	if mine := mineOf(route, "g1"); !slices.Equal(got.Topics[0].Mine, mine) {
		t.Fatalf("pushed queues %v on g1, the route has %v", got.Topics[0].Mine, mine)
	}

	// A broker that starts (version 0) is given its group's topics.
	fresh, err := watch(0, 0)
	if err != nil || len(fresh.Topics) != 1 || fresh.Topics[0].Queues != 7 || fresh.Partial {
		t.Fatalf("a starting broker's first watch: %+v, %v", fresh, err)
	}
}

// A master that took a push and never came back (gone with its watch
// parked) holds a creation up only RoutePushWait: it is answered then,
// with a log line naming the master. Later creations do not wait for it
// until it watches again.
func TestRoutePushWaitIsBounded(t *testing.T) {
	logs := testlog.NewCapture("m1", hclog.Info)
	const wait = 1500 * time.Millisecond
	m := testcluster.StartMeta(t, 1, func(c *metaserver.Config) {
		testcluster.SteadyMeta(c)
		c.Logger, c.RoutePushWait = logs, wait
	})
	cl := m.Client(t)
	heartbeat(t, cl, "g1", routing.RoleMaster, nil) // registers the group
	startBroker(t, cl, "g1", routing.RoleMaster)    // keeps it writable
	watch := watcher(cl)
	first, err := watch(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	parked := async(func() (api.RouteWatchReply, error) { return watch(first.Version, time.Minute) })
	start := time.Now()
	if _, err := cl.CreateTopic(context.Background(), api.CreateTopicRequest{Name: "orders", Queues: 2, Groups: []string{"g1"}}); err != nil {
		t.Fatal(err)
	}
	// The handler's own deadline is 5 s: well before it, the wait ran out.
	if took := time.Since(start); took < wait || took > 4*time.Second {
		t.Fatalf("the creation was answered after %v, want RoutePushWait (%v)", took, wait)
	}
	lines := logs.Lines("some brokers have not learned")
	if len(lines) != 1 || !strings.Contains(lines[0], "g1-master") || !strings.Contains(lines[0], "topic=orders") {
		t.Fatalf("log lines: %q", lines)
	}
	if got := await(t, parked, "the parked watch"); len(got.Topics) != 1 || got.Topics[0].Name != "orders" {
		t.Fatalf("the parked watch got %+v", got)
	}
	start = time.Now()
	if _, err := cl.CreateTopic(context.Background(), api.CreateTopicRequest{Name: "payments", Queues: 2, Groups: []string{"g1"}}); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took >= wait {
		t.Fatalf("a second creation waited %v for the master that did not come back", took)
	}
	if lines := logs.Lines("some brokers have not learned"); len(lines) != 1 {
		t.Fatalf("log lines: %q", lines)
	}
}
