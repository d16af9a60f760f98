package broker_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/protocol"

	tc "github.com/ferrymq/ferrymq/internal/testcluster"
)

// TestDelayedOriginOfAFirstRecordIgnored: a first pending record (no move
// behind it) can carry a %delayed-origin property that names no move of
// it: a consumer's retry copies its message's properties into a new
// delayed message, a recovered tail's move is stored pending as itself,
// or a producer sets it. Its released copy names no origin (a consumer's
// DelayedHandle is then the record's own), and its move names the record
// it moves, not that property: else the property's offset, when it is
// another message's in the same bucket, finds the wrong message through
// that message's handle after retention.
func TestDelayedOriginOfAFirstRecordIgnored(t *testing.T) {
	g, c := retentionGroup(t)

	// Released without a move: its copy names no origin.
	soon := delayedMsg("later", 0, protocol.Normal, "soon", time.Now().Add(100*time.Millisecond))
	soon.Properties = []protocol.Property{{Key: protocol.DelayedOriginProperty, Value: "7"}}
	if r := tc.Send(t, c, []protocol.Message{soon}); r[0].Status != protocol.StatusOK {
		t.Fatalf("send: %v", r[0].Status)
	}
	testwait.For(t, 10*time.Second, "the message to be released", func() bool { return len(released(t, c, "later", 0)) == 1 })
	if got := released(t, c, "later", 0); protocol.DelayedOrigin(&got[0].Message) >= 0 {
		t.Fatalf("the released copy of a record never moved names origin %d: %+v", protocol.DelayedOrigin(&got[0].Message), got[0].Message.Properties)
	}

	// Moved: the victim's handle finds the victim, not the message whose
	// property names the victim's record.
	due := time.Now().Add(time.Hour)
	victim := delayedMsg("later", 0, protocol.Normal, "victim", due)
	vr := tc.Send(t, c, []protocol.Message{victim})
	if vr[0].Status != protocol.StatusOK {
		t.Fatal(vr[0].Status)
	}
	other := delayedMsg("later", 0, protocol.Normal, "other", due)
	other.Properties = []protocol.Property{{Key: protocol.DelayedOriginProperty, Value: strconv.FormatInt(vr[0].LogOffset, 10)}}
	or := tc.Send(t, c, []protocol.Message{other})
	if or[0].Status != protocol.StatusOK {
		t.Fatal(or[0].Status)
	}
	retainPast(t, g, c, or[0].LogOffset)
	var st protocol.DelayedState
	if err := callDelayed(t, c, protocol.CodeDelayedState, protocol.DelayedRef{Offset: vr[0].LogOffset, DueAt: victim.Schedule.At}, &st); err != nil ||
		st.ID != victim.ID || st.State != protocol.DelayPending {
		t.Fatalf("the victim's state through its first handle: %+v %v, want %s pending", st, err, victim.ID)
	}
}
