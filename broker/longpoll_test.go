package broker

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/storage"
)

// Long-polling PULL over a real commit log, with the sender's and the
// follower's wake-ups called as they call them, and a fake clock.

type lpHarness struct {
	log    *storage.Log
	lp     *longPoll
	stats  *Stats
	clock  *clockwork.FakeClock
	cancel context.CancelFunc
	done   chan struct{}
}

func newLPHarness(t *testing.T, log *storage.Log) *lpHarness {
	t.Helper()
	if log == nil {
		log = openLog(t)
	}
	h := &lpHarness{log: log, stats: &Stats{}, clock: clockwork.NewFakeClock(), done: make(chan struct{})}
	h.lp = newLongPoll(pullStore{Log: log, epoch: func() uint32 { return 0 }}, h.clock, h.stats, hclog.NewNullLogger())
	var ctx context.Context
	ctx, h.cancel = context.WithCancel(context.Background())
	go func() {
		defer close(h.done)
		h.lp.run(ctx)
	}()
	t.Cleanup(h.stop)
	return h
}

func (h *lpHarness) stop() {
	h.cancel()
	<-h.done
}

// pull sends a PULL through handlePull and returns where its answer comes.
func (h *lpHarness) pull(topic string, queue uint32, offset int64, waitMillis uint32) chanReplier {
	rep := make(chanReplier, 1)
	handlePull(h.lp.store, func(uint32) bool { return false }, h.lp, rep,
		protocol.PullRequest{Topic: topic, Queue: queue, Offset: offset, WaitMillis: waitMillis})
	return rep
}

// send appends one message per (queue, body) as one group, as the sender
// does, and wakes the long polls as its completion does.
func (h *lpHarness) send(t *testing.T, topic string, queues []uint32, bodies ...string) []storage.Position {
	t.Helper()
	msgs := make([]protocol.Message, len(queues))
	entries := make([]storage.Entry, len(queues))
	good := make([]int, len(queues))
	for i, q := range queues {
		msgs[i] = protocol.Message{ID: fmt.Sprintf("m%d", i), Topic: topic, Queue: q, Timestamp: 1, Body: []byte(bodies[i])}
		entries[i] = storage.Entry{Topic: topic, Queue: q, Payload: protocol.AppendMessage(nil, &msgs[i])}
		good[i] = i
	}
	pos, err := h.log.Append(entries, false)
	if err != nil {
		t.Fatal(err)
	}
	h.lp.appended(msgs, good, pos)
	return pos
}

func (h *lpHarness) waitParked(t *testing.T, n int64) {
	t.Helper()
	testwait.For(t, 5*time.Second, fmt.Sprintf("%d parked PULLs", n), func() bool { return h.stats.PullsParked.Load() == n })
}

// answer waits for a PULL's answer and decodes it.
func answer(t *testing.T, rep chanReplier) protocol.PullResponse {
	t.Helper()
	select {
	case a := <-rep:
		if a.err != nil {
			t.Fatalf("PULL answered %v", a.err)
		}
		pr, err := protocol.DecodePullResponse(a.body)
		if err != nil {
			t.Fatal(err)
		}
		return pr
	case <-time.After(5 * time.Second):
		t.Fatal("the parked PULL was not answered")
		return protocol.PullResponse{}
	}
}

func answered(rep chanReplier) bool { return len(rep) > 0 }

// A PULL at the end of its queue waits for the next message and gets it
// as soon as it is appended, with its store time.
func TestLongPollAnswersWhenAMessageArrives(t *testing.T) {
	h := newLPHarness(t, nil)
	h.send(t, "t", []uint32{0}, "before")
	rep := h.pull("t", 0, 1, 10_000)
	h.waitParked(t, 1)
	if answered(rep) {
		t.Fatal("answered with nothing to return")
	}
	h.send(t, "t", []uint32{0}, "new")
	pr := answer(t, rep)
	if len(pr.Messages) != 1 || string(pr.Messages[0].Message.Body) != "new" || pr.NextOffset != 2 || pr.MaxOffset != 2 {
		t.Fatalf("answer %+v", pr)
	}
	if st := pr.Messages[0].StoreTime; st <= 0 {
		t.Fatalf("store time %d", st)
	}
	if h.stats.PullWakeups.Load() != 1 || h.stats.PullsParked.Load() != 0 {
		t.Fatalf("wake-ups %d, parked %d", h.stats.PullWakeups.Load(), h.stats.PullsParked.Load())
	}
	// A PULL with no wait, or one that finds a message, is answered at once.
	if pr := answer(t, h.pull("t", 0, 2, 0)); len(pr.Messages) != 0 || pr.MaxOffset != 2 {
		t.Fatalf("no-wait answer %+v", pr)
	}
	if pr := answer(t, h.pull("t", 0, 0, 10_000)); len(pr.Messages) != 2 {
		t.Fatalf("answer with data %+v", pr)
	}
}

// A parked PULL is answered empty, with the queue's offsets, when its wait
// passes on the broker's clock, and not before; a wait is capped.
func TestLongPollExpiresOnTheClock(t *testing.T) {
	h := newLPHarness(t, nil)
	h.send(t, "t", []uint32{0, 0, 0}, "a", "b", "c")
	rep := h.pull("t", 0, 3, 2000)
	capped := h.pull("t", 0, 3, 600_000) // ten minutes, held at most maxPullWait
	h.waitParked(t, 2)
	h.clock.Advance(1999 * time.Millisecond)
	if testwait.Until(50*time.Millisecond, func() bool { return answered(rep) }) {
		t.Fatal("answered before its wait passed")
	}
	// The loop may still be arming its timer when the clock moves: move it
	// until the answer comes.
	testwait.For(t, 5*time.Second, "the wait to pass", func() bool {
		h.clock.Advance(time.Millisecond)
		return answered(rep)
	})
	pr := answer(t, rep)
	if len(pr.Messages) != 0 || pr.NextOffset != 3 || pr.MinOffset != 0 || pr.MaxOffset != 3 {
		t.Fatalf("expired answer %+v", pr)
	}
	testwait.For(t, 5*time.Second, "the expiry to be counted", func() bool { return h.stats.PullsExpired.Load() == 1 })
	if answered(capped) {
		t.Fatal("the capped PULL was answered with its first wait")
	}
	h.clock.Advance(maxPullWait - 2*time.Second)
	testwait.For(t, 5*time.Second, "the capped wait to pass", func() bool {
		h.clock.Advance(time.Millisecond)
		return answered(capped)
	})
	if pr := answer(t, capped); len(pr.Messages) != 0 || h.stats.PullsParked.Load() != 0 {
		t.Fatalf("capped answer %+v", pr)
	}
	testwait.For(t, 5*time.Second, "two expiries", func() bool { return h.stats.PullsExpired.Load() == 2 })
}

// Many PULLs parked on many queues: an append wakes only the PULLs of the
// queues that got messages (two PULLs of one queue both), and the others
// stay parked.
func TestLongPollWakesOnlyQueuesThatGotData(t *testing.T) {
	h := newLPHarness(t, nil)
	const queues = 64
	reps := make([]chanReplier, queues)
	for q := range uint32(queues) {
		reps[q] = h.pull("t", q, 0, 60_000)
	}
	second := h.pull("t", 7, 0, 60_000)
	other := h.pull("other-topic", 7, 0, 60_000)
	h.waitParked(t, queues+2)
	h.send(t, "t", []uint32{3, 7, 7, 40}, "q3", "q7a", "q7b", "q40")
	for _, q := range []uint32{3, 7, 40} {
		if pr := answer(t, reps[q]); len(pr.Messages) == 0 || pr.Messages[0].Message.Queue != q {
			t.Fatalf("queue %d: %+v", q, pr)
		}
	}
	if pr := answer(t, second); len(pr.Messages) != 2 {
		t.Fatalf("second PULL of queue 7: %+v", pr)
	}
	// Four wake-ups, and no more (all four are counted before the answers go out).
	testwait.For(t, 5*time.Second, "four wake-ups", func() bool { return h.stats.PullWakeups.Load() == 4 })
	for q, rep := range reps {
		if q != 3 && q != 7 && q != 40 && answered(rep) {
			t.Fatalf("queue %d answered without a message", q)
		}
	}
	if answered(other) || h.stats.PullsParked.Load() != queues-3+1 {
		t.Fatalf("parked %d", h.stats.PullsParked.Load())
	}
}

// On a slave the follower's append wakes the parked PULLs whose queues it
// filled (it marks every parked queue; each is checked against the log).
func TestLongPollOnASlaveWakesWhenTheFollowerCopies(t *testing.T) {
	p := newReplPair(t)
	h := newLPHarness(t, p.slave)
	rep := h.pull("t", 0, 0, 60_000)
	idle := h.pull("t", 1, 0, 60_000)
	h.waitParked(t, 2)
	// The follower appends with the broker's hook.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	go func() { p.repl.run(ctx); done <- struct{}{} }()
	f := &follower{id: testSlave, epoch: testEpoch, addr: "memory", log: p.slave, dial: func(string) masterLink { return memLink{p.repl} },
		fetchBytes: 64 << 10, fetchWait: 50 * time.Millisecond, clock: p.clock, lg: hclog.NewNullLogger(), appended: h.lp.appendedAny}
	go func() { f.run(ctx); done <- struct{}{} }()
	t.Cleanup(func() { cancel(); <-done; <-done })

	m := protocol.Message{ID: "x", Topic: "t", Queue: 0, Timestamp: 1, Body: []byte("copied")}
	if _, err := p.master.Append([]storage.Entry{{Topic: "t", Queue: 0, Payload: protocol.AppendMessage(nil, &m)}}, false); err != nil {
		t.Fatal(err)
	}
	p.repl.notify()
	if pr := answer(t, rep); len(pr.Messages) != 1 || string(pr.Messages[0].Message.Body) != "copied" {
		t.Fatalf("answer %+v", pr)
	}
	testwait.For(t, 5*time.Second, "one wake-up", func() bool { return h.stats.PullWakeups.Load() == 1 })
	if answered(idle) || h.stats.PullsParked.Load() != 1 {
		t.Fatal("a PULL of a queue the follower did not fill was answered")
	}
}

// Past the cap on parked PULLs a PULL is answered at once, empty.
func TestLongPollCapsParkedPulls(t *testing.T) {
	h := newLPHarness(t, nil)
	h.lp.maxParked = 3
	for q := range uint32(3) {
		h.pull("t", q, 0, 60_000)
	}
	h.waitParked(t, 3)
	if pr := answer(t, h.pull("t", 9, 0, 60_000)); len(pr.Messages) != 0 {
		t.Fatalf("answer %+v", pr)
	}
	if h.stats.PullsOverflow.Load() != 1 || h.stats.PullsParked.Load() != 3 {
		t.Fatalf("overflow %d, parked %d", h.stats.PullsOverflow.Load(), h.stats.PullsParked.Load())
	}
}

// Closing answers every parked PULL SHUTTING_DOWN, and a PULL that would
// park after it too.
func TestLongPollCloseAnswersParked(t *testing.T) {
	h := newLPHarness(t, nil)
	reps := []chanReplier{h.pull("t", 0, 0, 60_000), h.pull("t", 1, 5, 60_000)}
	h.waitParked(t, 2)
	h.stop()
	reps = append(reps, h.pull("t", 0, 0, 60_000))
	for i, rep := range reps {
		select {
		case a := <-rep:
			if protocol.StatusOf(a.err) != protocol.StatusShuttingDown {
				t.Fatalf("PULL %d: %v", i, a.err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("PULL %d not answered", i)
		}
	}
	if h.stats.PullsParked.Load() != 0 {
		t.Fatal("parked after close")
	}
}

// A truncation (or a step-down) answers every parked PULL with what its
// queue holds; a PULL that looked before the cut and parks after it is
// answered at once too: its queue's end went back.
func TestLongPollReleasedByTruncation(t *testing.T) {
	h := newLPHarness(t, nil)
	pos := h.send(t, "t", []uint32{0, 0, 0, 0, 0}, "0", "1", "2", "3", "4")
	rep := h.pull("t", 0, 5, 60_000)
	h.waitParked(t, 1)
	if _, err := h.log.Truncate(pos[3].LogOffset, filepath.Join(t.TempDir(), storage.SideFileName(pos[3].LogOffset, 1))); err != nil {
		t.Fatal(err)
	}
	h.lp.releaseAll()
	if pr := answer(t, rep); len(pr.Messages) != 0 || pr.MaxOffset != 3 {
		t.Fatalf("released answer %+v", pr)
	}
	testwait.For(t, 5*time.Second, "the release to be counted", func() bool { return h.stats.PullsReleased.Load() == 1 })
	late := make(chanReplier, 1)
	if !h.lp.park(late, protocol.PullRequest{Topic: "t", Queue: 0, Offset: 5, WaitMillis: 60_000}, 5) {
		t.Fatal("not parked")
	}
	if pr := answer(t, late); pr.MaxOffset != 3 {
		t.Fatalf("late answer %+v", pr)
	}
	// Likewise a message appended between a PULL's look and its parking.
	if !h.lp.park(late, protocol.PullRequest{Topic: "t", Queue: 0, Offset: 2, WaitMillis: 60_000}, 2) {
		t.Fatal("not parked")
	}
	if pr := answer(t, late); len(pr.Messages) != 1 || pr.NextOffset != 3 {
		t.Fatalf("late answer %+v", pr)
	}
	if h.stats.PullsParked.Load() != 0 {
		t.Fatal("still parked")
	}
}

// Many PULLs parking, appends and expiries at once (for -race).
func TestLongPollConcurrent(t *testing.T) {
	h := newLPHarness(t, nil)
	const pullers, rounds = 8, 50
	errs := make(chan error, pullers)
	for w := range uint32(pullers) {
		go func() {
			off := int64(0)
			for off < rounds {
				rep := h.pull("t", w, off, 60_000)
				a := <-rep
				if a.err != nil {
					errs <- a.err
					return
				}
				pr, err := protocol.DecodePullResponse(a.body)
				if err != nil {
					errs <- err
					return
				}
				off = pr.NextOffset
			}
			errs <- nil
		}()
	}
	for range rounds {
		qs := make([]uint32, pullers)
		bodies := make([]string, pullers)
		for w := range qs {
			qs[w], bodies[w] = uint32(w), "x"
		}
		h.send(t, "t", qs, bodies...)
	}
	for range pullers {
		select {
		case err := <-errs:
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a puller did not read every message")
		}
	}
}
