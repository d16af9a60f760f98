package clientcore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// dedupeBroker stores SENDs with the broker's dedupe rules for one queue (a
// known stamp is a DUPLICATE, a fresh producer takes any sequence, a gap is
// OUT_OF_ORDER_SEQUENCE; a delayed message's stamps are checked apart, as
// in its queue's internal queue), and answers each attempt as answer says: after
// storing (a TIMEOUT then is an answer lost), or instead.
type dedupeBroker struct {
	mu      sync.Mutex
	stored  []protocol.Message
	next    map[spaceKey]int64 // per producer id and space: the next sequence
	known   map[stampIn]bool
	seen    []protocol.ProducerStamp // every attempt's stamp
	answer  func(attempt int) (st protocol.Status, store bool)
	attempt int
}

func startDedupeBroker(t *testing.T, answer func(attempt int) (protocol.Status, bool)) (*dedupeBroker, string) {
	t.Helper()
	b := &dedupeBroker{next: map[spaceKey]int64{}, known: map[stampIn]bool{}, answer: answer}
	srv := transport.NewServer(transport.ServerConfig{})
	srv.Handle(protocol.CodeSend, func(r *transport.Request) {
		_, msgs, err := protocol.DecodeSendRequest(r.Body, nil)
		if err != nil || len(msgs) != 1 {
			r.ReplyError(&protocol.Error{Status: protocol.StatusInvalid, Message: "one message per SEND here"})
			return
		}
		_ = r.Reply(protocol.AppendSendResponse(nil, []protocol.SendResult{b.send(msgs[0])}))
	})
	if _, err := srv.Listen("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	return b, srv.Addr().String()
}

func (b *dedupeBroker) send(m protocol.Message) protocol.SendResult {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.attempt++
	b.seen = append(b.seen, m.Producer)
	st, store := b.answer(b.attempt)
	if !store {
		return protocol.SendResult{Status: st}
	}
	p := m.Producer
	delayed := m.Schedule.Kind == protocol.ScheduleDelayed
	switch next, ok := b.next[spaceKey{p.ID, delayed}]; {
	case b.known[stampIn{p, delayed}]:
		return protocol.SendResult{Status: protocol.StatusDuplicate}
	case ok && p.Seq != next:
		return protocol.SendResult{Status: protocol.StatusOutOfOrderSequence}
	}
	b.known[stampIn{p, delayed}] = true
	b.next[spaceKey{p.ID, delayed}] = p.Seq + 1
	b.stored = append(b.stored, m)
	return protocol.SendResult{Status: st, QueueOffset: int64(len(b.stored) - 1)}
}

// spaceKey is a producer's sequence space in the queue: its own, or the
// delayed messages'.
type spaceKey struct {
	id      uint64
	delayed bool
}

type stampIn struct {
	stamp   protocol.ProducerStamp
	delayed bool
}

func newTestSender(t *testing.T, addr string, ids *int) *Sender {
	t.Helper()
	pool := NewPool(PoolConfig{})
	t.Cleanup(func() { _ = pool.Close() })
	return NewSender(SenderConfig{
		Lookup: func(context.Context, string) (routing.Route, error) {
			return routing.Route{Topic: "dlq", Version: 1, Queues: []routing.QueueRoute{{Queue: 0, Group: "g1", Master: addr, Epoch: 1, Writable: true}}}, nil
		},
		InitProducer: func(context.Context) (uint64, uint16, error) {
			*ids++
			return uint64(100 + *ids), 0, nil
		},
		Pool: pool, RequestTimeout: time.Second, Backoff: time.Millisecond,
	})
}

// A message whose answer was lost (stored, then answered TIMEOUT) is sent
// again with the same stamp and answered DUPLICATE: stored once.
func TestSenderStoresOnceAcrossALostAnswer(t *testing.T) {
	b, addr := startDedupeBroker(t, func(attempt int) (protocol.Status, bool) {
		if attempt == 1 {
			return protocol.StatusTimeout, true
		}
		return protocol.StatusOK, true
	})
	ids := 0
	s := newTestSender(t, addr, &ids)
	m := &protocol.Message{ID: "x-1", Topic: "dlq", Body: []byte("dead")}
	res, err := s.Send(context.Background(), m, "")
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != protocol.StatusDuplicate || len(b.stored) != 1 || len(b.seen) != 2 || b.seen[0] != b.seen[1] {
		t.Fatalf("answer %v, stored %d, stamps %v: want one stored, the retry with the same stamp", res.Status, len(b.stored), b.seen)
	}
	// The next message takes the queue's next sequence.
	if _, err := s.Send(context.Background(), &protocol.Message{ID: "x-2", Topic: "dlq"}, ""); err != nil {
		t.Fatal(err)
	}
	if got := b.stored[1].Producer; got.ID != b.seen[0].ID || got.Seq != b.seen[0].Seq+1 {
		t.Fatalf("second message stamped %+v after %+v", got, b.seen[0])
	}
}

// A sequence whose outcome stayed unknown when the caller gave up is never
// given to another message: the next message is stored (under the next
// sequence if the abandoned one was stored, or after a gap, OUT_OF_ORDER,
// under a new identity if it was not), never answered DUPLICATE for it.
func TestSenderNeverReusesAMaybeStoredSequence(t *testing.T) {
	for _, tc := range []struct {
		name       string
		stored     bool // whether the abandoned message's first attempt was stored
		wantStored int
		wantIDs    int
	}{
		{"abandoned one stored", true, 3, 1},
		{"abandoned one not stored", false, 2, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			// Attempt 1: a first message, stored. Attempts 2 to 4: the
			// second message, answered TIMEOUT (the first of them stored
			// or not), given up at the third. Then OK.
			b, addr := startDedupeBroker(t, func(attempt int) (protocol.Status, bool) {
				switch {
				case attempt == 1 || attempt > 4:
					return protocol.StatusOK, true
				case attempt == 4:
					cancel()
				}
				return protocol.StatusTimeout, attempt == 2 && tc.stored
			})
			ids := 0
			s := newTestSender(t, addr, &ids)
			if _, err := s.Send(context.Background(), &protocol.Message{ID: "x-0", Topic: "dlq", Body: []byte("0")}, ""); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Send(ctx, &protocol.Message{ID: "x-1", Topic: "dlq", Body: []byte("a")}, ""); !errors.Is(err, context.Canceled) {
				t.Fatalf("the abandoned send: %v", err)
			}
			res, err := s.Send(context.Background(), &protocol.Message{ID: "x-2", Topic: "dlq", Body: []byte("b")}, "")
			if err != nil {
				t.Fatal(err)
			}
			last := b.stored[len(b.stored)-1]
			if res.Status != protocol.StatusOK || len(b.stored) != tc.wantStored || string(last.Body) != "b" || ids != tc.wantIDs {
				t.Fatalf("answer %v, %d stored (last %q), %d identities: want b stored, %d in all, %d identities",
					res.Status, len(b.stored), last.Body, ids, tc.wantStored, tc.wantIDs)
			}
		})
	}
}

// Delayed messages take their own sequences in a queue, apart from the
// queue's ordinary ones: interleaved, each kind goes 0, 1, ... and each is
// stored (none is taken for a duplicate of the other kind's).
func TestSenderDelayedSequenceSpace(t *testing.T) {
	b, addr := startDedupeBroker(t, func(int) (protocol.Status, bool) { return protocol.StatusOK, true })
	ids := 0
	s := newTestSender(t, addr, &ids)
	delayed := protocol.Schedule{Kind: protocol.ScheduleDelayed, At: time.Now().Add(time.Hour).UnixMilli(), Ref: -1}
	for i, sc := range []protocol.Schedule{{}, delayed, {}, delayed} {
		res, err := s.Send(context.Background(), &protocol.Message{ID: fmt.Sprint("x-", i), Topic: "dlq", Schedule: sc, Body: []byte("b")}, "")
		if err != nil || res.Status != protocol.StatusOK {
			t.Fatalf("send %d: %v %v", i, res.Status, err)
		}
	}
	var seqs []int64
	for _, m := range b.stored {
		seqs = append(seqs, m.Producer.Seq)
	}
	if !slices.Equal(seqs, []int64{0, 0, 1, 1}) {
		t.Fatalf("stored sequences %v, want 0 0 1 1", seqs)
	}
}
