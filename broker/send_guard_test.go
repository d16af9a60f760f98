package broker

import (
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/protocol"
)

// guardReplier records a SEND answer and its guard.
type guardReplier struct {
	body  []byte
	guard transport.Guard
}

func (r *guardReplier) Reply(body []byte) error { r.body = body; return nil }
func (r *guardReplier) ReplyError(err error)    { panic(err) }
func (r *guardReplier) Release()                {}
func (r *guardReplier) ReplyGiven(body []byte, release func()) error {
	r.body = body
	return nil
}
func (r *guardReplier) ReplyGuarded(body []byte, g transport.Guard) error {
	r.body, r.guard = body, g
	return nil
}

// A SEND's acknowledgements are checked against the write lease when the
// answer is written, not when the messages were stored: an answer made
// while the lease held but written after it ran out (a pause between the
// two, or a HIGH message of the same batch that kept it waiting) says
// LEASE_LOST for every stored message; one written in time but finished
// after the lease ended is counted.
func TestSendAnswerCheckedAtTheWrite(t *testing.T) {
	clock := clockwork.NewFakeClock()
	sess := newSession("b1", nil, 100*time.Millisecond, time.Second, clock, hclog.NewNullLogger())
	lease := &sess.lease
	lease.ready.Store(1)
	stats := &Stats{}
	stats.initHistograms()
	s := &sender{sess: sess, stats: stats, clock: clock}
	statuses := []protocol.Status{protocol.StatusOK, protocol.StatusDuplicate, protocol.StatusNotMaster, protocol.StatusOK}
	answer := func() (*guardReplier, []protocol.Status) {
		rep := &guardReplier{}
		sb := &sendBatch{s: s, rep: rep, epoch: 1, results: make([]protocol.SendResult, len(statuses))}
		for i, st := range statuses {
			sb.results[i] = protocol.SendResult{Status: st, QueueOffset: int64(i + 1), LogOffset: int64(100 * i)}
		}
		sb.pending.Store(1)
		sb.done1()
		if rep.guard == nil {
			t.Fatal("an answer with acknowledgements went out unguarded")
		}
		return rep, statuses
	}
	decode := func(body []byte) []protocol.Status {
		res, err := protocol.DecodeSendResponse(body, nil)
		if err != nil {
			t.Fatal(err)
		}
		var out []protocol.Status
		for _, r := range res {
			out = append(out, r.Status)
		}
		return out
	}

	// Written while the lease holds: unchanged, nothing counted.
	lease.renew(clock.Now(), true, true, 1, 0)
	rep, want := answer()
	rep.guard.Check(rep.body)
	rep.guard.Sent()
	if got := decode(rep.body); !slices.Equal(got, want) || stats.LeaseLost.Load() != 0 || stats.AcksAfterLease.Load() != 0 {
		t.Fatalf("in time: %v (lease lost %d, after lease %d)", got, stats.LeaseLost.Load(), stats.AcksAfterLease.Load())
	}

	// Made in time, written a session after the heartbeat: refused.
	lease.renew(clock.Now(), true, true, 1, 0)
	rep, _ = answer()
	clock.Advance(time.Second)
	rep.guard.Check(rep.body)
	rep.guard.Check(rep.body) // again, as for a flush's rest: counted once
	rep.guard.Sent()
	want = []protocol.Status{protocol.StatusLeaseLost, protocol.StatusLeaseLost, protocol.StatusNotMaster, protocol.StatusLeaseLost}
	if got := decode(rep.body); !slices.Equal(got, want) || stats.LeaseLost.Load() != 3 || stats.AcksAfterLease.Load() != 0 {
		t.Fatalf("written after the lease: %v, want %v (lease lost %d, after lease %d)", got, want, stats.LeaseLost.Load(), stats.AcksAfterLease.Load())
	}

	// Made in time, written after a newer epoch was seen: refused.
	lease.renew(clock.Now(), true, true, 1, 0)
	rep, _ = answer()
	lease.fence(2)
	rep.guard.Check(rep.body)
	if got := decode(rep.body); !slices.Equal(got, want) || stats.LeaseLost.Load() != 6 {
		t.Fatalf("written after a newer epoch was seen: %v, want %v", got, want)
	}

	// Checked in time, its last byte handed over after the lease ended:
	// the three acknowledgements are counted.
	lease.renew(clock.Now(), true, true, 1, 0)
	rep, want = answer()
	rep.guard.Check(rep.body)
	clock.Advance(time.Second)
	rep.guard.Sent()
	if got := decode(rep.body); !slices.Equal(got, want) || stats.AcksAfterLease.Load() != 3 {
		t.Fatalf("sent after the lease: %v (after lease %d, want 3)", got, stats.AcksAfterLease.Load())
	}

	// An answer that acknowledges nothing needs no guard.
	rep = &guardReplier{}
	sb := &sendBatch{s: s, rep: rep, epoch: 1, results: []protocol.SendResult{{Status: protocol.StatusReadOnly}}}
	sb.pending.Store(1)
	sb.done1()
	if rep.guard != nil || rep.body == nil {
		t.Fatalf("a refusal: guard %v, body %v", rep.guard, rep.body)
	}
}
