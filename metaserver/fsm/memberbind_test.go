package fsm

import (
	"errors"
	"reflect"
	"testing"

	"github.com/ferrymq/ferrymq/protocol"
)

// TestMemberBinding: at apply, every command that acts as a member names
// the principal asking, and one naming another principal than the one that
// joined the member is refused NOT_AUTHORIZED with nothing changed (the
// leader's check before it proposes can race a join); a command naming no
// principal (authorization off, the leader's expiries) is not checked; a
// member joined with none is bound by its next join that names one; a
// snapshot keeps the binding.
func TestMemberBinding(t *testing.T) {
	f := consumerSeeded(t)
	mustApply(t, f, &JoinGroup{Group: "cg", Member: "a", Topics: []string{"orders"}, At: 1, Principal: "alice"})
	mustApply(t, f, &JoinMember{Group: "coop", Member: "a", Incarnation: 1, Topics: []string{"orders"}, At: 1, Principal: "alice"})
	g := cgroup(t, f, "cg")
	own := g.Queues("a")
	for i := range own {
		own[i].Offset = 9
	}
	before := f.State()
	notAuthorized := func(what string, c Command) {
		t.Helper()
		var pe *protocol.Error
		if _, err := apply(t, f, c); !errors.As(err, &pe) || pe.Status != protocol.StatusNotAuthorized {
			t.Fatalf("%s by another principal: %v, want NOT_AUTHORIZED", what, err)
		}
	}
	notAuthorized("JoinGroup", &JoinGroup{Group: "cg", Member: "a", Topics: []string{"orders", "events"}, At: 2, Principal: "mallory"})
	notAuthorized("LeaveGroup", &LeaveGroup{Group: "cg", Member: "a", At: 2, Principal: "mallory"})
	notAuthorized("CommitOffsets", &CommitOffsets{Group: "cg", Member: "a", Generation: g.Generation, Offsets: own, Principal: "mallory"})
	notAuthorized("JoinMember", &JoinMember{Group: "coop", Member: "a", Incarnation: 2, Topics: []string{"orders"}, At: 2, Principal: "mallory"})
	notAuthorized("LeaveMember", &LeaveMember{Group: "coop", Member: "a", At: 2, Principal: "mallory"})
	notAuthorized("ReleaseQueues", &ReleaseQueues{Group: "coop", Member: "a", Incarnation: 1, Principal: "mallory"})
	notAuthorized("CommitHeld", &CommitHeld{Group: "coop", Member: "a", Incarnation: 1, Offsets: own, Principal: "mallory"})
	if got := f.State(); !reflect.DeepEqual(got, before) {
		t.Fatalf("refused commands changed the registry:\n got %+v\nwant %+v", got.ConsumerGroups, before.ConsumerGroups)
	}
	if r := restored(t, f); cgroup(t, r, "cg").Members["a"].Principal != "alice" {
		t.Fatalf("a restored registry lost the binding: %+v", cgroup(t, r, "cg").Members["a"])
	}

	// The member's own principal, and no principal (the leader), act.
	mustApply(t, f, &CommitOffsets{Group: "cg", Member: "a", Generation: g.Generation, Offsets: own, Principal: "alice"})
	mustApply(t, f, &LeaveGroup{Group: "cg", Member: "a", At: 3})
	// An unbound member (joined with authorization off) is bound by a join
	// naming a principal.
	mustApply(t, f, &JoinGroup{Group: "cg", Member: "b", Topics: []string{"orders"}, At: 4})
	mustApply(t, f, &JoinGroup{Group: "cg", Member: "b", Topics: []string{"orders"}, At: 5, Principal: "bob"})
	if p := cgroup(t, f, "cg").Members["b"].Principal; p != "bob" {
		t.Fatalf("an unbound member joined again by bob is bound to %q", p)
	}
	notAuthorized("LeaveGroup of the newly bound member", &LeaveGroup{Group: "cg", Member: "b", At: 6, Principal: "alice"})
}
