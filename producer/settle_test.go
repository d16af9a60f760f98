package producer

import (
	"errors"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/internal/clientcore"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
	"github.com/ferrymq/ferrymq/sdkmetrics"
)

// settleHost is a sink's host that records what settlement asks of the
// producer.
type settleHost struct {
	fenced    bool
	outOfOrds []uint64
}

func (h *settleHost) queueRoute(string, uint32) (routing.QueueRoute, uint64, bool) {
	return routing.QueueRoute{}, 0, false
}
func (h *settleHost) refreshSoon(string)              {}
func (h *settleHost) retryOrFail(*record, error) bool { return true }
func (h *settleHost) dispatch(*record, bool)          {}
func (h *settleHost) batchIdentity() *identity        { return nil }
func (h *settleHost) outOfOrder(gen uint64)           { h.outOfOrds = append(h.outOfOrds, gen) }
func (h *settleHost) fence()                          { h.fenced = true }
func (h *settleHost) failIfFenced()                   {}

// TestSettle: a run's answer decides each record's fate in sequence order:
// stored ones finish; an unknown outcome keeps the stamp on the queue; from
// the first refusal on, the queue's sequence rewinds (never below one that
// may be stored), and a record whose stamp may be stored keeps it while
// its group may answer it (until FailoverWait, by the producer's clock),
// the others lose theirs and move unless keyed; OUT_OF_ORDER_SEQUENCE
// takes a new identity; PRODUCER_FENCED fences the producer.
func TestSettle(t *testing.T) {
	const (
		stored   = "stored"
		failed   = "failed"
		stamped  = "line, stamped"   // waits at its line's front with its stamp
		unstamp  = "line, unstamped" // waits at its line's front without one
		moved    = "moved"           // dispatched again, unstamped
		movedDup = "moved, possible duplicate"
	)
	type rec struct {
		key   string
		maybe bool // an earlier attempt with its stamp had an unknown outcome
	}
	ok, dup, busy := protocol.StatusOK, protocol.StatusDuplicate, protocol.StatusBusy
	for _, tc := range []struct {
		name     string
		recs     []rec
		statuses []protocol.Status // nil: reqErr
		reqErr   error
		after    time.Duration // since the maybe records' first unknown outcome
		// readOnly: the route shows the group not writable, without a
		// slave, its master master at epoch (the batch went at epoch 1).
		readOnly bool
		master   string
		epoch    uint32
		want     []string
		wantNext int64 // the line's next sequence (it was len(recs))
		wantOOO  bool
		wantErr  error // of the failed records
	}{
		{name: "stored", recs: []rec{{}, {}}, statuses: []protocol.Status{ok, dup},
			want: []string{stored, stored}, wantNext: 2},
		{name: "no answer keeps stamps", recs: []rec{{}, {key: "k"}}, reqErr: &protocol.Error{Status: protocol.StatusTimeout},
			want: []string{stamped, stamped}, wantNext: 2},
		{name: "refused rewinds, unkeyed move", recs: []rec{{}, {}, {}}, statuses: []protocol.Status{ok, busy, busy},
			want: []string{stored, moved, moved}, wantNext: 1},
		{name: "refused keyed stay", recs: []rec{{key: "k"}, {key: "k"}}, statuses: []protocol.Status{busy, busy},
			want: []string{unstamp, unstamp}, wantNext: 0},
		{name: "maybe stored keeps its stamp within FailoverWait", recs: []rec{{maybe: true}, {}}, statuses: []protocol.Status{busy, busy},
			after: 19 * time.Second, want: []string{stamped, moved}, wantNext: 1},
		{name: "maybe stored moves after FailoverWait", recs: []rec{{maybe: true}, {}}, statuses: []protocol.Status{busy, busy},
			after: 20 * time.Second, want: []string{movedDup, moved}, wantNext: 1},
		{name: "maybe stored moves at once when nobody can be promoted", recs: []rec{{maybe: true}, {}}, statuses: []protocol.Status{busy, busy},
			readOnly: true, master: "master:1", epoch: 1, want: []string{movedDup, moved}, wantNext: 1},
		{name: "maybe stored waits for the slave promoted since", recs: []rec{{maybe: true}, {}}, statuses: []protocol.Status{busy, busy},
			readOnly: true, master: "slave:1", epoch: 2, want: []string{stamped, moved}, wantNext: 1},
		{name: "stored after a refusal is never reused", recs: []rec{{}, {}, {}}, statuses: []protocol.Status{ok, busy, ok},
			want: []string{stored, moved, stored}, wantNext: 3},
		{name: "out of order takes a new identity", recs: []rec{{maybe: true}, {key: "k"}}, statuses: []protocol.Status{protocol.StatusOutOfOrderSequence, busy},
			want: []string{movedDup, unstamp}, wantNext: 1, wantOOO: true},
		{name: "fenced", recs: []rec{{}}, statuses: []protocol.Status{protocol.StatusProducerFenced},
			want: []string{failed}, wantNext: 0, wantErr: ErrFenced},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clockwork.NewFakeClock()
			cfg := defaults()
			cfg.Shared = clientcore.Apply(&cfg, []Opt(nil))
			cfg.clock, cfg.retryBackoff, cfg.maxBackoff = clk, time.Hour, time.Hour // holds never end in the test
			l := &life{stop: make(chan struct{})}
			h := &settleHost{}
			stats := statCounters{hooks: cfg.Metrics}
			s := newSink(sinkDeps{cfg: &cfg, life: l, stats: &stats, buf: newBuffer(&cfg, l.stop, func() {}), host: h}, "g1")
			s.viewed, s.writable, s.slave, s.addr, s.epoch = true, true, "slave:1", "master:1", 1
			if tc.readOnly {
				s.writable, s.slave, s.addr, s.epoch = false, "", tc.master, tc.epoch
			}
			ln := &line{key: qkey{topic: "t"}, gen: 1, next: int64(len(tc.recs)), busy: true}
			rn := run{ln: ln, gen: 1}
			since := clk.Now()
			for i, r := range tc.recs {
				rn.recs = append(rn.recs, &record{key: r.key, size: 10, gen: 1, maybe: r.maybe, maybeSince: since, maybeEpoch: 1,
					deadline: time.Now().Add(2 * time.Hour),
					msg:      protocol.Message{ID: "m", Topic: "t", Producer: protocol.ProducerStamp{ID: 7, Seq: int64(i)}}})
			}
			clk.Advance(tc.after)
			var results []protocol.SendResult
			for _, st := range tc.statuses {
				results = append(results, protocol.SendResult{Status: st})
			}

			s.mu.Lock()
			s.settle(rn, results, tc.reqErr, "master:1", 1)
			s.mu.Unlock()
			close(l.stop)
			l.wg.Wait()

			for i, r := range rn.recs {
				if got := fate(s, ln, r); got != tc.want[i] {
					t.Errorf("record %d: %s, want %s", i, got, tc.want[i])
				}
			}
			if ln.next != tc.wantNext {
				t.Errorf("the line's next sequence %d, want %d", ln.next, tc.wantNext)
			}
			if ooo := len(h.outOfOrds) > 0; ooo != tc.wantOOO || ooo && (h.outOfOrds[0] != 1 || stats.counts[sdkmetrics.ProducerOutOfOrder].Load() != 1) {
				t.Errorf("new identities asked %v, want one: %v", h.outOfOrds, tc.wantOOO)
			}
			if tc.wantErr != nil {
				if !h.fenced {
					t.Error("the producer is not fenced")
				}
				for _, e := range s.done {
					if !errors.Is(e.err, tc.wantErr) {
						t.Errorf("failed with %v, want %v", e.err, tc.wantErr)
					}
				}
			}
		})
	}
}

// fate says where settlement left r.
func fate(s *sink, ln *line, r *record) string {
	for _, e := range s.done {
		if e.rec == r {
			if e.err != nil {
				return "failed"
			}
			return "stored"
		}
	}
	for _, x := range ln.recs {
		if x == r && r.gen != 0 && r.msg.Producer.ID != 0 {
			return "line, stamped"
		} else if x == r && r.gen == 0 && r.msg.Producer.ID == 0 {
			return "line, unstamped"
		}
	}
	for _, e := range s.retry {
		if e.rec == r && r.gen == 0 && r.msg.Producer.ID == 0 {
			if r.possibleDup {
				return "moved, possible duplicate"
			}
			return "moved"
		}
	}
	return "lost"
}
