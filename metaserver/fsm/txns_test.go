package fsm

import (
	"fmt"
	"io"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/raft"
	"pgregory.net/rapid"

	"github.com/ferrymq/ferrymq/protocol"
)

func decide(p, n uint64, commit bool, by string, groups ...string) *TxnDecide {
	return &TxnDecide{Producer: p, Epoch: 1, Number: n, Commit: commit, By: by, Groups: groups, At: 1000}
}

func txnOf(t *testing.T, f *FSM, p, n uint64) (TxnRecord, bool) {
	t.Helper()
	return f.Txn(TxnKey{Producer: p, Epoch: 1, Number: n})
}

// txnGroupSeeded has consumer group "cg" whose only member "a" (joined by
// principal "app") holds every queue of "orders" in generation 1.
func txnGroupSeeded(t *testing.T) *FSM {
	f := consumerSeeded(t)
	mustApply(t, f, &JoinGroup{Group: "cg", Member: "a", Topics: []string{"orders"}, SessionMillis: 10000, At: 5, Principal: "app"})
	return f
}

func committed(f *FSM, topic string, q uint32) (int64, bool) {
	g, _ := f.ConsumerGroup("cg")
	o, ok := g.Offsets[topic][q]
	return o, ok
}

// The first decision wins: a later decide, whatever it asks, changes
// nothing and answers the recorded decision.
func TestTxnDecideFirstWins(t *testing.T) {
	f := seeded(t)
	r := mustApply(t, f, decide(7, 1, true, protocol.TxnByProducer, "g1", "g2"))
	want := TxnRecord{Committed: true, By: protocol.TxnByProducer, At: 1000, Groups: []string{"g1", "g2"}, Pending: []string{"g1", "g2"}}
	if !r.Changed || r.Txn == nil || !reflect.DeepEqual(*r.Txn, want) {
		t.Fatalf("first decide: %+v %+v", r, r.Txn)
	}
	before := f.State()
	for _, c := range []*TxnDecide{
		decide(7, 1, false, protocol.TxnByTimeout, "g1"),
		decide(7, 1, true, protocol.TxnByAdmin, "g3"),
		decide(7, 1, true, protocol.TxnByProducer, "g1", "g2"),
	} {
		c.At = 2000
		r := mustApply(t, f, c)
		if r.Changed || r.Txn == nil || !reflect.DeepEqual(*r.Txn, want) {
			t.Fatalf("later decide %+v: %+v %+v, want the first decision", c, r, r.Txn)
		}
	}
	if !reflect.DeepEqual(before, f.State()) {
		t.Fatal("a later decide changed the state")
	}
	// Another transaction of the same producer is its own.
	if r := mustApply(t, f, decide(7, 2, false, protocol.TxnByTimeout, "g2")); !r.Changed || r.Txn.Committed {
		t.Fatalf("another number: %+v", r.Txn)
	}
}

func TestTxnDecideInvalid(t *testing.T) {
	groups257 := make([]string, MaxTxnGroups+1)
	for i := range groups257 {
		groups257[i] = fmt.Sprintf("g%d", i)
	}
	offs := &TxnOffsets{Group: "cg", Member: "a", Generation: 1, Offsets: []QueueOffset{{Topic: "orders", Queue: 0, Offset: 5}}}
	for _, tc := range []struct {
		name string
		c    *TxnDecide
	}{
		{"producer 0", decide(0, 1, true, protocol.TxnByProducer, "g1")},
		{"number 0", decide(7, 0, true, protocol.TxnByProducer, "g1")},
		{"unknown decider", decide(7, 1, true, "someone", "g1")},
		{"no decider", decide(7, 1, true, "", "g1")},
		{"no groups", decide(7, 1, true, protocol.TxnByProducer)},
		{"257 groups", decide(7, 1, true, protocol.TxnByProducer, groups257...)},
		{"a group repeated", decide(7, 1, true, protocol.TxnByProducer, "g1", "g1")},
		{"a bad group name", decide(7, 1, true, protocol.TxnByProducer, "g 1")},
		{"an empty group name", decide(7, 1, true, protocol.TxnByProducer, "")},
		{"offsets with an abort", func() *TxnDecide { c := decide(7, 1, false, protocol.TxnByProducer, "g1"); c.Offsets = offs; return c }()},
		{"offsets of no queue", func() *TxnDecide {
			c := decide(7, 1, true, protocol.TxnByProducer, "g1")
			c.Offsets = &TxnOffsets{Group: "cg", Member: "a", Generation: 1}
			return c
		}()},
		{"offsets of a bad group name", func() *TxnDecide {
			c := decide(7, 1, true, protocol.TxnByProducer, "g1")
			o := *offs
			o.Group = "c g"
			c.Offsets = &o
			return c
		}()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := txnGroupSeeded(t)
			before := registry(f)
			_, err := apply(t, f, tc.c)
			wantStatus(t, err, protocol.ErrInvalid, tc.name)
			if !reflect.DeepEqual(before, registry(f)) {
				t.Fatal("a refused decide changed the state")
			}
		})
	}
	// 256 groups are fine.
	f := seeded(t)
	mustApply(t, f, decide(7, 1, true, protocol.TxnByProducer, groups257[:MaxTxnGroups]...))
}

// Offsets move with a commit decision, checked as a member's commit is; a
// refused commit records nothing.
func TestTxnDecideOffsets(t *testing.T) {
	f := txnGroupSeeded(t)
	withOffsets := func(n uint64, offs *TxnOffsets) *TxnDecide {
		c := decide(7, n, true, protocol.TxnByProducer, "g1", "g2")
		c.Offsets = offs
		return c
	}
	offs := func(gen uint64, principal string, offset int64) *TxnOffsets {
		return &TxnOffsets{Group: "cg", Member: "a", Generation: gen, Principal: principal,
			Offsets: []QueueOffset{{Topic: "orders", Queue: 0, Offset: offset}, {Topic: "orders", Queue: 1, Offset: offset + 1}}}
	}
	r := mustApply(t, f, withOffsets(1, offs(1, "app", 10)))
	if !r.Changed || r.Generation != 1 || !r.Txn.Committed || !r.Txn.Offsets {
		t.Fatalf("commit with offsets: %+v %+v", r, r.Txn)
	}
	if o, _ := committed(f, "orders", 0); o != 10 {
		t.Fatalf("orders/0 committed %d, want 10", o)
	}
	if o, _ := committed(f, "orders", 1); o != 11 {
		t.Fatalf("orders/1 committed %d, want 11", o)
	}

	for _, tc := range []struct {
		name string
		offs *TxnOffsets
		want *protocol.Error
	}{
		{"a stale generation", offs(2, "app", 20), protocol.ErrStaleGeneration},
		{"another principal's member", offs(1, "thief", 20), protocol.ErrNotAuthorized},
		{"a queue not the member's", &TxnOffsets{Group: "cg", Member: "b", Generation: 1, Offsets: []QueueOffset{{Topic: "orders", Queue: 0, Offset: 20}}},
			protocol.ErrStaleGeneration},
		{"an unknown consumer group", &TxnOffsets{Group: "nope", Member: "a", Generation: 1, Offsets: []QueueOffset{{Topic: "orders", Queue: 0, Offset: 20}}},
			protocol.ErrNotFound},
		{"a negative offset", offs(1, "app", -5), protocol.ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := f.State()
			_, err := apply(t, f, withOffsets(2, tc.offs))
			wantStatus(t, err, tc.want, tc.name)
			if !reflect.DeepEqual(before, f.State()) {
				t.Fatal("a refused offsets commit changed the state")
			}
			if _, ok := txnOf(t, f, 7, 2); ok {
				t.Fatal("a refused offsets commit recorded a decision")
			}
		})
	}

	// A decided transaction answers its decision, whatever offsets come
	// with a repeat: they are not checked nor committed again.
	r = mustApply(t, f, withOffsets(1, offs(2, "thief", 99)))
	if r.Changed || !r.Txn.Committed || !r.Txn.Offsets {
		t.Fatalf("repeat with other offsets: %+v", r)
	}
	if o, _ := committed(f, "orders", 0); o != 10 {
		t.Fatalf("a repeated decide moved orders/0 to %d", o)
	}
	// An abort decided first: a commit with offsets after it commits none.
	mustApply(t, f, decide(7, 3, false, protocol.TxnByTimeout, "g1"))
	// A commit without offsets decided first: a commit with offsets after
	// it is answered committed, but with none of its offsets.
	mustApply(t, f, decide(7, 4, true, protocol.TxnByChecker, "g1"))
	if r := mustApply(t, f, withOffsets(4, offs(1, "app", 50))); !r.Txn.Committed || r.Txn.Offsets || r.Changed {
		t.Fatalf("commit with offsets after a commit without: %+v", r.Txn)
	}
	if r := mustApply(t, f, withOffsets(3, offs(1, "app", 50))); r.Txn.Committed || r.Changed {
		t.Fatalf("commit after an abort: %+v", r.Txn)
	}
	if o, _ := committed(f, "orders", 0); o != 10 {
		t.Fatalf("a commit after an abort moved orders/0 to %d", o)
	}
}

// A member incarnation's offsets are checked as CommitHeld checks them:
// the queue must be held by the incarnation, and an offset never moves
// back.
func TestTxnDecideHeldOffsets(t *testing.T) {
	f := consumerSeeded(t)
	mustApply(t, f, &JoinMember{Group: "cg", Member: "a", Incarnation: 3, Topics: []string{"events"}, At: 10})
	held := func(n uint64, inc uint64, offset int64) *TxnDecide {
		c := decide(9, n, true, protocol.TxnByProducer, "g1")
		c.Offsets = &TxnOffsets{Group: "cg", Member: "a", Incarnation: inc, Offsets: []QueueOffset{{Topic: "events", Queue: 2, Offset: offset}}}
		return c
	}
	mustApply(t, f, held(1, 3, 40))
	g, _ := f.ConsumerGroup("cg")
	if g.Offsets["events"][2] != 40 {
		t.Fatalf("events/2 committed %d, want 40", g.Offsets["events"][2])
	}
	for name, c := range map[string]*TxnDecide{
		"an offset moving back": held(2, 3, 39),
		"another incarnation":   held(3, 4, 50),
	} {
		before := f.State()
		_, err := apply(t, f, c)
		wantStatus(t, err, protocol.ErrStaleGeneration, name)
		if !reflect.DeepEqual(before, f.State()) {
			t.Fatalf("%s: the refused decide changed the state", name)
		}
	}
}

func TestTxnDone(t *testing.T) {
	f := seeded(t)
	mustApply(t, f, decide(7, 1, true, protocol.TxnByProducer, "g1", "g2", "g3"))
	r := mustApply(t, f, &TxnDone{Producer: 7, Epoch: 1, Number: 1, Groups: []string{"g2", "other"}})
	if !r.Changed || !slices.Equal(r.Txn.Pending, []string{"g1", "g3"}) || !slices.Equal(r.Txn.Groups, []string{"g1", "g2", "g3"}) {
		t.Fatalf("after g2 done: %+v", r.Txn)
	}
	if r := mustApply(t, f, &TxnDone{Producer: 7, Epoch: 1, Number: 1, Groups: []string{"g2"}}); r.Changed {
		t.Fatal("a repeated done changed something")
	}
	mustApply(t, f, &TxnDone{Producer: 7, Epoch: 1, Number: 1, Groups: []string{"g1", "g3"}})
	if _, ok := txnOf(t, f, 7, 1); ok || f.TxnCount() != 0 {
		t.Fatal("a record with no pending group is kept")
	}
	if r := mustApply(t, f, &TxnDone{Producer: 7, Epoch: 1, Number: 5, Groups: []string{"g1"}}); r.Changed {
		t.Fatal("done of an unknown record changed something")
	}
	// A timeout's decision names only its group: kept once done, so that
	// another group of the transaction asking later learns it.
	mustApply(t, f, decide(7, 2, false, protocol.TxnByTimeout, "g1"))
	mustApply(t, f, &TxnDone{Producer: 7, Epoch: 1, Number: 2, Groups: []string{"g1"}})
	if r, ok := txnOf(t, f, 7, 2); !ok || r.Committed || len(r.Pending) != 0 {
		t.Fatalf("a timeout's decision after its group's done: %+v %v, want kept", r, ok)
	}
}

func TestTxnExpire(t *testing.T) {
	f := seeded(t)
	for n, at := range []int64{100, 200, 300} {
		c := decide(7, uint64(n+1), true, protocol.TxnByProducer, "g1")
		c.At = at
		mustApply(t, f, c)
	}
	if !f.TxnsDecidedBefore(201) || f.TxnsDecidedBefore(100) {
		t.Fatal("TxnsDecidedBefore is wrong")
	}
	if r := mustApply(t, f, &TxnExpire{Before: 201}); r.Expired != 2 || !r.Changed {
		t.Fatalf("expire before 201: %+v", r)
	}
	if _, ok := txnOf(t, f, 7, 3); !ok || f.TxnCount() != 1 {
		t.Fatal("the record decided at 300 is gone")
	}
	if r := mustApply(t, f, &TxnExpire{Before: 201}); r.Changed {
		t.Fatal("expiring nothing changed something")
	}
}

func TestTxnRecordsBounded(t *testing.T) {
	f := seeded(t)
	for i := range MaxTxnRecords {
		f.s.Txns[TxnKey{Producer: 1, Epoch: 0, Number: uint64(i + 1)}] = &TxnRecord{By: protocol.TxnByProducer, Groups: []string{"g1"}, Pending: []string{"g1"}}
	}
	_, err := apply(t, f, decide(7, 1, true, protocol.TxnByProducer, "g1"))
	wantStatus(t, err, protocol.ErrBusy, "decide past the bound")
	if !protocol.IsRetriable(err) {
		t.Fatal("BUSY past the bound is not retriable")
	}
	// A decided transaction still answers its decision.
	if r := mustApply(t, f, &TxnDecide{Producer: 1, Number: 1, Commit: true, By: protocol.TxnByProducer, Groups: []string{"g1"}}); r.Changed || r.Txn.Committed {
		t.Fatalf("a recorded decision past the bound: %+v", r)
	}
}

func TestTxnSnapshot(t *testing.T) {
	f := seeded(t)
	mustApply(t, f, decide(7, 1, true, protocol.TxnByProducer, "g1", "g2"))
	mustApply(t, f, decide(8, 1, false, protocol.TxnByTimeout, "g2"))
	mustApply(t, f, &TxnDone{Producer: 7, Epoch: 1, Number: 1, Groups: []string{"g1"}})
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	want := f.State().Txns
	// Changes after Snapshot do not leak into it.
	mustApply(t, f, decide(9, 1, true, protocol.TxnByProducer, "g1"))
	mustApply(t, f, &TxnDone{Producer: 7, Epoch: 1, Number: 1, Groups: []string{"g2"}})
	g := persisted(t, snap)
	if !reflect.DeepEqual(g.State().Txns, want) || g.TxnCount() != 2 || len(want) != 2 {
		t.Fatalf("restored decisions: %+v, want %+v", g.State().Txns, want)
	}
	if r := mustApply(t, g, decide(7, 1, false, protocol.TxnByTimeout, "g1")); !r.Txn.Committed {
		t.Fatal("a restored node let a later decide win")
	}
	// A snapshot from before transaction decisions restores none.
	old := New()
	if err := old.Restore(io.NopCloser(strings.NewReader(`{"version":3,"groups":{},"topics":{},"members":{}}`))); err != nil {
		t.Fatal(err)
	}
	if old.TxnCount() != 0 {
		t.Fatal("an old snapshot restored decisions")
	}
	mustApply(t, old, decide(7, 1, true, protocol.TxnByProducer, "g1"))
}

// txnModel is what the property test expects of the registry.
type txnModel struct {
	records map[TxnKey]TxnRecord
	offsets map[uint32]int64 // consumer group cg's committed offsets of "orders"
}

// TestTxnDecisionsProperty: under any interleaving of decides (either
// outcome, with or without offsets, valid or stale), dones, expiries and
// snapshot restores, the first decision for a key is what every later
// decide returns until the record is deleted; offsets move iff a commit
// with offsets was recorded; a refused offsets commit records nothing.
func TestTxnDecisionsProperty(t *testing.T) {
	base := txnGroupSeeded(t)
	rapid.Check(t, func(rt *rapid.T) {
		f := restored(rt, base)
		m := txnModel{records: map[TxnKey]TxnRecord{}, offsets: map[uint32]int64{}}
		groups := []string{"g1", "g2", "g3"}
		now := int64(1000)
		steps := rapid.IntRange(1, 60).Draw(rt, "steps")
		for range steps {
			now += rapid.Int64Range(0, 50).Draw(rt, "tick")
			k := TxnKey{Producer: rapid.Uint64Range(1, 2).Draw(rt, "producer"), Epoch: 1, Number: rapid.Uint64Range(1, 3).Draw(rt, "number")}
			switch rapid.IntRange(0, 4).Draw(rt, "op") {
			case 0, 1:
				c := &TxnDecide{Producer: k.Producer, Epoch: k.Epoch, Number: k.Number, Commit: rapid.Bool().Draw(rt, "commit"),
					By:     rapid.SampledFrom([]string{protocol.TxnByProducer, protocol.TxnByTimeout}).Draw(rt, "by"),
					Groups: rapid.SliceOfNDistinct(rapid.SampledFrom(groups), 1, 3, func(s string) string { return s }).Draw(rt, "groups"), At: now}
				stale := false
				if c.Commit && rapid.Bool().Draw(rt, "with offsets") {
					stale = rapid.Bool().Draw(rt, "stale")
					gen := uint64(1)
					if stale {
						gen = 2
					}
					c.Offsets = &TxnOffsets{Group: "cg", Member: "a", Generation: gen,
						Offsets: []QueueOffset{{Topic: "orders", Queue: rapid.Uint32Range(0, 2).Draw(rt, "queue"), Offset: rapid.Int64Range(0, 100).Draw(rt, "offset")}}}
				}
				res, err := applyR(f, c)
				prev, had := m.records[k]
				switch {
				case had:
					if err != nil || res.Changed || !reflect.DeepEqual(*res.Txn, prev) {
						rt.Fatalf("decide %+v of a decided transaction: %+v %v, want %+v", c, res, err, prev)
					}
				case stale:
					if err == nil {
						rt.Fatalf("decide with stale offsets recorded %+v", res.Txn)
					}
				default:
					if err != nil || !res.Changed {
						rt.Fatalf("decide %+v: %+v %v", c, res, err)
					}
					m.records[k] = TxnRecord{Committed: c.Commit, By: c.By, At: now, Groups: c.Groups, Pending: c.Groups, Offsets: c.Offsets != nil}
					if c.Offsets != nil {
						o := c.Offsets.Offsets[0]
						m.offsets[o.Queue] = o.Offset
					}
				}
			case 2:
				done := rapid.SliceOfNDistinct(rapid.SampledFrom(groups), 1, 3, func(s string) string { return s }).Draw(rt, "done")
				if _, err := applyR(f, &TxnDone{Producer: k.Producer, Epoch: k.Epoch, Number: k.Number, Groups: done}); err != nil {
					rt.Fatal(err)
				}
				if r, ok := m.records[k]; ok {
					r.Pending = slices.DeleteFunc(slices.Clone(r.Pending), func(g string) bool { return slices.Contains(done, g) })
					if len(r.Pending) == 0 && r.By == protocol.TxnByProducer {
						delete(m.records, k) // another's decision is kept until it expires
					} else {
						m.records[k] = r
					}
				}
			case 3:
				before := now - rapid.Int64Range(0, 300).Draw(rt, "age")
				if _, err := applyR(f, &TxnExpire{Before: before}); err != nil {
					rt.Fatal(err)
				}
				for k, r := range m.records {
					if r.At < before {
						delete(m.records, k)
					}
				}
			case 4:
				f = restored(rt, f)
			}
			checkTxnModel(rt, f, m)
		}
	})
}

// applyR applies c as raft would.
func applyR(f *FSM, c Command) (*Result, error) {
	b, err := Encode(c)
	if err != nil {
		return nil, err
	}
	switch r := f.Apply(&raft.Log{Type: raft.LogCommand, Data: b, Index: 1}).(type) {
	case *Result:
		return r, nil
	case error:
		return nil, r
	default:
		return nil, fmt.Errorf("Apply returned %T", r)
	}
}

func checkTxnModel(t *rapid.T, f *FSM, m txnModel) {
	st := f.State()
	if len(st.Txns) != len(m.records) {
		t.Fatalf("registry holds %d decisions, model %d", len(st.Txns), len(m.records))
	}
	for k, want := range m.records {
		got, ok := f.Txn(k)
		if !ok || !reflect.DeepEqual(got, want) {
			t.Fatalf("decision %s: %+v (held %v), want %+v", k.ID(), got, ok, want)
		}
	}
	g, _ := f.ConsumerGroup("cg")
	if !reflect.DeepEqual(nonNil(g.Offsets["orders"]), m.offsets) {
		t.Fatalf("offsets %v, want %v", g.Offsets["orders"], m.offsets)
	}
}

func nonNil(m map[uint32]int64) map[uint32]int64 {
	if m == nil {
		return map[uint32]int64{}
	}
	return m
}

// A producer's decision from an older instance of its identity is fenced:
// a zombie, or a late retry of a decision already applied and forgotten,
// cannot record a decision (and move offsets) again; the newer instance's
// checker decides its predecessors' transactions.
func TestTxnDecideFencesOlderInstances(t *testing.T) {
	f := seeded(t)
	id, epoch := f.State().Producers["billing"].ID, f.State().Producers["billing"].Epoch
	if epoch < 1 {
		t.Fatalf("billing's epoch %d: want a later instance than the first", epoch)
	}
	old := &TxnDecide{Producer: id, Epoch: epoch - 1, Number: 1, Commit: true, By: protocol.TxnByProducer, Groups: []string{"g1"}, At: 1000}
	before := f.State()
	_, err := apply(t, f, old)
	wantStatus(t, err, &protocol.Error{Status: protocol.StatusProducerFenced}, "an older instance's decision")
	if !reflect.DeepEqual(before, f.State()) {
		t.Fatal("a fenced decision changed the state")
	}
	old.By = protocol.TxnByChecker
	if r := mustApply(t, f, old); !r.Changed || !r.Txn.Committed {
		t.Fatalf("the checker's decision of an older instance's transaction: %+v", r)
	}
	cur := &TxnDecide{Producer: id, Epoch: epoch, Number: 2, Commit: true, By: protocol.TxnByProducer, Groups: []string{"g1"}, At: 1000}
	if r := mustApply(t, f, cur); !r.Changed {
		t.Fatal("the current instance's decision was refused")
	}
}
