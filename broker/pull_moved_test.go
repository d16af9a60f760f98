package broker

import (
	"errors"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/protocol"
)

// A PULL past offset 0 of a queue the log holds nothing of, while the
// route cache does not count the queue as this group's, is answered
// NO_ROUTE: its reader read the queue at a group it moved off (or at
// another broker), and an empty answer would send it back to offset 0.
// Once the route cache took the queue up at its base, the PULL is served
// from there; a PULL from offset 0, or of a queue routed here that never
// moved, is served as before.
func TestPullOfAQueueNotYetTakenUp(t *testing.T) {
	log := openLog(t)
	routed := map[string]bool{}
	lp := newLongPoll(pullStore{Log: log, epoch: func() uint32 { return 1 },
		routed: func(topic string, q uint32) bool { return routed[topic] }}, clockwork.NewFakeClock(), &Stats{}, hclog.NewNullLogger())
	pull := func(topic string, offset int64) (protocol.PullResponse, error) {
		rep := make(chanReplier, 1)
		handlePull(lp.store, func(uint32) bool { return false }, nil, rep, protocol.PullRequest{Topic: topic, Offset: offset})
		select {
		case a := <-rep:
			if a.err != nil {
				return protocol.PullResponse{}, a.err
			}
			return protocol.DecodePullResponse(a.body)
		case <-time.After(5 * time.Second):
			t.Fatal("no answer")
			return protocol.PullResponse{}, nil
		}
	}
	if _, err := pull("moved", 40); !errors.Is(err, protocol.ErrNoRoute) {
		t.Fatalf("a reader at 40 of a queue not taken up: %v", err)
	}
	if r, err := pull("moved", 0); err != nil || r.MaxOffset != 0 {
		t.Fatalf("a reader at 0: %+v, %v", r, err)
	}
	routed["here"] = true
	if r, err := pull("here", 40); err != nil || r.MaxOffset != 0 {
		t.Fatalf("a queue routed here with nothing in it: %+v, %v", r, err)
	}
	if err := log.SetQueueBase("moved", 0, 100); err != nil {
		t.Fatal(err)
	}
	r, err := pull("moved", 40)
	if err != nil || r.MinOffset != 100 || r.MaxOffset != 100 || r.NextOffset != 100 {
		t.Fatalf("a reader at 40 once the queue is taken up at 100: %+v, %v", r, err)
	}
}
