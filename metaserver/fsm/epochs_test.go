package fsm

import (
	"errors"
	"reflect"
	"testing"

	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// promoted is a group g whose slave b was promoted over a at epoch 2,
// recorded as starting at 100 (b's last reported log end).
func promoted(t *testing.T) *FSM {
	t.Helper()
	f := New()
	mustApply(t, f, &RegisterBroker{Group: "g", Role: routing.RoleMaster, Broker: routing.Broker{ID: "a", Addr: "a:1"}, LogEnd: 0, At: 1})
	mustApply(t, f, &RegisterBroker{Group: "g", Role: routing.RoleSlave, Broker: routing.Broker{ID: "b", Addr: "b:1"}, At: 1})
	mustApply(t, f, &Promote{Group: "g", Epoch: 1, Master: "a", Slave: "b", Start: 100, At: 2})
	return f
}

// A group's first master starts its epoch fixed (it took no write before
// the registry named it); a promotion's start waits for the new master's
// word, which fixes it once, in either direction; after that no report and
// no earlier metaserver's SetEpochStart moves it.
func TestFixEpochStart(t *testing.T) {
	f := promoted(t)
	g, _ := f.Group("g")
	if !g.History[0].Fixed || g.History[1].Fixed || g.History[1].Start != 100 {
		t.Fatalf("after a promotion: %+v", g.History)
	}
	if _, err := apply(t, f, &FixEpochStart{Group: "g", Epoch: 2, Master: "a", Start: 90}); !errors.Is(err, protocol.ErrConflict) {
		t.Fatalf("the old master fixed the new epoch's start: %v", err)
	}
	if _, err := apply(t, f, &FixEpochStart{Group: "g", Epoch: 1, Master: "a", Start: 90}); !errors.Is(err, protocol.ErrConflict) {
		t.Fatalf("a past epoch's start was fixed: %v", err)
	}
	// The new master lost part of what it reported (say its page cache):
	// its real start is lower, and that is what must be cut by.
	if res := mustApply(t, f, &FixEpochStart{Group: "g", Epoch: 2, Master: "b", Start: 90}); !res.Changed {
		t.Fatal("the first word of the epoch's master changed nothing")
	}
	g, _ = f.Group("g")
	if !g.History[1].Fixed || g.History[1].Start != 90 {
		t.Fatalf("fixed: %+v", g.History)
	}
	if res := mustApply(t, f, &FixEpochStart{Group: "g", Epoch: 2, Master: "b", Start: 90}); res.Changed {
		t.Fatal("the same start again changed the group")
	}
	// A restart that reported its log end now (the old bug) is refused.
	if _, err := apply(t, f, &FixEpochStart{Group: "g", Epoch: 2, Master: "b", Start: 400}); !errors.Is(err, protocol.ErrConflict) {
		t.Fatalf("a fixed start moved: %v", err)
	}
	if res := mustApply(t, f, &SetEpochStart{Group: "g", Epoch: 2, Start: 400}); res.Changed {
		t.Fatal("an earlier metaserver's SetEpochStart moved a fixed start")
	}
	if g, _ := f.Group("g"); g.History[1].Start != 90 {
		t.Fatalf("history %+v", g.History)
	}
	if _, err := apply(t, f, &FixEpochStart{Group: "g", Epoch: 2, Master: "b", Start: -1}); err == nil {
		t.Fatal("a negative start was taken")
	}
}

// TruncationPoint: the lowest start after the last epoch a log holds,
// pending while the current epoch's start is not fixed.
func TestTruncationPoint(t *testing.T) {
	f := promoted(t)
	g, _ := f.Group("g")
	if _, _, err := g.TruncationPoint(1); !errors.Is(err, routing.ErrStartPending) {
		t.Fatalf("an unconfirmed start gave a cut point: %v", err)
	}
	if off, cut, err := g.TruncationPoint(2); err != nil || cut || off != 0 {
		t.Fatalf("a member of the current epoch cuts: %d %v %v", off, cut, err)
	}
	mustApply(t, f, &FixEpochStart{Group: "g", Epoch: 2, Master: "b", Start: 120})
	mustApply(t, f, &RegisterBroker{Group: "g", Role: routing.RoleSlave, Broker: routing.Broker{ID: "a", Addr: "a:1"}, At: 3})
	// b's log lost its tail before it took over again (a power loss): epoch
	// 3 starts lower than epoch 2, and a log of epoch 1 cuts at the lower.
	mustApply(t, f, &Promote{Group: "g", Epoch: 2, Master: "b", Slave: "a", Start: 110, At: 4})
	mustApply(t, f, &FixEpochStart{Group: "g", Epoch: 3, Master: "a", Start: 110})
	g, _ = f.Group("g")
	for led, want := range map[uint32]int64{1: 110, 2: 110} {
		if off, cut, err := g.TruncationPoint(led); err != nil || !cut || off != want {
			t.Fatalf("led %d: cut at %d (%v, %v), want %d", led, off, cut, err, want)
		}
	}
}

// A resync order names a slave, never the master; the slave's report that
// it carried it out clears it; the order and the count survive a snapshot.
func TestResyncOrders(t *testing.T) {
	f := promoted(t)
	if _, err := apply(t, f, &ResyncBroker{Group: "g", Broker: "b", At: 5}); !errors.Is(err, protocol.ErrConflict) {
		t.Fatalf("the master was ordered to resync: %v", err)
	}
	if _, err := apply(t, f, &ResyncBroker{Group: "g", Broker: "nobody", At: 5}); !errors.Is(err, protocol.ErrNotFound) {
		t.Fatalf("a stranger was ordered to resync: %v", err)
	}
	mustApply(t, f, &RegisterBroker{Group: "g", Role: routing.RoleSlave, Broker: routing.Broker{ID: "a", Addr: "a:1"}, At: 3})
	mustApply(t, f, &ResyncBroker{Group: "g", Broker: "a", At: 5})
	g, _ := f.Group("g")
	if g.Resync == nil || *g.Resync != (routing.ResyncOrder{Broker: "a", Seq: 1, At: 5}) {
		t.Fatalf("order %+v", g.Resync)
	}
	r := restored(t, f)
	if !reflect.DeepEqual(r.State(), f.State()) {
		t.Fatalf("restored %+v, want %+v", r.State(), f.State())
	}
	if res := mustApply(t, f, &ResyncDone{Group: "g", Broker: "a", Seq: 7}); res.Changed {
		t.Fatal("a report of another order cleared this one")
	}
	mustApply(t, f, &ResyncDone{Group: "g", Broker: "a", Seq: 1})
	g, _ = f.Group("g")
	if g.Resync != nil || g.LastResync != 1 || g.ResyncSeq() != 1 {
		t.Fatalf("after done: %+v last %d", g.Resync, g.LastResync)
	}
	mustApply(t, f, &ResyncBroker{Group: "g", Broker: "a", At: 6})
	if g, _ := f.Group("g"); g.Resync.Seq != 2 {
		t.Fatalf("the next order: %+v", g.Resync)
	}
}
