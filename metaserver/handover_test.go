package metaserver_test

import (
	"context"
	"errors"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/protocol"
)

// member heartbeats as member incarnation inc of group cg on "orders".
func member(t *testing.T, cl *client.Client, id string, inc uint64, released ...api.QueueRef) (api.ConsumerHeartbeatReply, error) {
	t.Helper()
	return cl.ConsumerHeartbeat(context.Background(), api.ConsumerHeartbeat{Group: "cg", Member: id, Topics: []string{"orders"},
		Incarnation: inc, Released: released, SessionMillis: (2 * time.Second).Milliseconds()})
}

func mustMember(t *testing.T, cl *client.Client, id string, inc uint64, released ...api.QueueRef) api.ConsumerHeartbeatReply {
	t.Helper()
	r, err := member(t, cl, id, inc, released...)
	if err != nil {
		t.Fatalf("heartbeat of %s/%d: %v", id, inc, err)
	}
	return r
}

func handoverCount(t *testing.T, h interface{ Write(*dto.Metric) error }) uint64 {
	t.Helper()
	var m dto.Metric
	if err := h.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}

// The leader's side of one owner at a time, on a moved clock: the join
// window, a queue handed over only once released, a restarted instance
// waiting for its older incarnation's session, an expired member's queues
// handed over, and a group deleted only once it has no member.
func TestHandoverOnTheLeader(t *testing.T) {
	m, cl, s, after := consumerMeta(t, 4)
	window := m.Cfgs[0].ConsumerJoinWindow

	// The first member opens the join window: nothing assigned until it
	// closes.
	if r := mustMember(t, cl, "a", 1); len(r.Assignment) != 0 || r.JoinWindowMillis <= 0 {
		t.Fatalf("a's first heartbeat: %+v", r)
	}
	after(window)
	if r := mustMember(t, cl, "a", 1); len(r.Assignment) != 4 || r.JoinWindowMillis != 0 {
		t.Fatalf("after the join window: %+v", r)
	}

	// b joins: two queues move, once a released them.
	if r := mustMember(t, cl, "b", 1); len(r.Assignment) != 0 || r.Waiting != 2 {
		t.Fatalf("b before a released: %+v", r)
	}
	ra := mustMember(t, cl, "a", 1)
	if len(ra.Assignment) != 2 || len(ra.Release) != 2 {
		t.Fatalf("a after b joined: %+v", ra)
	}
	before := handoverCount(t, s.ConsumerHandover())
	mustMember(t, cl, "a", 1, ra.Release...)
	if r := mustMember(t, cl, "b", 1); len(r.Assignment) != 2 || r.Waiting != 0 {
		t.Fatalf("b after a released: %+v", r)
	}
	if n := handoverCount(t, s.ConsumerHandover()) - before; n != 2 {
		t.Fatalf("%d handovers observed, want 2", n)
	}

	// a restarts with the same id: no rebalance; the new instance waits
	// for the old one's session, and the old one is fenced.
	gen := ra.Generation
	if r := mustMember(t, cl, "a", 2); r.Generation != gen || len(r.Assignment) != 0 || r.Waiting != 2 {
		t.Fatalf("a's new instance: %+v", r)
	}
	if _, err := member(t, cl, "a", 1); !errors.Is(err, protocol.ErrMemberFenced) {
		t.Fatalf("the old instance's heartbeat: %v", err)
	}
	q := ra.Assignment[0]
	if _, err := cl.CommitOffsets(context.Background(), api.CommitRequest{Group: "cg", Member: "a", Incarnation: 1,
		Offsets: []api.QueueOffset{{Topic: q.Topic, Queue: q.Queue, Offset: 5}}}); err != nil {
		t.Fatalf("the old instance's commit of a queue it still holds: %v", err)
	}
	for range 5 { // b stays alive meanwhile
		after(time.Second / 2)
		mustMember(t, cl, "b", 1)
		mustMember(t, cl, "a", 2)
	}
	r := mustMember(t, cl, "a", 2)
	if len(r.Assignment) != 2 || r.Waiting != 0 {
		t.Fatalf("a's new instance after the old one's session: %+v", r)
	}
	if _, err := cl.CommitOffsets(context.Background(), api.CommitRequest{Group: "cg", Member: "a", Incarnation: 1,
		Offsets: []api.QueueOffset{{Topic: q.Topic, Queue: q.Queue, Offset: 6}}}); !errors.Is(err, protocol.ErrMemberFenced) {
		t.Fatalf("the old instance's commit after: %v", err)
	}
	for _, a := range r.Assignment {
		if a.Queue == q.Queue && a.Committed != 5 {
			t.Fatalf("the new instance starts queue %d at %d, want the old one's commit 5", q.Queue, a.Committed)
		}
	}

	// b goes silent: after its session its queues are a's.
	for range 5 {
		after(time.Second / 2)
		mustMember(t, cl, "a", 2)
	}
	if r := mustMember(t, cl, "a", 2); len(r.Assignment) != 4 {
		t.Fatalf("after b's session: %+v", r)
	}

	// Delete: refused while a lives, done once it left.
	if err := cl.DeleteConsumerGroup(context.Background(), "cg"); !errors.Is(err, protocol.ErrGroupActive) {
		t.Fatalf("delete with a member: %v", err)
	}
	if _, err := cl.ConsumerHeartbeat(context.Background(), api.ConsumerHeartbeat{Group: "cg", Member: "a", Topics: []string{"orders"},
		Incarnation: 2, Leave: true}); err != nil {
		t.Fatal(err)
	}
	if err := cl.DeleteConsumerGroup(context.Background(), "cg"); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.ConsumerGroups(context.Background(), "cg"); !errors.Is(err, protocol.ErrNotFound) {
		t.Fatalf("the deleted group: %v", err)
	}
}
