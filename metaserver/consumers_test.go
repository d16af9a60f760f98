package metaserver_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/metaserver"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// consumerMeta is a one-node cluster on a fake clock with a broker group
// and a topic "orders" of queues queues.
func consumerMeta(t *testing.T, queues int) (*testcluster.Meta, *client.Client, *metaserver.Server, func(time.Duration)) {
	t.Helper()
	clk := fakeClock()
	m := startMeta(t, 1, clk)
	cl := m.Client(t)
	heartbeat(t, cl, "g1", routing.RoleMaster, nil)
	if _, err := cl.CreateTopic(context.Background(), api.CreateTopicRequest{Name: "orders", Queues: queues}); err != nil {
		t.Fatal(err)
	}
	_, s := m.Leader()
	return m, cl, s, func(d time.Duration) { judged(t, m, clk, s, d) }
}

// joinAndLeave makes group exist with no member: member joins and leaves.
func joinAndLeave(t *testing.T, cl *client.Client, group, member string) {
	t.Helper()
	join(t, cl, group, member, nil)
	join(t, cl, group, member, func(hb *api.ConsumerHeartbeat) { hb.Leave = true })
}

func join(t *testing.T, cl *client.Client, group, member string, edit func(*api.ConsumerHeartbeat)) api.ConsumerHeartbeatReply {
	t.Helper()
	hb := api.ConsumerHeartbeat{Group: group, Member: member, Topics: []string{"orders"}}
	if edit != nil {
		edit(&hb)
	}
	r, err := cl.ConsumerHeartbeat(context.Background(), hb)
	if err != nil {
		t.Fatalf("heartbeat of %s/%s: %v", group, member, err)
	}
	return r
}

func queuesOf(r api.ConsumerHeartbeatReply) []uint32 {
	var out []uint32
	for _, a := range r.Assignment {
		out = append(out, a.Queue)
	}
	return out
}

func describe(t *testing.T, cl *client.Client, group string) api.ConsumerGroupInfo {
	t.Helper()
	gs, err := cl.ConsumerGroups(context.Background(), group)
	if err != nil || len(gs) != 1 {
		t.Fatalf("consumer group %s: %+v, %v", group, gs, err)
	}
	return gs[0]
}

func offsetsOf(r api.ConsumerHeartbeatReply, off int64) []api.QueueOffset {
	var out []api.QueueOffset
	for _, a := range r.Assignment {
		out = append(out, api.QueueOffset{Topic: a.Topic, Queue: a.Queue, Offset: off})
	}
	return out
}

func TestConsumerJoinLeaveExpire(t *testing.T) {
	_, cl, s, advance := consumerMeta(t, 4)
	a := join(t, cl, "cg", "a", nil)
	if a.Generation != 1 || len(a.Assignment) != 4 || a.Assignment[0].Committed != -1 || a.SessionMillis != 10_000 {
		t.Fatalf("first member: %+v", a)
	}
	b := join(t, cl, "cg", "b", nil)
	a2 := join(t, cl, "cg", "a", func(hb *api.ConsumerHeartbeat) { hb.Generation = 1 })
	if b.Generation != 2 || a2.Generation != 2 || len(b.Assignment) != 2 || len(a2.Assignment) != 2 {
		t.Fatalf("after b joined: a %+v, b %+v", a2, b)
	}
	for _, q := range queuesOf(a2) {
		if !slices.Contains(queuesOf(a), q) {
			t.Fatalf("a got queue %d it did not have when b joined (sticky: it only gives up queues)", q)
		}
	}
	// A repeated heartbeat is no new generation.
	if again := join(t, cl, "cg", "b", nil); again.Generation != 2 || !reflect.DeepEqual(queuesOf(again), queuesOf(b)) {
		t.Fatalf("b's second heartbeat: %+v", again)
	}
	info := describe(t, cl, "cg")
	if info.Generation != 2 || len(info.Members) != 2 || info.Members[0].ID != "a" || len(info.Members[0].Queues) != 2 ||
		info.Members[0].HeartbeatAgeMillis != 0 || !slices.Equal(info.Topics, []string{"orders"}) {
		t.Fatalf("describe: %+v", info)
	}

	// Leave: b's queues go to a at once.
	left, err := cl.ConsumerHeartbeat(context.Background(), api.ConsumerHeartbeat{Group: "cg", Member: "b", Leave: true})
	if err != nil || left.Generation != 3 || len(left.Assignment) != 0 {
		t.Fatalf("leave: %+v, %v", left, err)
	}
	if a3 := join(t, cl, "cg", "a", nil); a3.Generation != 3 || len(a3.Assignment) != 4 {
		t.Fatalf("a after b left: %+v", a3)
	}

	// Expiry, on the fake clock: a heartbeats 5 s in, so at 10.5 s it is
	// alive; at 15.5 s (10.5 s after its last heartbeat) it is gone.
	join(t, cl, "cg", "c", func(hb *api.ConsumerHeartbeat) { hb.SessionMillis = 20_000 })
	advance(5 * time.Second)
	join(t, cl, "cg", "a", nil)
	advance(5500 * time.Millisecond)
	if info := describe(t, cl, "cg"); len(info.Members) != 2 || info.Members[0].HeartbeatAgeMillis != 5500 {
		t.Fatalf("a within its session was expired: %+v", info)
	}
	advance(5 * time.Second)
	info = describe(t, cl, "cg")
	if len(info.Members) != 1 || info.Members[0].ID != "c" || info.Generation != 5 {
		t.Fatalf("after a's session ran out (c, with a 20 s session, stays): %+v", info)
	}
	advance(5 * time.Second) // c: 20.5 s silent
	info = describe(t, cl, "cg")
	if len(info.Members) != 0 || info.Generation != 6 {
		t.Fatalf("after c's session ran out: %+v", info)
	}
	if st := s.ConsumerStats(); st.Expired != 2 || st.Rebalances != 6 {
		t.Fatalf("stats: %+v", st)
	}
	// An expired member that comes back rejoins.
	if a4 := join(t, cl, "cg", "a", nil); a4.Generation != 7 || len(a4.Assignment) != 4 {
		t.Fatalf("rejoin: %+v", a4)
	}
}

func TestConsumerSessionBounds(t *testing.T) {
	_, cl, _, _ := consumerMeta(t, 2)
	for _, c := range []struct{ ask, want int64 }{{0, 10_000}, {10, 1000}, {3000, 3000}, {1e9, 300_000}} {
		r := join(t, cl, "cg", "a", func(hb *api.ConsumerHeartbeat) { hb.SessionMillis = c.ask })
		if r.SessionMillis != c.want || r.Generation != 1 {
			t.Fatalf("session %d ms: %+v, want %d ms in generation 1", c.ask, r, c.want)
		}
	}
}

func TestCommitOffsetsFencing(t *testing.T) {
	_, cl, s, _ := consumerMeta(t, 4)
	ctx := context.Background()
	a := join(t, cl, "cg", "a", nil)
	if r, err := cl.CommitOffsets(ctx, api.CommitRequest{Group: "cg", Member: "a", Generation: 1, Offsets: offsetsOf(a, 5)}); err != nil || r.Generation != 1 {
		t.Fatalf("commit: %+v, %v", r, err)
	}
	b := join(t, cl, "cg", "b", nil)
	before := describe(t, cl, "cg").Offsets
	if len(before) != 4 || before[0].Offset != 5 {
		t.Fatalf("committed: %+v", before)
	}
	for _, c := range []struct {
		name string
		req  api.CommitRequest
		want *protocol.Error
	}{
		{"stale generation", api.CommitRequest{Group: "cg", Member: "a", Generation: 1, Offsets: offsetsOf(a, 9)}, protocol.ErrStaleGeneration},
		{"queue not assigned", api.CommitRequest{Group: "cg", Member: "a", Generation: 2, Offsets: offsetsOf(b, 9)}, protocol.ErrStaleGeneration},
		{"queue out of range", api.CommitRequest{Group: "cg", Member: "a", Generation: 2, Offsets: []api.QueueOffset{{Topic: "orders", Queue: 7, Offset: 1}}}, protocol.ErrStaleGeneration},
		{"unknown member", api.CommitRequest{Group: "cg", Member: "zz", Generation: 2, Offsets: offsetsOf(b, 9)}, protocol.ErrStaleGeneration},
		{"negative offset", api.CommitRequest{Group: "cg", Member: "b", Generation: 2, Offsets: offsetsOf(b, -1)}, protocol.ErrInvalid},
		{"unknown group", api.CommitRequest{Group: "nope", Member: "b", Generation: 2, Offsets: offsetsOf(b, 1)}, protocol.ErrNotFound},
		{"bad member name", api.CommitRequest{Group: "cg", Member: "b/1", Generation: 2, Offsets: offsetsOf(b, 1)}, protocol.ErrInvalid},
	} {
		_, err := cl.CommitOffsets(ctx, c.req)
		if !errors.Is(err, c.want) {
			t.Fatalf("%s: %v, want %v", c.name, err, c.want.Status)
		}
		if after := describe(t, cl, "cg").Offsets; !reflect.DeepEqual(after, before) {
			t.Fatalf("%s changed the offsets: %+v -> %+v", c.name, before, after)
		}
	}
	if _, err := cl.CommitOffsets(ctx, api.CommitRequest{Group: "cg", Member: "b", Generation: 2, Offsets: offsetsOf(b, 7)}); err != nil {
		t.Fatal(err)
	}
	if b2 := join(t, cl, "cg", "b", nil); b2.Assignment[0].Committed != 7 {
		t.Fatalf("b's heartbeat after its commit: %+v", b2)
	}
	if st := s.ConsumerStats(); st.Commits != 2 {
		t.Fatalf("commits: %+v", st)
	}
}

func TestConsumerBadInput(t *testing.T) {
	_, cl, _, _ := consumerMeta(t, 2)
	ctx := context.Background()
	many := make([]string, 65)
	for i := range many {
		many[i] = fmt.Sprint("t", i)
	}
	for _, c := range []struct {
		name string
		hb   api.ConsumerHeartbeat
		want *protocol.Error
		says string
	}{
		{"empty group", api.ConsumerHeartbeat{Member: "a", Topics: []string{"orders"}}, protocol.ErrInvalid, "group name must be 1 to 255 bytes"},
		{"long group", api.ConsumerHeartbeat{Group: strings.Repeat("g", 256), Member: "a", Topics: []string{"orders"}}, protocol.ErrInvalid, "group name must be 1 to 255 bytes"},
		{"bad member", api.ConsumerHeartbeat{Group: "cg", Member: "a b", Topics: []string{"orders"}}, protocol.ErrInvalid, "member name \"a b\""},
		{"no topics", api.ConsumerHeartbeat{Group: "cg", Member: "a"}, protocol.ErrInvalid, "1 to 64 topics"},
		{"too many topics", api.ConsumerHeartbeat{Group: "cg", Member: "a", Topics: many}, protocol.ErrInvalid, "1 to 64 topics"},
		{"bad topic", api.ConsumerHeartbeat{Group: "cg", Member: "a", Topics: []string{"a/b"}}, protocol.ErrInvalid, "not allowed"},
		{"unknown topic", api.ConsumerHeartbeat{Group: "cg", Member: "a", Topics: []string{"orders", "nope"}}, protocol.ErrUnknownTopic, "\"nope\" does not exist"},
		{"negative session", api.ConsumerHeartbeat{Group: "cg", Member: "a", Topics: []string{"orders"}, SessionMillis: -1}, protocol.ErrInvalid, "negative"},
	} {
		_, err := cl.ConsumerHeartbeat(ctx, c.hb)
		if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.says) {
			t.Fatalf("%s: %v, want %v saying %q", c.name, err, c.want.Status, c.says)
		}
	}
	if gs, err := cl.ConsumerGroups(ctx, ""); err != nil || len(gs) != 0 {
		t.Fatalf("refused heartbeats left groups: %+v, %v", gs, err)
	}
	if _, err := cl.ConsumerGroups(ctx, "nope"); !errors.Is(err, protocol.ErrNotFound) {
		t.Fatalf("describe of an unknown group: %v", err)
	}
	// A reset never makes a group: its first member does.
	if _, err := cl.ResetOffsets(ctx, api.ResetOffsetsRequest{Group: "cg", Offsets: []api.QueueOffset{{Topic: "orders"}}}); !errors.Is(err, protocol.ErrNotFound) {
		t.Fatalf("reset of a group that does not exist: %v", err)
	}
	if gs, err := cl.ConsumerGroups(ctx, ""); err != nil || len(gs) != 0 {
		t.Fatalf("a refused reset left groups: %+v, %v", gs, err)
	}
	joinAndLeave(t, cl, "cg", "a")
	for _, c := range []struct {
		name string
		req  api.ResetOffsetsRequest
		want *protocol.Error
	}{
		{"nothing", api.ResetOffsetsRequest{Group: "cg"}, protocol.ErrInvalid},
		{"negative", api.ResetOffsetsRequest{Group: "cg", Offsets: []api.QueueOffset{{Topic: "orders", Offset: -2}}}, protocol.ErrInvalid},
		{"unknown topic", api.ResetOffsetsRequest{Group: "cg", Offsets: []api.QueueOffset{{Topic: "nope"}}}, protocol.ErrUnknownTopic},
		{"no such queue", api.ResetOffsetsRequest{Group: "cg", Offsets: []api.QueueOffset{{Topic: "orders", Queue: 2}}}, protocol.ErrInvalid},
		{"bad group", api.ResetOffsetsRequest{Group: "c g", Offsets: []api.QueueOffset{{Topic: "orders"}}}, protocol.ErrInvalid},
	} {
		if _, err := cl.ResetOffsets(ctx, c.req); !errors.Is(err, c.want) {
			t.Fatalf("reset, %s: %v, want %v", c.name, err, c.want.Status)
		}
	}
}

func TestResetOffsetsNeedsAnIdleGroup(t *testing.T) {
	_, cl, _, _ := consumerMeta(t, 2)
	ctx := context.Background()
	join(t, cl, "cg", "a", nil)
	req := api.ResetOffsetsRequest{Group: "cg", Offsets: []api.QueueOffset{{Topic: "orders", Queue: 0, Offset: 3}, {Topic: "orders", Queue: 1, Offset: 4}}}
	if _, err := cl.ResetOffsets(ctx, req); !errors.Is(err, protocol.ErrGroupActive) || !strings.Contains(err.Error(), "live members") {
		t.Fatalf("reset with a live member: %v", err)
	}
	if _, err := cl.ConsumerHeartbeat(ctx, api.ConsumerHeartbeat{Group: "cg", Member: "a", Leave: true}); err != nil {
		t.Fatal(err)
	}
	info, err := cl.ResetOffsets(ctx, req)
	if err != nil || !reflect.DeepEqual(info.Offsets, req.Offsets) || len(info.Members) != 0 {
		t.Fatalf("reset after the member left: %+v, %v", info, err)
	}
	if r := join(t, cl, "cg", "b", nil); r.Assignment[0].Committed != 3 || r.Assignment[1].Committed != 4 {
		t.Fatalf("a member after the reset: %+v", r)
	}
}

func TestAddQueuesStartsAGeneration(t *testing.T) {
	_, cl, s, _ := consumerMeta(t, 4)
	a := join(t, cl, "cg", "a", nil)
	b := join(t, cl, "cg", "b", nil)
	if _, err := cl.AddQueues(context.Background(), "orders", 2); err != nil {
		t.Fatal(err)
	}
	b2 := join(t, cl, "cg", "b", nil)
	if b2.Generation != b.Generation+1 || len(b2.Assignment) != 3 {
		t.Fatalf("b after queues were added: %+v (before %+v)", b2, b)
	}
	for _, q := range queuesOf(b) {
		if !slices.Contains(queuesOf(b2), q) {
			t.Fatalf("b lost queue %d when queues were added", q)
		}
	}
	if a.Generation != 1 || s.ConsumerStats().Rebalances != 3 {
		t.Fatalf("rebalances: %+v", s.ConsumerStats())
	}
}

// TestOffsetsSurviveLeaderChange: commit, stop the leader, read the offsets
// from the new one; the member keeps its generation there (no rebalance, no
// expiry: a new leader gives every member a full session).
func TestOffsetsSurviveLeaderChange(t *testing.T) {
	m := testcluster.StartMeta(t, 3, nil)
	cl := m.Client(t)
	ctx := context.Background()
	heartbeat(t, cl, "g1", routing.RoleMaster, nil)
	if _, err := cl.CreateTopic(ctx, api.CreateTopicRequest{Name: "orders", Queues: 4}); err != nil {
		t.Fatal(err)
	}
	a := join(t, cl, "cg", "a", nil)
	if _, err := cl.CommitOffsets(ctx, api.CommitRequest{Group: "cg", Member: "a", Generation: a.Generation, Offsets: offsetsOf(a, 11)}); err != nil {
		t.Fatal(err)
	}
	i, _ := m.Leader()
	m.Stop(i)
	_, leader := m.Leader()
	info := describe(t, cl, "cg")
	if len(info.Offsets) != 4 || info.Offsets[3].Offset != 11 || len(info.Members) != 1 || info.Members[0].HeartbeatAgeMillis != -1 {
		t.Fatalf("from the new leader %s: %+v", leader.ID(), info)
	}
	a2 := join(t, cl, "cg", "a", nil)
	if a2.Generation != a.Generation || a2.Assignment[0].Committed != 11 {
		t.Fatalf("a on the new leader: %+v (before %+v)", a2, a)
	}
	if _, err := cl.CommitOffsets(ctx, api.CommitRequest{Group: "cg", Member: "a", Generation: a.Generation, Offsets: offsetsOf(a, 12)}); err != nil {
		t.Fatalf("commit on the new leader: %v", err)
	}
}

// TestOffsetsSurviveRestartFromSnapshot: the whole cluster restarts from
// its snapshots and logs, and the groups come back as they were.
func TestOffsetsSurviveRestartFromSnapshot(t *testing.T) {
	m := testcluster.StartMeta(t, 3, func(c *metaserver.Config) {
		c.SnapshotInterval, c.SnapshotThreshold = 20*time.Millisecond, 16
	})
	cl := m.Client(t)
	ctx := context.Background()
	heartbeat(t, cl, "g1", routing.RoleMaster, nil)
	if _, err := cl.CreateTopic(ctx, api.CreateTopicRequest{Name: "orders", Queues: 4}); err != nil {
		t.Fatal(err)
	}
	a := join(t, cl, "cg", "a", nil)
	b := join(t, cl, "cg", "b", nil)
	for i := range int64(20) {
		if _, err := cl.CommitOffsets(ctx, api.CommitRequest{Group: "cg", Member: "b", Generation: b.Generation, Offsets: offsetsOf(b, i)}); err != nil {
			t.Fatal(err)
		}
	}
	testwait.For(t, 10*time.Second, "every node to take a snapshot", func() bool {
		for _, c := range m.Cfgs {
			if !hasSnapshot(c.Dir) {
				return false
			}
		}
		return true
	})
	joinAndLeave(t, cl, "other", "x")
	if _, err := cl.ResetOffsets(ctx, api.ResetOffsetsRequest{Group: "other", Offsets: []api.QueueOffset{{Topic: "orders", Queue: 1, Offset: 8}}}); err != nil {
		t.Fatal(err)
	}
	_, leader := m.Leader()
	want := leader.FSM().ConsumerGroups()
	testwait.For(t, 5*time.Second, "every node to apply", func() bool {
		for _, s := range m.Nodes {
			if !reflect.DeepEqual(s.FSM().ConsumerGroups(), want) {
				return false
			}
		}
		return true
	})
	m.StopAll()
	for i := range m.Nodes {
		m.Restart(i)
	}
	for _, s := range m.Nodes {
		testwait.For(t, 10*time.Second, "the node to restore its consumer groups", func() bool {
			return reflect.DeepEqual(s.FSM().ConsumerGroups(), want)
		})
	}
	cl2 := m.Client(t)
	a2 := join(t, cl2, "cg", "a", nil)
	if a2.Generation != b.Generation || len(a2.Assignment) != 2 || slices.ContainsFunc(queuesOf(a2), func(q uint32) bool { return slices.Contains(queuesOf(b), q) }) {
		t.Fatalf("a after the restart: %+v (b holds %v; a first held %v)", a2, queuesOf(b), queuesOf(a))
	}
	if b2 := join(t, cl2, "cg", "b", nil); b2.Assignment[0].Committed != 19 {
		t.Fatalf("b after the restart: %+v", b2)
	}
}

// TestGroupFilterThroughTheServer: a member's filter is taken in canonical
// form, every reply names the group's, a member asking for another is
// refused with the reason, and set-filter changes it for the members
// already in (from their next heartbeat) as describe shows.
func TestGroupFilterThroughTheServer(t *testing.T) {
	_, cl, _, _ := consumerMeta(t, 2)
	ctx := context.Background()
	withFilter := func(f string) func(*api.ConsumerHeartbeat) {
		return func(hb *api.ConsumerHeartbeat) { hb.Filter = f }
	}
	if r := join(t, cl, "cg", "a", withFilter("A||B")); r.Filter != "A OR B" {
		t.Fatalf("the first member's reply names filter %q, want the canonical A OR B", r.Filter)
	}
	if r := join(t, cl, "cg", "b", withFilter("A or  B")); r.Filter != "A OR B" {
		t.Fatalf("a member of the same filter spelled otherwise: %q", r.Filter)
	}
	_, err := cl.ConsumerHeartbeat(ctx, api.ConsumerHeartbeat{Group: "cg", Member: "c", Topics: []string{"orders"}, Filter: "C"})
	if !errors.Is(err, &protocol.Error{Status: protocol.StatusInvalid}) || !strings.Contains(err.Error(), "A OR B") {
		t.Fatalf("a member asking for another filter: %v", err)
	}
	_, err = cl.ConsumerHeartbeat(ctx, api.ConsumerHeartbeat{Group: "cg", Member: "c", Topics: []string{"orders"}, Filter: "A ||"})
	if !errors.Is(err, &protocol.Error{Status: protocol.StatusInvalid}) {
		t.Fatalf("a filter that does not parse: %v", err)
	}
	gi, err := cl.SetGroupFilter(ctx, "cg", "region = 'eu'")
	if err != nil || gi.Filter != "region = 'eu'" || !strings.HasPrefix(gi.FilterBy, "set-filter") {
		t.Fatalf("set-filter: %+v, %v", gi, err)
	}
	// a heartbeats with its old filter: it stays and learns the new one.
	if r := join(t, cl, "cg", "a", withFilter("A||B")); r.Filter != "region = 'eu'" {
		t.Fatalf("a member's heartbeat after set-filter names %q", r.Filter)
	}
	if _, err := cl.SetGroupFilter(ctx, "cg", ""); !errors.Is(err, &protocol.Error{Status: protocol.StatusInvalid}) {
		t.Fatalf("set-filter with no filter: %v", err)
	}
	// "*" is every message: members name no filter in their PULLs.
	if _, err := cl.SetGroupFilter(ctx, "cg", "*"); err != nil {
		t.Fatal(err)
	}
	if r := join(t, cl, "cg", "b", nil); r.Filter != "" {
		t.Fatalf(`after set-filter "*", the reply names %q`, r.Filter)
	}
}
