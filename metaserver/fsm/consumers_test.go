package fsm

import (
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/raft"
	"pgregory.net/rapid"

	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// consumerSeeded is seeded with a second topic of 5 queues.
func consumerSeeded(t *testing.T) *FSM {
	f := seeded(t) // "orders": 3 queues
	mustApply(t, f, &CreateTopic{Name: "events", Queues: []string{"g1", "g2", "g1", "g2", "g1"}})
	return f
}

func wantStatus(t *testing.T, err error, want *protocol.Error, what string) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("%s: got %v, want %v", what, err, want.Status)
	}
}

func cgroup(t *testing.T, f *FSM, name string) ConsumerGroup {
	t.Helper()
	g, ok := f.ConsumerGroup(name)
	if !ok {
		t.Fatalf("no consumer group %q", name)
	}
	return g
}

func TestJoinLeave(t *testing.T) {
	f := consumerSeeded(t)
	v := f.Version()
	r := mustApply(t, f, &JoinGroup{Group: "cg", Member: "a", Topics: []string{"orders", "events", "orders"}, SessionMillis: 10000, At: 5})
	if !r.Changed || r.Generation != 1 || r.Rebalanced != 1 {
		t.Fatalf("first join: %+v", r)
	}
	g := cgroup(t, f, "cg")
	if !slices.Equal(g.Members["a"].Topics, []string{"events", "orders"}) || len(g.Assignment["orders"]) != 3 || len(g.Assignment["events"]) != 5 {
		t.Fatalf("after the first join: %+v", g)
	}
	if f.Version() != v {
		t.Fatal("a consumer group command moved the registry version (routes carry it)")
	}
	// A retried join changes nothing.
	if r := mustApply(t, f, &JoinGroup{Group: "cg", Member: "a", Topics: []string{"events", "orders"}, SessionMillis: 10000, At: 6}); r.Changed || r.Generation != 1 {
		t.Fatalf("retried join: %+v", r)
	}
	// A changed session alone: recorded, no new generation.
	if r := mustApply(t, f, &JoinGroup{Group: "cg", Member: "a", Topics: []string{"events", "orders"}, SessionMillis: 20000, At: 6}); !r.Changed || r.Generation != 1 || r.Rebalanced != 0 {
		t.Fatalf("session change: %+v", r)
	}
	r = mustApply(t, f, &JoinGroup{Group: "cg", Member: "b", Topics: []string{"orders"}, At: 7})
	if r.Generation != 2 {
		t.Fatalf("second join: %+v", r)
	}
	g = cgroup(t, f, "cg")
	if n := len(g.Queues("b")); n != 1 {
		t.Fatalf("b (orders only) holds %d queues, want 1: %+v", n, g.Assignment)
	}
	for _, o := range g.Assignment["events"] {
		if o != "a" {
			t.Fatalf("an events queue went to %q, who does not subscribe to it", o)
		}
	}
	// Changing topics is a new generation.
	if r := mustApply(t, f, &JoinGroup{Group: "cg", Member: "b", Topics: []string{"orders", "events"}, At: 8}); r.Generation != 3 {
		t.Fatalf("topic change: %+v", r)
	}
	if g := cgroup(t, f, "cg"); g.Members["b"].JoinedAt != 7 || g.ChangedAt != 8 {
		t.Fatalf("joined at %d, changed at %d", g.Members["b"].JoinedAt, g.ChangedAt)
	}

	// Leaves: a stale expectation is refused, an absent member changes nothing.
	_, err := apply(t, f, &LeaveGroup{Group: "cg", Member: "a", ExpectGeneration: 2})
	wantStatus(t, err, protocol.ErrConflict, "leave at a stale generation")
	if r := mustApply(t, f, &LeaveGroup{Group: "cg", Member: "zz"}); r.Changed || r.Generation != 3 {
		t.Fatalf("leave of an absent member: %+v", r)
	}
	if r := mustApply(t, f, &LeaveGroup{Group: "nope", Member: "zz"}); r.Changed {
		t.Fatalf("leave of an absent group: %+v", r)
	}
	mustApply(t, f, &CommitOffsets{Group: "cg", Member: "a", Generation: 3, Offsets: []QueueOffset{{Topic: cgroup(t, f, "cg").Queues("a")[0].Topic, Queue: cgroup(t, f, "cg").Queues("a")[0].Queue, Offset: 4}}})
	if r := mustApply(t, f, &LeaveGroup{Group: "cg", Member: "a", ExpectGeneration: 3, At: 9}); !r.Changed || r.Generation != 4 {
		t.Fatalf("leave: %+v", r)
	}
	mustApply(t, f, &LeaveGroup{Group: "cg", Member: "b", At: 10})
	g = cgroup(t, f, "cg")
	if len(g.Members) != 0 || len(g.Assignment) != 0 || g.Generation != 5 || len(g.Committed()) != 1 {
		t.Fatalf("an empty group keeps its name, generation and offsets only: %+v", g)
	}
	// It resumes: a new member gets the committed offset.
	mustApply(t, f, &JoinGroup{Group: "cg", Member: "c", Topics: []string{"orders", "events"}, At: 11})
	q := cgroup(t, f, "cg").Queues("c")
	if len(q) != 8 || q[0] != (QueueOffset{Topic: "events", Queue: 0, Offset: 4}) || q[1].Offset != -1 {
		t.Fatalf("resumed member's queues: %+v", q)
	}
}

func TestJoinBadInput(t *testing.T) {
	f := consumerSeeded(t)
	for _, c := range []*JoinGroup{
		{Group: "", Member: "a", Topics: []string{"orders"}},
		{Group: "cg", Member: "a b", Topics: []string{"orders"}},
		{Group: strings.Repeat("x", 256), Member: "a", Topics: []string{"orders"}},
		{Group: "cg", Member: "a"},
		{Group: "cg", Member: "a", Topics: []string{"orders"}, SessionMillis: -1},
	} {
		_, err := apply(t, f, c)
		wantStatus(t, err, protocol.ErrInvalid, fmt.Sprintf("%+v", c))
	}
	many := make([]string, MaxConsumerTopics+1)
	for i := range many {
		many[i] = fmt.Sprint("t", i)
	}
	_, err := apply(t, f, &JoinGroup{Group: "cg", Member: "a", Topics: many})
	wantStatus(t, err, protocol.ErrInvalid, "65 topics")
	_, err = apply(t, f, &JoinGroup{Group: "cg", Member: "a", Topics: []string{"orders", "missing"}})
	wantStatus(t, err, protocol.ErrUnknownTopic, "unknown topic")
	if len(f.ConsumerGroups()) != 0 {
		t.Fatalf("refused joins left groups: %+v", f.ConsumerGroups())
	}
}

func TestCommitOffsets(t *testing.T) {
	f := consumerSeeded(t)
	mustApply(t, f, &JoinGroup{Group: "cg", Member: "a", Topics: []string{"orders"}})
	mustApply(t, f, &JoinGroup{Group: "cg", Member: "b", Topics: []string{"orders"}})
	g := cgroup(t, f, "cg")
	qa, qb := g.Queues("a"), g.Queues("b")
	if len(qa)+len(qb) != 3 || g.Generation != 2 {
		t.Fatalf("assignment: %+v", g.Assignment)
	}
	set := func(qs []QueueOffset, off int64) []QueueOffset {
		out := slices.Clone(qs)
		for i := range out {
			out[i].Offset = off
		}
		return out
	}
	if r := mustApply(t, f, &CommitOffsets{Group: "cg", Member: "a", Generation: 2, Offsets: set(qa, 10)}); !r.Changed || r.Generation != 2 {
		t.Fatalf("commit: %+v", r)
	}
	if r := mustApply(t, f, &CommitOffsets{Group: "cg", Member: "a", Generation: 2, Offsets: set(qa, 10)}); r.Changed {
		t.Fatalf("a repeated commit changed something: %+v", r)
	}
	before := f.State()
	for _, c := range []struct {
		cmd  *CommitOffsets
		want *protocol.Error
	}{
		{&CommitOffsets{Group: "cg", Member: "a", Generation: 1, Offsets: set(qa, 20)}, protocol.ErrStaleGeneration},
		{&CommitOffsets{Group: "cg", Member: "a", Generation: 3, Offsets: set(qa, 20)}, protocol.ErrStaleGeneration},
		// All or nothing: one queue of b's spoils a's commit.
		{&CommitOffsets{Group: "cg", Member: "a", Generation: 2, Offsets: append(set(qa, 20), set(qb, 20)...)}, protocol.ErrStaleGeneration},
		{&CommitOffsets{Group: "cg", Member: "a", Generation: 2, Offsets: []QueueOffset{{Topic: "orders", Queue: 99}}}, protocol.ErrStaleGeneration},
		{&CommitOffsets{Group: "cg", Member: "a", Generation: 2, Offsets: []QueueOffset{{Topic: "events", Queue: 0}}}, protocol.ErrStaleGeneration},
		{&CommitOffsets{Group: "cg", Member: "a", Generation: 2, Offsets: set(qa, -1)}, protocol.ErrInvalid},
		{&CommitOffsets{Group: "nope", Member: "a", Generation: 2, Offsets: set(qa, 1)}, protocol.ErrNotFound},
	} {
		_, err := apply(t, f, c.cmd)
		wantStatus(t, err, c.want, fmt.Sprintf("%+v", c.cmd))
	}
	if !reflect.DeepEqual(f.State(), before) {
		t.Fatal("a refused commit changed the state")
	}
	if got := cgroup(t, f, "cg").Queues("a"); !reflect.DeepEqual(got, set(qa, 10)) {
		t.Fatalf("a's queues with offsets: %+v", got)
	}
}

func TestResetOffsets(t *testing.T) {
	f := consumerSeeded(t)
	// A group that does not exist yet is created with its offsets.
	mustApply(t, f, &ResetOffsets{Group: "new", Offsets: []QueueOffset{{Topic: "orders", Queue: 2, Offset: 7}}})
	if c := cgroup(t, f, "new").Committed(); !reflect.DeepEqual(c, []QueueOffset{{Topic: "orders", Queue: 2, Offset: 7}}) {
		t.Fatalf("reset of a new group: %+v", c)
	}
	mustApply(t, f, &JoinGroup{Group: "new", Member: "a", Topics: []string{"orders"}})
	_, err := apply(t, f, &ResetOffsets{Group: "new", Offsets: []QueueOffset{{Topic: "orders", Queue: 2, Offset: 0}}})
	wantStatus(t, err, protocol.ErrGroupActive, "reset with a member")
	mustApply(t, f, &LeaveGroup{Group: "new", Member: "a"})
	for _, c := range []struct {
		o    QueueOffset
		want *protocol.Error
	}{
		{QueueOffset{Topic: "missing", Queue: 0}, protocol.ErrUnknownTopic},
		{QueueOffset{Topic: "orders", Queue: 3}, protocol.ErrInvalid},
		{QueueOffset{Topic: "orders", Queue: 0, Offset: -5}, protocol.ErrInvalid},
	} {
		_, err := apply(t, f, &ResetOffsets{Group: "new", Offsets: []QueueOffset{{Topic: "orders", Queue: 0, Offset: 1}, c.o}})
		wantStatus(t, err, c.want, fmt.Sprintf("%+v", c.o))
	}
	mustApply(t, f, &ResetOffsets{Group: "new", Offsets: []QueueOffset{{Topic: "orders", Queue: 0, Offset: 3}}})
	want := []QueueOffset{{Topic: "orders", Queue: 0, Offset: 3}, {Topic: "orders", Queue: 2, Offset: 7}}
	if c := cgroup(t, f, "new").Committed(); !reflect.DeepEqual(c, want) {
		t.Fatalf("after the reset: %+v, want %+v (a refused reset changes nothing; unnamed queues are kept)", c, want)
	}
}

func TestAddQueuesRebalances(t *testing.T) {
	f := consumerSeeded(t)
	mustApply(t, f, &JoinGroup{Group: "cg1", Member: "a", Topics: []string{"orders"}})
	mustApply(t, f, &JoinGroup{Group: "cg1", Member: "b", Topics: []string{"orders"}})
	mustApply(t, f, &JoinGroup{Group: "cg2", Member: "a", Topics: []string{"events"}})
	old := cgroup(t, f, "cg1")
	r := mustApply(t, f, &AddQueues{Topic: "orders", Groups: []string{"g2", "g1", "g2"}, ExpectVersion: f.State().Topics["orders"].Version, At: 42})
	if r.Rebalanced != 1 {
		t.Fatalf("rebalanced %d groups, want 1", r.Rebalanced)
	}
	g := cgroup(t, f, "cg1")
	if g.Generation != old.Generation+1 || len(g.Assignment["orders"]) != 6 || len(g.Queues("a")) != 3 || g.ChangedAt != 42 {
		t.Fatalf("after AddQueues: %+v", g)
	}
	for q, o := range old.Assignment["orders"] {
		if g.Assignment["orders"][q] != o {
			t.Fatalf("queue %d moved from %s to %s although the old owners were under their share", q, o, g.Assignment["orders"][q])
		}
	}
	if g2 := cgroup(t, f, "cg2"); g2.Generation != 1 {
		t.Fatalf("a group not subscribed to the topic moved to generation %d", g2.Generation)
	}
}

func TestConsumerSnapshotRestore(t *testing.T) {
	f := consumerSeeded(t)
	mustApply(t, f, &JoinGroup{Group: "cg", Member: "a", Topics: []string{"orders", "events"}, SessionMillis: 3000, At: 1})
	mustApply(t, f, &JoinGroup{Group: "cg", Member: "b", Topics: []string{"orders"}, At: 2})
	g := cgroup(t, f, "cg")
	q := g.Queues("b")[0]
	q.Offset = 12
	mustApply(t, f, &CommitOffsets{Group: "cg", Member: "b", Generation: g.Generation, Offsets: []QueueOffset{q}})
	mustApply(t, f, &ResetOffsets{Group: "idle", Offsets: []QueueOffset{{Topic: "events", Queue: 4, Offset: 99}}})
	r := restored(t, f)
	if !reflect.DeepEqual(r.State(), f.State()) {
		t.Fatalf("restored state differs:\n got %+v\nwant %+v", r.State().ConsumerGroups, f.State().ConsumerGroups)
	}
	// The restored node goes on as the original does.
	c := &JoinGroup{Group: "cg", Member: "c", Topics: []string{"orders"}, At: 3}
	if a, b := mustApply(t, r, c), mustApply(t, f, c); !reflect.DeepEqual(a, b) || !reflect.DeepEqual(r.State(), f.State()) {
		t.Fatalf("after restore: %+v vs %+v", a, b)
	}
}

func TestRestoreSnapshotFromBeforeConsumerGroups(t *testing.T) {
	old := `{"version":3,"groups":{"g1":{"name":"g1","master":{"id":"m","addr":"a:1"},"epoch":1}},"topics":{"orders":{"name":"orders","queues":["g1","g1"],"version":2}},"members":{},"next_producer_id":1}`
	f := New()
	if err := f.Restore(io.NopCloser(strings.NewReader(old))); err != nil {
		t.Fatal(err)
	}
	if len(f.ConsumerGroups()) != 0 {
		t.Fatal("consumer groups from nowhere")
	}
	if r := mustApply(t, f, &JoinGroup{Group: "cg", Member: "a", Topics: []string{"orders"}}); r.Generation != 1 {
		t.Fatalf("join after an old snapshot: %+v", r)
	}
}

func TestDecodeConsumerCommands(t *testing.T) {
	for _, c := range []Command{
		&JoinGroup{Group: "g", Member: "m", Topics: []string{"t"}, SessionMillis: 1, At: 2},
		&LeaveGroup{Group: "g", Member: "m", ExpectGeneration: 3, At: 4},
		&CommitOffsets{Group: "g", Member: "m", Generation: 5, Offsets: []QueueOffset{{Topic: "t", Queue: 1, Offset: 2}}},
		&ResetOffsets{Group: "g", Offsets: []QueueOffset{{Topic: "t", Queue: 1, Offset: 2}}, At: 6},
		&JoinGroup{Group: "g", Member: "m", Topics: []string{"t"}, Filter: "A OR B"},
		&SetGroupFilter{Group: "g", Filter: "A", Principal: "p", At: 7},
	} {
		if c.Type()&IgnoreUnknown != 0 || c.Type() < 12 {
			t.Fatalf("%T has type %d", c, c.Type())
		}
		b, err := Encode(c)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Decode(b)
		if err != nil || !reflect.DeepEqual(got, c) {
			t.Fatalf("%T: decoded %+v, %v", c, got, err)
		}
	}
}

// checkAssignment checks the invariants of one topic's assignment.
func checkAssignment(t *rapid.T, n int, subs, owners []string) map[string][]int {
	if len(subs) == 0 {
		if owners != nil {
			t.Fatalf("owners without subscribers: %v", owners)
		}
		return nil
	}
	if len(owners) != n {
		t.Fatalf("%d owners for %d queues", len(owners), n)
	}
	held := map[string][]int{}
	for q, o := range owners {
		if !slices.Contains(subs, o) {
			t.Fatalf("queue %d owned by %q, not a subscriber of %v", q, o, subs)
		}
		held[o] = append(held[o], q)
	}
	lo, hi := n, 0
	for _, m := range subs {
		lo, hi = min(lo, len(held[m])), max(hi, len(held[m]))
	}
	if hi-lo > 1 {
		t.Fatalf("loads from %d to %d: %v", lo, hi, held)
	}
	return held
}

// TestAssignQueuesProperties: balanced, valid, deterministic and sticky for
// any previous assignment and subscribers.
func TestAssignQueuesProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		pool := []string{"a", "b", "c", "d", "e", "f", "g"}
		n := rapid.IntRange(0, 40).Draw(t, "queues")
		subs := rapid.SliceOfNDistinct(rapid.SampledFrom(pool), 0, len(pool), func(s string) string { return s }).Draw(t, "subs")
		slices.Sort(subs)
		prev := rapid.SliceOfN(rapid.SampledFrom(append([]string{""}, pool...)), 0, n+3).Draw(t, "prev")
		owners := AssignQueues(n, prev, subs)
		if n == 0 {
			return
		}
		held := checkAssignment(t, n, subs, owners)
		if !slices.Equal(owners, AssignQueues(n, slices.Clone(prev), slices.Clone(subs))) {
			t.Fatal("not deterministic")
		}
		// Sticky: a member keeps its valid old queues up to its share.
		base := n / max(len(subs), 1)
		for _, m := range subs {
			var old []int
			for q := 0; q < min(n, len(prev)); q++ {
				if prev[q] == m {
					old = append(old, q)
				}
			}
			kept := 0
			for _, q := range old {
				if owners[q] == m {
					kept++
				}
			}
			if kept < min(len(old), base) {
				t.Fatalf("%s kept %d of its %d queues, under the share %d", m, kept, len(old), base)
			}
			if kept < len(old) && len(held[m]) > kept {
				t.Fatalf("%s lost queues it owned and got others instead: old %v, now %v", m, old, held[m])
			}
		}
		// Assigning again changes nothing.
		if !slices.Equal(owners, AssignQueues(n, owners, subs)) {
			t.Fatal("a stable assignment moved")
		}
	})
}

// TestJoinMovesOnlyWhatBalanceNeeds: through the FSM, a series of joins and
// leaves; at every join the old members only lose queues, each keeping its
// share, and the newcomer gets only what balance needs.
func TestJoinMovesOnlyWhatBalanceNeeds(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		f := New()
		apply1 := func(c Command) *Result {
			b, _ := Encode(c)
			switch r := f.Apply(&raft.Log{Type: raft.LogCommand, Data: b, Index: 1}).(type) {
			case *Result:
				return r
			default:
				t.Fatalf("%+v: %v", c, r)
				return nil
			}
		}
		apply1(&RegisterBroker{Group: "g1", Role: routing.RoleMaster, Broker: routing.Broker{ID: "m", Addr: "a:1"}})
		nq := rapid.IntRange(1, 30).Draw(t, "queues")
		apply1(&CreateTopic{Name: "t", Queues: slices.Repeat([]string{"g1"}, nq)})
		apply1(&CreateTopic{Name: "u", Queues: slices.Repeat([]string{"g1"}, rapid.IntRange(1, 10).Draw(t, "uqueues"))})
		members := []string{"m0", "m1", "m2", "m3", "m4", "m5", "m6", "m7"}
		steps := rapid.IntRange(1, 20).Draw(t, "steps")
		for range steps {
			m := rapid.SampledFrom(members).Draw(t, "member")
			before, _ := f.ConsumerGroup("cg")
			if before.Members[m] != nil && rapid.Bool().Draw(t, "leave") {
				apply1(&LeaveGroup{Group: "cg", Member: m})
			} else {
				topics := rapid.SampledFrom([][]string{{"t"}, {"u"}, {"t", "u"}}).Draw(t, "topics")
				apply1(&JoinGroup{Group: "cg", Member: m, Topics: topics})
			}
			g, _ := f.ConsumerGroup("cg")
			for _, topic := range []string{"t", "u"} {
				var subs []string
				for id, mm := range g.Members {
					if slices.Contains(mm.Topics, topic) {
						subs = append(subs, id)
					}
				}
				slices.Sort(subs)
				r, _ := f.Route(topic)
				checkAssignment(t, len(r.Queues), subs, g.Assignment[topic])
				var oldSubs []string
				for id, mm := range before.Members {
					if slices.Contains(mm.Topics, topic) {
						oldSubs = append(oldSubs, id)
					}
				}
				slices.Sort(oldSubs)
				if slices.Equal(oldSubs, subs) && !slices.Equal(g.Assignment[topic], before.Assignment[topic]) {
					t.Fatalf("%s's subscribers did not change but its assignment did: %v -> %v", topic, before.Assignment[topic], g.Assignment[topic])
				}
				joined := !slices.Contains(oldSubs, m) && slices.Contains(subs, m)
				if !joined {
					continue
				}
				// Was the topic balanced among the others before? (It
				// always is, by the property above.) Then the others
				// only lose queues, each down to no less than the share.
				share := len(r.Queues) / len(subs)
				for q, o := range g.Assignment[topic] {
					if o != m && before.Assignment[topic][q] != o {
						t.Fatalf("join of %s moved queue %d of %s from %s to %s, another old member", m, q, topic, before.Assignment[topic][q], o)
					}
				}
				for _, o := range subs {
					if o == m {
						continue
					}
					had, has := 0, 0
					for q := range before.Assignment[topic] {
						if before.Assignment[topic][q] == o {
							had++
							if g.Assignment[topic][q] == o {
								has++
							}
						}
					}
					if has < min(had, share) {
						t.Fatalf("join of %s: %s kept %d of %d queues of %s, under the share %d", m, o, has, had, topic, share)
					}
				}
			}
		}
	})
}

// A commit keeps the epoch its offsets were read in, and hands it to the
// queue's next owner; an operator's reset forgets it.
func TestCommitKeepsTheEpoch(t *testing.T) {
	f := consumerSeeded(t)
	mustApply(t, f, &JoinGroup{Group: "cg", Member: "a", Topics: []string{"orders"}})
	qs := cgroup(t, f, "cg").Queues("a")
	for i := range qs {
		qs[i].Offset, qs[i].Epoch = 40, 3
	}
	mustApply(t, f, &CommitOffsets{Group: "cg", Member: "a", Generation: 1, Offsets: qs})
	mustApply(t, f, &LeaveGroup{Group: "cg", Member: "a"})
	mustApply(t, f, &JoinGroup{Group: "cg", Member: "b", Topics: []string{"orders"}})
	for _, q := range cgroup(t, f, "cg").Queues("b") {
		if q.Offset != 40 || q.Epoch != 3 {
			t.Fatalf("the next owner got %+v; want offset 40 read in epoch 3", q)
		}
	}
	mustApply(t, f, &LeaveGroup{Group: "cg", Member: "b"})
	mustApply(t, f, &ResetOffsets{Group: "cg", Offsets: []QueueOffset{{Topic: "orders", Queue: 0, Offset: 5}}})
	mustApply(t, f, &JoinGroup{Group: "cg", Member: "c", Topics: []string{"orders"}})
	for _, q := range cgroup(t, f, "cg").Queues("c") {
		if q.Queue == 0 && (q.Offset != 5 || q.Epoch != 0) {
			t.Fatalf("after a reset: %+v; want offset 5, no epoch", q)
		}
	}
}
