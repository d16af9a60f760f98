package broker

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/storage"
)

// A slave serves reads only up to what every member of the sync set held
// at the master's last report: a message past it is neither returned nor
// counted in the queue's end, a long poll at the limit waits as at the end
// of the queue, and once the limit moves the message is served. Without a
// limit (a master) everything is.
func TestSlaveReadsStopAtTheSetsEnd(t *testing.T) {
	log := openLog(t)
	var limit atomic.Int64
	limit.Store(-1)
	clock := clockwork.NewFakeClock()
	lp := newLongPoll(pullStore{Log: log, epoch: func() uint32 { return 1 }, readable: limit.Load}, clock, &Stats{}, hclog.NewNullLogger())
	var pos []storage.Position
	for i := range 4 {
		m := protocol.Message{Topic: "t", Body: []byte{byte('a' + i)}}
		p, err := log.Append([]storage.Entry{{Topic: "t", Queue: 0, Payload: protocol.AppendMessage(nil, &m)}}, false)
		if err != nil {
			t.Fatal(err)
		}
		pos = append(pos, p...)
	}
	pull := func(offset int64, wait uint32) chanReplier {
		rep := make(chanReplier, 1)
		handlePull(lp.store, func(uint32) bool { return false }, lp, rep, protocol.PullRequest{Topic: "t", Offset: offset, WaitMillis: wait})
		return rep
	}
	answer := func(rep chanReplier) protocol.PullResponse {
		t.Helper()
		select {
		case a := <-rep:
			if a.err != nil {
				t.Fatal(a.err)
			}
			r, err := protocol.DecodePullResponse(a.body)
			if err != nil {
				t.Fatal(err)
			}
			return r
		case <-time.After(5 * time.Second):
			t.Fatal("no answer")
			return protocol.PullResponse{}
		}
	}
	if r := answer(pull(0, 0)); len(r.Messages) != 4 || r.MaxOffset != 4 {
		t.Fatalf("no limit: %d messages, end %d", len(r.Messages), r.MaxOffset)
	}
	limit.Store(pos[1].End) // the set holds the first two
	if r := answer(pull(0, 0)); len(r.Messages) != 2 || r.NextOffset != 2 || r.MaxOffset != 2 {
		t.Fatalf("limit after two: %d messages, next %d, end %d", len(r.Messages), r.NextOffset, r.MaxOffset)
	}
	parked := pull(2, 1000)
	if !lp.waiting() {
		t.Fatal("a PULL at the limit was not parked")
	}
	lp.appendedAny() // the follower appended: the limit has not moved, the PULL stays
	lp.step(clock.Now())
	if !lp.waiting() || len(parked) != 0 {
		t.Fatal("a PULL at the limit was answered though nothing became readable")
	}
	limit.Store(pos[3].End)
	lp.appendedAny()
	lp.step(clock.Now())
	if r := answer(parked); len(r.Messages) != 2 || r.Messages[0].QueueOffset != 2 {
		t.Fatalf("after the limit moved: %+v", r)
	}
}
