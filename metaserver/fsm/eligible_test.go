package fsm

import (
	"slices"
	"testing"

	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// Members that leave the sync set while it falls below the group's minimum
// become eligible (the master answers no HIGH message below it, so they
// hold every one it answered); those leaving while it stays at the minimum
// do not. Eligible members stay promotable, a member back in the set is no
// longer listed, the set back at the minimum (or a policy it meets) clears
// the list, and a removed or promoted broker leaves it.
func TestEligibleMembers(t *testing.T) {
	f := three(t)
	mustApply(t, f, &SetGroupPolicy{Group: "g1", MinInSync: 3, At: 2})
	if err := alter(t, f, "s1", "s2"); err != nil {
		t.Fatal(err)
	}
	if g := group(t, f, "g1"); len(g.Eligible) != 0 || !g.HighAllowed() {
		t.Fatalf("a full set: %+v", g)
	}
	if err := alter(t, f, "s1"); err != nil { // two copies: below three
		t.Fatal(err)
	}
	g := group(t, f, "g1")
	if !slices.Equal(g.Eligible, []string{"s2"}) || g.HighAllowed() || !g.Promotable("s2") || !g.Promotable("s1") {
		t.Fatalf("s2 left a set falling below the minimum: %+v", g)
	}
	if err := alter(t, f); err != nil {
		t.Fatal(err)
	}
	if g = group(t, f, "g1"); !slices.Equal(g.Eligible, []string{"s2", "s1"}) || !g.Promotable("s1") {
		t.Fatalf("s1 left too: %+v", g)
	}
	if err := alter(t, f, "s2"); err != nil {
		t.Fatal(err)
	}
	if g = group(t, f, "g1"); !slices.Equal(g.Eligible, []string{"s1"}) {
		t.Fatalf("s2 is back in the set: %+v", g)
	}
	mustApply(t, f, &SetGroupPolicy{Group: "g1", MinInSync: 2, At: 4}) // the set of one meets two copies
	if g = group(t, f, "g1"); len(g.Eligible) != 0 || g.Promotable("s1") {
		t.Fatalf("a policy the set meets: %+v", g)
	}

	// At the minimum, a member leaving is not eligible.
	f = three(t)
	if err := alter(t, f, "s1", "s2"); err != nil {
		t.Fatal(err)
	}
	if err := alter(t, f, "s1"); err != nil {
		t.Fatal(err)
	}
	if g = group(t, f, "g1"); len(g.Eligible) != 0 || g.Promotable("s2") {
		t.Fatalf("s2 left a set that kept its minimum: %+v", g)
	}
	if err := alter(t, f); err != nil { // below two: s1 eligible
		t.Fatal(err)
	}
	mustApply(t, f, &RemoveGroupBroker{Group: "g1", Broker: "s1", At: 5})
	if g = group(t, f, "g1"); len(g.Eligible) != 0 {
		t.Fatalf("a removed slave stays eligible: %+v", g)
	}
}

// A newcomer preferring to be a slave, in a group that has a slave and no
// master yet (its master starts last), joins as one more slave when the
// leader stamps MoreSlaves, and the master's place waits for its master;
// an entry without the stamp (written before groups had several slaves)
// replays as it was applied: the newcomer took the master's place.
func TestSlaveNewcomerWaitsForTheMaster(t *testing.T) {
	for _, more := range []bool{true, false} {
		f := New()
		mustApply(t, f, &RegisterBroker{Group: "g1", Role: routing.RoleSlave, Broker: broker("s2"), At: 1, MoreSlaves: more})
		mustApply(t, f, &RegisterBroker{Group: "g1", Role: routing.RoleSlave, Broker: broker("s1"), At: 1, MoreSlaves: more})
		g := group(t, f, "g1")
		if more {
			if g.Master.ID != "" || !slices.Equal(ids(g.Slaves), []string{"s2", "s1"}) || g.Epoch != 0 {
				t.Fatalf("with MoreSlaves: master %q, slaves %v, epoch %d", g.Master.ID, ids(g.Slaves), g.Epoch)
			}
			mustApply(t, f, &RegisterBroker{Group: "g1", Role: routing.RoleMaster, Broker: broker("m"), At: 2, MoreSlaves: true})
			if g = group(t, f, "g1"); g.Master.ID != "m" || g.Epoch != 1 {
				t.Fatalf("the master registering last: %+v", g)
			}
		} else if g.Master.ID != "s1" || !slices.Equal(ids(g.Slaves), []string{"s2"}) {
			t.Fatalf("without MoreSlaves: master %q, slaves %v", g.Master.ID, ids(g.Slaves))
		}
	}
}

// Under an ack quorum a member leaving the set is not eligible (it need
// not hold every message answered), and an operator cannot remove a member
// (the failover's count of members to hear from assumes it is there); one
// outside the set can be removed.
func TestQuorumKeepsItsMembers(t *testing.T) {
	f := three(t)
	mustApply(t, f, &SetGroupPolicy{Group: "g1", MinInSync: 3, AckQuorum: 2, At: 2})
	if err := alter(t, f, "s1", "s2"); err != nil {
		t.Fatal(err)
	}
	_, err := apply(t, f, &RemoveGroupBroker{Group: "g1", Broker: "s2", At: 3})
	wantErr(t, err, protocol.StatusConflict, "removing a member under a quorum")
	if err := alter(t, f, "s1"); err != nil { // below three copies
		t.Fatal(err)
	}
	g := group(t, f, "g1")
	if len(g.Eligible) != 0 || g.Promotable("s2") {
		t.Fatalf("a member leaving under a quorum became eligible: %+v", g)
	}
	mustApply(t, f, &RemoveGroupBroker{Group: "g1", Broker: "s2", At: 4})
}

// A set that formed and is empty now (its only member was promoted)
// promotes nobody until the new master adds a member: the old epoch's HIGH
// messages were on that member alone. A group whose set never formed
// promotes any slave, as before sets.
func TestPromotedOnlyMemberLeavesNobodyPromotable(t *testing.T) {
	f := three(t)
	if g := group(t, f, "g1"); !g.Promotable("s1") || !g.Promotable("s2") {
		t.Fatalf("a set that never formed: %+v", g)
	}
	if err := alter(t, f, "s1"); err != nil {
		t.Fatal(err)
	}
	g := group(t, f, "g1")
	mustApply(t, f, &Promote{Group: "g1", Epoch: g.Epoch, Master: "m", Slave: "s1", Start: 10, At: 5})
	if g = group(t, f, "g1"); g.Promotable("s2") || len(g.InSync) != 0 {
		t.Fatalf("after promoting the set's only member: %+v", g)
	}
}
