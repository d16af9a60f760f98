package broker

import (
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/storage"
)

// filterHarness is a log and its long polls, stepped by hand.
type filterHarness struct {
	log   *storage.Log
	lp    *longPoll
	clock *clockwork.FakeClock
	limit int64 // the readable end (-1: none)
	msgs  []protocol.Message
	pos   []storage.Position
}

func newFilterHarness(t *testing.T) *filterHarness {
	h := &filterHarness{log: openLog(t), clock: clockwork.NewFakeClock(), limit: -1}
	h.lp = newLongPoll(pullStore{Log: h.log, epoch: func() uint32 { return 1 }, readable: func() int64 { return h.limit }},
		h.clock, &Stats{}, hclog.NewNullLogger())
	return h
}

// add appends messages of the given tags to queue 0 of "t" (property
// "n" is the message's number) and wakes the long polls.
func (h *filterHarness) add(t *testing.T, tags ...string) {
	t.Helper()
	var entries []storage.Entry
	var msgs []protocol.Message
	for _, tag := range tags {
		m := protocol.Message{ID: fmt.Sprint(len(h.msgs) + len(msgs)), Topic: "t", Tag: tag, Body: []byte("body"),
			Properties: []protocol.Property{{Key: "n", Value: fmt.Sprint(len(h.msgs) + len(msgs))}}}
		msgs = append(msgs, m)
		entries = append(entries, storage.Entry{Topic: "t", Payload: protocol.AppendMessage(nil, &m)})
	}
	pos, err := h.log.Append(entries, false)
	if err != nil {
		t.Fatal(err)
	}
	good := make([]int, len(msgs))
	for i := range good {
		good[i] = i
	}
	h.msgs, h.pos = append(h.msgs, msgs...), append(h.pos, pos...)
	h.lp.appended(msgs, good, pos)
}

func (h *filterHarness) pull(offset int64, maxBytes, wait uint32, filter string) chanReplier {
	rep := make(chanReplier, 1)
	handlePull(h.lp.store, func(uint32) bool { return false }, h.lp, rep,
		protocol.PullRequest{Topic: "t", Offset: offset, MaxBytes: maxBytes, WaitMillis: wait, Filter: filter})
	return rep
}

// TestPullFilter: a PULL with a filter gets exactly the messages it takes,
// in order, whether judged by the index's fingerprints alone, by the
// filter on the candidates, or by properties; its next offset passes the
// skipped messages at the end, so that small reads cover the queue; a
// slave's skipping stops at its readable end; a filter that does not
// parse is INVALID.
func TestPullFilter(t *testing.T) {
	h := newFilterHarness(t)
	tags := []string{"A", "B", "C", "", "D", "E", "A:x", "B"}
	var all []string
	for i := range 400 {
		all = append(all, tags[i*7%len(tags)])
	}
	h.add(t, all...)
	for _, expr := range []string{"A || B", "A", "NOT A", "n < 10 OR C", "*", "Z", "(A || B) AND n >= 200"} {
		f, err := protocol.ParseFilter(expr)
		if err != nil {
			t.Fatal(err)
		}
		var want []int64
		for i := range h.msgs {
			if f.MatchEncoded(protocol.AppendMessage(nil, &h.msgs[i])) {
				want = append(want, int64(i))
			}
		}
		for _, maxBytes := range []uint32{1, 300, 1 << 20} {
			var got []int64
			offset, pulls := int64(0), 0
			for offset < int64(len(h.msgs)) {
				r := answer(t, h.pull(offset, maxBytes, 0, expr))
				if r.NextOffset <= offset || r.MaxOffset != int64(len(h.msgs)) {
					t.Fatalf("%q from %d: next %d, end %d", expr, offset, r.NextOffset, r.MaxOffset)
				}
				for _, m := range r.Messages {
					got = append(got, m.QueueOffset)
				}
				offset = r.NextOffset
				pulls++
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("%q, %d bytes a PULL: offsets %v, want %v", expr, maxBytes, got, want)
			}
			if maxBytes == 1<<20 && pulls != 1 {
				t.Fatalf("%q: %d PULLs of 1 MiB to pass 400 small messages", expr, pulls)
			}
		}
	}

	// A slave skips no further than its readable end.
	h.limit = h.pos[99].End
	r := answer(t, h.pull(0, 1<<20, 0, "Z"))
	if len(r.Messages) != 0 || r.NextOffset != 100 || r.MaxOffset != 100 {
		t.Fatalf("a slave with 100 readable: %d messages, next %d, end %d", len(r.Messages), r.NextOffset, r.MaxOffset)
	}
	h.limit = -1

	rep := h.pull(0, 0, 0, "A ||")
	if a := <-rep; a.err == nil || a.err.(*protocol.Error).Status != protocol.StatusInvalid {
		t.Fatalf("a filter that does not parse: %v", a.err)
	}
}

// TestParkedPullFilter: a filtered PULL that finds nothing it takes up to
// the queue's end waits there; messages its filter does not take leave it
// waiting (past them); the first that matches is its answer; at its
// deadline it is answered empty with its offset past what it skipped.
func TestParkedPullFilter(t *testing.T) {
	h := newFilterHarness(t)
	h.add(t, "B", "C", "A")
	first := answer(t, h.pull(0, 1<<20, 1000, "A"))
	if len(first.Messages) != 1 || first.Messages[0].QueueOffset != 2 || first.NextOffset != 3 {
		t.Fatalf("a PULL with a match behind others: %+v", first)
	}
	h.add(t, "B", "C")
	parked := h.pull(3, 1<<20, 1000, "A")
	if !h.lp.waiting() || len(parked) != 0 {
		t.Fatal("a PULL with nothing it takes up to the end was answered, not parked")
	}
	h.add(t, "B")
	h.lp.step(h.clock.Now())
	if !h.lp.waiting() || len(parked) != 0 {
		t.Fatal("a message the filter does not take answered the parked PULL")
	}
	h.add(t, "C", "A", "B")
	h.lp.step(h.clock.Now())
	r := answer(t, parked)
	if len(r.Messages) != 1 || r.Messages[0].QueueOffset != 7 || r.NextOffset != 9 {
		t.Fatalf("the parked PULL's answer: %d messages (first %+v), next %d; want offset 7, next 9", len(r.Messages), r.Messages, r.NextOffset)
	}
	if h.lp.waiting() {
		t.Fatal("the answered PULL is still parked")
	}

	expiring := h.pull(9, 1<<20, 1000, "A")
	h.add(t, "B", "B")
	h.lp.step(h.clock.Now())
	h.clock.Advance(1001 * time.Millisecond)
	h.lp.step(h.clock.Now())
	if r := answer(t, expiring); len(r.Messages) != 0 || r.NextOffset != 11 {
		t.Fatalf("at its deadline: %d messages, next %d; want none, next 11", len(r.Messages), r.NextOffset)
	}
}
