package broker

import (
	"context"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/protocol"
)

// The HIGH messages of a SEND wait for the sync set once, for the highest
// of their ends: the answer leaves only once the slave holds the batch's
// last HIGH message (not as soon as it holds the first), each HIGH message
// then carries its own offsets, and the counters count messages, not
// waits. A wait that ends otherwise answers every HIGH message of the
// batch with its status, and the batch's NORMAL messages OK.
func TestHighBatchWaitsOnceForItsLastMessage(t *testing.T) {
	high, normal := protocol.Message{Reliability: protocol.High}, protocol.Message{Reliability: protocol.Normal}
	msgs := []protocol.Message{high, normal, high, high}
	good := []int{0, 1, 2, 3}
	send := func(p *replPair) *guardReplier {
		t.Helper()
		pos := p.append(t, len(msgs))
		rep := &guardReplier{}
		s := &sender{stats: p.stats, clock: p.clock}
		s.stats.initHistograms()
		sb := &sendBatch{s: s, rep: rep, results: make([]protocol.SendResult, len(msgs))}
		sb.pending.Store(int64(len(msgs)))
		s.appended(sb, p.repl, msgs, good, pos, nil)
		p.repl.mu.Lock()
		waits := len(p.repl.waiters)
		p.repl.mu.Unlock()
		if waits != 1 {
			t.Fatalf("%d waits for one batch, want 1", waits)
		}
		return rep
	}
	ack := func(p *replPair, end int64) {
		t.Helper()
		if err := (memLink{p.repl}).Ack(context.Background(), protocol.HAAck{Acked: end, Epoch: testEpoch, BrokerID: testSlave}); err != nil {
			t.Fatal(err)
		}
	}
	decode := func(rep *guardReplier) []protocol.SendResult {
		t.Helper()
		if rep.body == nil {
			t.Fatal("no answer")
		}
		res, err := protocol.DecodeSendResponse(rep.body, nil)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}

	t.Run("confirmed", func(t *testing.T) {
		p := newReplPair(t)
		rep := send(p)
		first, _, err := p.master.RecordAt(0)
		if err != nil {
			t.Fatal(err)
		}
		end := p.master.EndOffset()
		ack(p, first) // the first HIGH message held
		ack(p, end-1) // all but the last byte of the last
		if rep.body != nil {
			t.Fatal("answered before the slave held the batch's last HIGH message")
		}
		ack(p, end)
		res := decode(rep)
		var at int64
		for i, r := range res {
			if r.Status != protocol.StatusOK || r.QueueOffset != int64(i) || r.LogOffset != at {
				t.Fatalf("message %d: %+v, want OK at queue offset %d, log offset %d", i, r, i, at)
			}
			next, _, err := p.master.RecordAt(at)
			if err != nil {
				t.Fatal(err)
			}
			at = next
		}
		if got := p.stats.HighAcked.Load(); got != 3 {
			t.Fatalf("HighAcked %d, want 3", got)
		}
	})

	t.Run("timed out", func(t *testing.T) {
		p := newReplPair(t)
		rep := send(p)
		p.clock.Advance(time.Second + time.Millisecond) // past HighWait
		p.repl.step(context.Background())
		res := decode(rep)
		for i, r := range res {
			want := protocol.StatusSlaveSyncTimeout
			if msgs[i].Reliability == protocol.Normal {
				want = protocol.StatusOK
			}
			if r.Status != want {
				t.Fatalf("message %d: %v, want %v", i, r.Status, want)
			}
		}
		if got := p.stats.HighTimeouts.Load(); got != 3 {
			t.Fatalf("HighTimeouts %d, want 3", got)
		}
	})
}
