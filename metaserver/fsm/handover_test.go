package fsm

import (
	"reflect"
	"testing"

	"github.com/hashicorp/raft"
	"pgregory.net/rapid"

	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

func held(g ConsumerGroup, member string, inc uint64) (queues []uint32, waiting int) {
	h, waiting := g.Held(member, inc)
	for _, q := range h {
		if q.Topic == "events" {
			queues = append(queues, q.Queue)
		}
	}
	return queues, waiting
}

func commitHeld(member string, inc uint64, offs ...QueueOffset) *CommitHeld {
	return &CommitHeld{Group: "cg", Member: member, Incarnation: inc, Offsets: offs}
}

func ev(q uint32, off int64) QueueOffset { return QueueOffset{Topic: "events", Queue: q, Offset: off} }

// A queue moves from one member to another only once the first released
// it: meanwhile only the first may commit it, and the second does not hold
// it.
func TestOneOwnerAtATime(t *testing.T) {
	f := consumerSeeded(t) // events: 5 queues
	mustApply(t, f, &JoinMember{Group: "cg", Member: "a", Incarnation: 1, Topics: []string{"events"}, At: 10})
	if q, w := held(cgroup(t, f, "cg"), "a", 1); len(q) != 5 || w != 0 {
		t.Fatalf("a alone holds %v, waits for %d", q, w)
	}
	mustApply(t, f, commitHeld("a", 1, ev(0, 5), ev(3, 7)))
	mustApply(t, f, &JoinMember{Group: "cg", Member: "b", Incarnation: 1, Topics: []string{"events"}, At: 20})
	g := cgroup(t, f, "cg")
	aq, aw := held(g, "a", 1)
	bq, bw := held(g, "b", 1)
	if len(aq) != 3 || aw != 0 || len(bq) != 0 || bw != 2 {
		t.Fatalf("after b joined: a holds %v (waits %d), b holds %v (waits %d); want a 3, b none and 2 waiting", aq, aw, bq, bw)
	}
	moved := []uint32{}
	for q, o := range g.Assignment["events"] {
		if o == "b" {
			moved = append(moved, uint32(q))
			if h, _ := g.Holder("events", uint32(q)); h.Member != "a" || h.Since != 20 {
				t.Fatalf("queue %d moved to b is held by %+v", q, h)
			}
		}
	}
	// a, letting go, commits them; b may not yet.
	mustApply(t, f, commitHeld("a", 1, ev(moved[0], 9)))
	_, err := apply(t, f, commitHeld("b", 1, ev(moved[0], 10)))
	wantStatus(t, err, protocol.ErrStaleGeneration, "b's commit of a queue a still holds")
	mustApply(t, f, &ReleaseQueues{Group: "cg", Member: "a", Incarnation: 1, Queues: []QueueRef{{"events", moved[0]}}})
	if bq, bw := held(cgroup(t, f, "cg"), "b", 1); len(bq) != 1 || bq[0] != moved[0] || bw != 1 {
		t.Fatalf("after a released queue %d: b holds %v, waits %d", moved[0], bq, bw)
	}
	_, err = apply(t, f, commitHeld("a", 1, ev(moved[0], 11)))
	wantStatus(t, err, protocol.ErrStaleGeneration, "a's commit of a queue it released")
	mustApply(t, f, commitHeld("b", 1, ev(moved[0], 12)))

	// a leaves: what it still held goes to its owners.
	mustApply(t, f, &LeaveMember{Group: "cg", Member: "a", Incarnation: 1, At: 30})
	g = cgroup(t, f, "cg")
	if bq, bw := held(g, "b", 1); len(bq) != 5 || bw != 0 || g.Releasing != nil {
		t.Fatalf("after a left: b holds %v, waits %d; releasing %v", bq, bw, g.Releasing)
	}
}

// A member id that joins again with a newer incarnation (a restart with a
// stable id) keeps its queues without a rebalance, but holds them only once
// the older incarnation released them; the older one is fenced.
func TestNewIncarnationWaitsForTheOld(t *testing.T) {
	f := consumerSeeded(t)
	mustApply(t, f, &JoinMember{Group: "cg", Member: "a", Incarnation: 100, Topics: []string{"events"}, At: 10})
	mustApply(t, f, &JoinMember{Group: "cg", Member: "b", Incarnation: 100, Topics: []string{"events"}, At: 10})
	gen := cgroup(t, f, "cg").Generation
	mustApply(t, f, &JoinMember{Group: "cg", Member: "a", Incarnation: 200, Topics: []string{"events"}, At: 40})
	g := cgroup(t, f, "cg")
	if g.Generation != gen {
		t.Fatalf("a restart with the same id rebalanced: generation %d, was %d", g.Generation, gen)
	}
	if q, w := held(g, "a", 200); len(q) != 0 || w != 3 {
		t.Fatalf("the new incarnation holds %v, waits %d", q, w)
	}
	_, err := apply(t, f, &JoinMember{Group: "cg", Member: "a", Incarnation: 100, Topics: []string{"events"}, At: 41})
	wantStatus(t, err, protocol.ErrMemberFenced, "the old incarnation's heartbeat")
	_, err = apply(t, f, &LeaveMember{Group: "cg", Member: "a", Incarnation: 100, At: 41})
	wantStatus(t, err, protocol.ErrMemberFenced, "the old incarnation's Close")
	mustApply(t, f, commitHeld("a", 100, ev(0, 3)))                             // its last commit, while it still holds
	mustApply(t, f, &ReleaseQueues{Group: "cg", Member: "a", Incarnation: 100}) // its session ran out
	if q, w := held(cgroup(t, f, "cg"), "a", 200); len(q) != 3 || w != 0 {
		t.Fatalf("after the old incarnation was released, the new holds %v, waits %d", q, w)
	}
	_, err = apply(t, f, commitHeld("a", 100, ev(0, 4)))
	wantStatus(t, err, protocol.ErrMemberFenced, "a commit of the old incarnation")
}

// A committed offset moves back only for a reader sent back by a later
// broker epoch.
func TestCommitsNeverMoveBack(t *testing.T) {
	f := consumerSeeded(t)
	mustApply(t, f, &JoinMember{Group: "cg", Member: "a", Incarnation: 1, Topics: []string{"events"}, At: 10})
	mustApply(t, f, commitHeld("a", 1, QueueOffset{Topic: "events", Queue: 1, Offset: 90, Epoch: 2}))
	_, err := apply(t, f, commitHeld("a", 1, QueueOffset{Topic: "events", Queue: 1, Offset: 50, Epoch: 2}))
	wantStatus(t, err, protocol.ErrStaleGeneration, "a commit below the committed offset")
	_, err = apply(t, f, commitHeld("a", 1, QueueOffset{Topic: "events", Queue: 1, Offset: 50}))
	wantStatus(t, err, protocol.ErrStaleGeneration, "a lower commit of no known epoch")
	mustApply(t, f, commitHeld("a", 1, QueueOffset{Topic: "events", Queue: 1, Offset: 60, Epoch: 3}))
	if o := cgroup(t, f, "cg").Offsets["events"][1]; o != 60 {
		t.Fatalf("the rewound commit of epoch 3 is not recorded: %d", o)
	}
}

// Members that join an empty group within its join window share its first
// assignment; the window closes at its end, not before; a group is deleted
// only without members.
func TestJoinWindowAndDelete(t *testing.T) {
	f := consumerSeeded(t)
	join := func(m string, at int64) {
		mustApply(t, f, &JoinMember{Group: "cg", Member: m, Incarnation: 1, Topics: []string{"events"}, JoinWindowMillis: 1000, At: at})
	}
	join("a", 0)
	if q, w := held(cgroup(t, f, "cg"), "a", 1); len(q) != 0 {
		t.Fatalf("a holds %v (waits %d) while the window is open", q, w)
	}
	join("b", 500)
	if r := mustApply(t, f, &SettleGroup{Group: "cg", At: 999}); r.Changed {
		t.Fatal("the window closed before its end")
	}
	mustApply(t, f, &SettleGroup{Group: "cg", At: 1000})
	g := cgroup(t, f, "cg")
	aq, _ := held(g, "a", 1)
	bq, _ := held(g, "b", 1)
	if len(aq)+len(bq) != 5 || len(aq) < 2 || len(bq) < 2 || g.Releasing != nil {
		t.Fatalf("first assignment: a %v, b %v, releasing %v", aq, bq, g.Releasing)
	}
	join("c", 2000) // a group with members: no window
	if g := cgroup(t, f, "cg"); g.JoinUntil != 0 {
		t.Fatal("a join to a group with members opened a window")
	}
	_, err := apply(t, f, &DeleteGroup{Group: "cg"})
	wantStatus(t, err, protocol.ErrGroupActive, "deleting a group with members")
	for _, m := range []string{"a", "b", "c"} {
		mustApply(t, f, &LeaveMember{Group: "cg", Member: m, At: 3000})
	}
	mustApply(t, f, &DeleteGroup{Group: "cg"})
	if _, ok := f.ConsumerGroup("cg"); ok {
		t.Fatal("the group is still there")
	}
	_, err = apply(t, f, &DeleteGroup{Group: "cg"})
	wantStatus(t, err, protocol.ErrNotFound, "deleting a group that is gone")
}

// Through any sequence of joins, leaves, restarts and releases: every
// queue has at most one holder, a member holds only what it owns or
// releases, and a snapshot restores the same group.
func TestHandoverProperty(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		f := New()
		if err := applyT(f, &RegisterBroker{Group: "g1", Role: "master", Broker: brokerT("m"), At: 1}); err != nil {
			rt.Fatal(err)
		}
		_ = applyT(f, &CreateTopic{Name: "events", Queues: []string{"g1", "g1", "g1", "g1", "g1", "g1"}})
		inc := map[string]uint64{}
		at := int64(10)
		for range rapid.IntRange(1, 30).Draw(rt, "steps") {
			at += rapid.Int64Range(0, 2000).Draw(rt, "dt")
			m := rapid.SampledFrom([]string{"a", "b", "c"}).Draw(rt, "member")
			switch rapid.IntRange(0, 4).Draw(rt, "op") {
			case 0:
				if inc[m] == 0 {
					inc[m] = 1
				}
				_ = applyT(f, &JoinMember{Group: "cg", Member: m, Incarnation: inc[m], Topics: []string{"events"}, JoinWindowMillis: 500, At: at})
			case 1:
				inc[m]++
				_ = applyT(f, &JoinMember{Group: "cg", Member: m, Incarnation: inc[m], Topics: []string{"events"}, JoinWindowMillis: 500, At: at})
			case 2:
				_ = applyT(f, &LeaveMember{Group: "cg", Member: m, At: at})
			case 3:
				for i := uint64(0); i <= inc[m]; i++ {
					_ = applyT(f, &ReleaseQueues{Group: "cg", Member: m, Incarnation: i})
				}
			case 4:
				_ = applyT(f, &SettleGroup{Group: "cg", At: at})
			}
			g, ok := f.ConsumerGroup("cg")
			if !ok {
				continue
			}
			holders := map[uint32]string{}
			for _, id := range []string{"a", "b", "c"} {
				mm := g.Members[id]
				if mm == nil {
					continue
				}
				h, _ := g.Held(id, mm.Incarnation)
				for _, q := range h {
					if other, dup := holders[q.Queue]; dup {
						rt.Fatalf("queue %d held by %s and %s", q.Queue, other, id)
					}
					holders[q.Queue] = id
					if r := g.releaser(q.Topic, q.Queue); r != nil && r.Member != id {
						rt.Fatalf("queue %d held by %s while %s releases it", q.Queue, id, r.Member)
					}
				}
			}
			for t, qs := range g.Releasing {
				for q, h := range qs {
					if _, dup := holders[q]; dup {
						rt.Fatalf("queue %s/%d held by its owner while %s releases it", t, q, h.Member)
					}
				}
			}
		}
		r := restored(rt, f)
		if !reflect.DeepEqual(r.State().ConsumerGroups, f.State().ConsumerGroups) {
			rt.Fatalf("restored %+v, want %+v", r.State().ConsumerGroups, f.State().ConsumerGroups)
		}
	})
}

// applyT applies c outside a testing.T, returning Apply's error.
func applyT(f *FSM, c Command) error {
	b, err := Encode(c)
	if err != nil {
		return err
	}
	if err, ok := f.Apply(&raft.Log{Type: raft.LogCommand, Data: b, Index: 1}).(error); ok {
		return err
	}
	return nil
}

func brokerT(id string) routing.Broker { return routing.Broker{ID: id, Addr: id + ":1"} }
