package broker

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/protocol"
)

// sequenced is a fetch of the pair's slave numbered seq: from offset, or
// following fetch after when follows is set.
func sequenced(offset int64, seq, after uint32, follows bool, maxBytes uint32) []byte {
	return protocol.AppendHAFetchRequest(nil, &protocol.HAFetchRequest{Offset: offset, Acked: offset, MaxBytes: maxBytes, WaitMillis: 50,
		Epoch: testEpoch, BrokerID: testSlave, Sequenced: true, Seq: seq, After: after, Follows: follows})
}

func answerOf(t *testing.T, rep chanReplier) protocol.HAFetchResponse {
	t.Helper()
	var a reply
	select {
	case a = <-rep:
	case <-time.After(5 * time.Second):
		t.Fatal("no answer")
	}
	if a.err != nil {
		t.Fatal(a.err)
	}
	resp, err := protocol.DecodeHAFetchResponseSequenced(a.body)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// A fetch that follows another is answered from where the master's answer
// to that one ended, whichever of the two the master handled first: the
// second fetch waits at the master, and goes out as soon as the first is
// answered and there are bytes. Each answer says where it starts.
func TestFetchThatFollowsStartsWhereTheAnswerBeforeEnded(t *testing.T) {
	p := newReplPair(t)
	pos := p.append(t, 3)
	first := uint32(pos[0].End) // room for the first record only

	second := make(chanReplier, 1)
	p.repl.handleFetch(second, sequenced(0, 8, 7, true, 1<<20)) // arrives first
	expectNoAnswer(t, second, "a fetch that follows one the master has not answered")

	one := make(chanReplier, 1)
	p.repl.handleFetch(one, sequenced(0, 7, 0, false, first))
	a := answerOf(t, one)
	if a.Start != 0 || int64(len(a.Records)) != pos[0].End {
		t.Fatalf("the first answer starts at %d with %d bytes, want 0 and %d", a.Start, len(a.Records), pos[0].End)
	}
	p.repl.step(context.Background())
	b := answerOf(t, second)
	if b.Start != pos[0].End || b.Start+int64(len(b.Records)) != pos[2].End {
		t.Fatalf("the second answer holds [%d, %d), want [%d, %d)", b.Start, b.Start+int64(len(b.Records)), pos[0].End, pos[2].End)
	}
	raw := rawLog(t, p.master)
	if !bytes.Equal(append(append([]byte(nil), a.Records...), b.Records...), raw) {
		t.Fatal("the two answers are not the master's log")
	}

	// The next one, sent once the second answer arrived, waits for new bytes.
	third := make(chanReplier, 1)
	p.repl.handleFetch(third, sequenced(pos[2].End, 9, 8, true, 1<<20))
	expectNoAnswer(t, third, "a fetch at the master's end")
	more := p.append(t, 1)
	p.repl.step(context.Background())
	if c := answerOf(t, third); c.Start != pos[2].End || c.Start+int64(len(c.Records)) != more[0].End {
		t.Fatalf("the third answer holds [%d, %d), want [%d, %d)", c.Start, c.Start+int64(len(c.Records)), pos[2].End, more[0].End)
	}
}

// A fetch that follows one the master never answers (it failed, or never
// came) is refused once its wait and a grace period have passed; and since
// it was sent ahead, an acknowledgement past its offset does not make the
// slave look as if it lost bytes.
func TestFetchThatFollowsAnUnansweredOneIsRefused(t *testing.T) {
	p := newReplPair(t)
	pos := p.append(t, 2)
	if err := (memLink{p.repl}).Ack(context.Background(), protocol.HAAck{Acked: pos[1].End, Epoch: testEpoch, BrokerID: testSlave}); err != nil {
		t.Fatal(err)
	}
	rep := make(chanReplier, 1)
	p.repl.handleFetch(rep, sequenced(pos[0].End, 5, 4, true, 1<<20))
	p.clock.Advance(50*time.Millisecond + followGrace - time.Millisecond)
	p.repl.step(context.Background())
	expectNoAnswer(t, rep, "within the grace period")
	p.clock.Advance(2 * time.Millisecond)
	p.repl.step(context.Background())
	if a := <-rep; !errors.Is(a.err, protocol.ErrInvalid) {
		t.Fatalf("a fetch following an unanswered one: %v, want INVALID", a.err)
	}
	if s := p.repl.state(); s.AckOffset != pos[1].End || !s.InSync || p.repl.refusesHigh() {
		t.Fatalf("the slave after a fetch sent ahead of its ack: %+v", s)
	}
}

func expectNoAnswer(t *testing.T, rep chanReplier, what string) {
	t.Helper()
	select {
	case a := <-rep:
		t.Fatalf("%s was answered: %+v", what, a)
	default:
	}
}

// oldMaster is a master from before sequenced fetches: it refuses them as
// malformed, as its decoder did.
type oldMaster struct {
	memLink
	refused atomic.Int64
}

func (l *oldMaster) Fetch(ctx context.Context, req protocol.HAFetchRequest) (protocol.HAFetchResponse, func(), error) {
	if req.Sequenced {
		l.refused.Add(1)
		return protocol.HAFetchResponse{}, func() {}, &protocol.Error{Status: protocol.StatusInvalid, Message: "ha fetch request: trailing bytes"}
	}
	return l.memLink.Fetch(ctx, req)
}

// copied waits until the slave's log ends at end, moving the clock past the
// follower's backoffs, and checks that it is the master's byte for byte.
func (p *replPair) copied(t *testing.T, end int64) {
	t.Helper()
	testwait.For(t, 5*time.Second, "the slave to copy the log", func() bool {
		p.clock.Advance(100 * time.Millisecond) // past the follower's backoff
		return p.slave.EndOffset() == end
	})
	if !bytes.Equal(rawLog(t, p.slave), rawLog(t, p.master)) {
		t.Fatal("the slave's log is not the master's")
	}
}

// A slave whose master refuses sequenced fetches fetches one at a time.
func TestFollowerFallsBackToOneFetchAtATime(t *testing.T) {
	p := newReplPair(t)
	p.run(t, false)
	link := &oldMaster{memLink: memLink{p.repl}}
	p.follow(t, p.slave, testEpoch, link)
	pos := p.append(t, 5)
	p.copied(t, pos[4].End)
	if n := link.refused.Load(); n != 2 {
		t.Fatalf("%d sequenced fetches refused, want the first stream's two (then one at a time)", n)
	}
}

// shiftedLink moves the start of one answer: the slave, whose received end
// it no longer is, stops its stream and starts again from its log end.
type shiftedLink struct {
	memLink
	left    atomic.Int64 // answers still to shift
	streams atomic.Int64 // fetches that start a stream
}

func (l *shiftedLink) Fetch(ctx context.Context, req protocol.HAFetchRequest) (protocol.HAFetchResponse, func(), error) {
	if !req.Follows {
		l.streams.Add(1)
	}
	resp, release, err := l.memLink.Fetch(ctx, req)
	if err == nil && len(resp.Records) > 0 && l.left.Add(-1) >= 0 {
		resp.Start++
	}
	return resp, release, err
}

func TestFollowerRestartsOnAGap(t *testing.T) {
	p := newReplPair(t)
	p.run(t, false)
	link := &shiftedLink{memLink: memLink{p.repl}}
	link.left.Store(1)
	p.follow(t, p.slave, testEpoch, link)
	pos := p.append(t, 5)
	p.copied(t, pos[4].End)
	if link.left.Load() >= 0 || link.streams.Load() < 2 {
		t.Fatalf("%d answers left to shift, %d streams: the slave took an answer that did not start at its received end",
			link.left.Load(), link.streams.Load())
	}
}
