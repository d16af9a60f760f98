package producer

import (
	"errors"
	"fmt"
	"time"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/internal/clientcore"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
	"github.com/ferrymq/ferrymq/sdkmetrics"
)

// wire makes the SEND call of a batch: it encodes the batch's records
// into a SEND body, calls the group's master on the pooled connection,
// decodes the per-message results, and reports the call's latency and
// faults to the avoider.
type wire struct {
	cfg     *config
	life    *life
	pool    *clientcore.Pool
	bodies  bodyBufs // SEND bodies' encode buffers
	avoider routing.Avoider
}

func newWire(cfg *config, l *life, avoider routing.Avoider) *wire {
	return &wire{cfg: cfg, life: l, avoider: avoider,
		bodies: bodyBufs{keep: cfg.maxInflight, limit: cfg.maxBatchBytes + protocol.SendRequestHeaderSize},
		pool: clientcore.NewPool(clientcore.PoolConfig{
			Transport: transport.ClientConfig{CallTimeout: cfg.requestTimeout, TLS: cfg.TLS, Login: auth.TokenLogin(cfg.Token)},
			Dial:      cfg.dialAddr,
		})}
}

// reply is what a SEND call came to: a result per message, or the whole
// call's error; gaveUp says the producer gave the call up (see givenUp),
// its outcome unknown.
type reply struct {
	results []protocol.SendResult
	err     error
	gaveUp  bool
}

// send sends one batch to group's master (cl is its call, nil when the
// group has no master) and returns its reply.
func (w *wire) send(group string, b *batch, cl *call) reply {
	if cl == nil {
		return reply{err: &protocol.Error{Status: protocol.StatusNoRoute, Message: fmt.Sprintf("group %s has no master in the route", group)}}
	}
	conn := w.conn(b.addr)
	if conn == nil {
		return reply{err: transport.ErrClosed}
	}
	body := w.encode(b)
	start := time.Now()
	resp, err := conn.CallUntil(w.deadline(b), &cl.h, protocol.CodeSend, body)
	latency := time.Since(start)
	w.cfg.Metrics.Observe(sdkmetrics.ProducerSendDuration, latency)
	var a reply
	var g *givenUp
	if err != nil && errors.As(cl.h.Cause(), &g) {
		// An answer that came anyway wins; without one, the outcome is
		// unknown, as after a timeout.
		a.gaveUp = true
		err = &protocol.Error{Status: protocol.StatusTimeout, Message: "call given up: " + g.reason}
	}
	// The transport copied the body into its write buffer before Call
	// waited, so the buffer is free once Call returns.
	w.bodies.put(body)
	if err == nil {
		a.results, err = clientcore.DecodeSendAnswer(resp, b.n)
	}
	a.err = err
	// A call given up because its master was replaced says nothing of the
	// group's new master; and one given up because the group cannot take
	// writes is not chosen anyway.
	if !a.gaveUp {
		w.avoider.Report(group, latency, a.fault(), w.cfg.clock.Now())
	}
	return a
}

// conn returns the connection to a broker, or nil once the producer is dead.
func (w *wire) conn(addr string) *transport.Client {
	if w.life.dead.Load() {
		return nil
	}
	tc, err := w.pool.Get(addr)
	if err != nil {
		return nil
	}
	return tc
}

// deadline is a batch's call's: RequestTimeout from now, or the soonest
// delivery deadline of its records.
func (w *wire) deadline(b *batch) time.Time {
	deadline := time.Now().Add(w.cfg.requestTimeout)
	for _, rn := range b.runs {
		for _, r := range rn.recs {
			if r.deadline.Before(deadline) {
				deadline = r.deadline
			}
		}
	}
	return deadline
}

// encode makes a batch's SEND body: the group's epoch, a count and the
// messages, encoded straight from the records (no copy of the messages
// into a slice first), into a buffer of the right size: records know
// their encoded size (with a stamp), so appending never grows it.
func (w *wire) encode(b *batch) []byte {
	need := protocol.SendRequestHeaderSize
	for _, rn := range b.runs {
		for _, r := range rn.recs {
			need += r.size
		}
	}
	body := protocol.AppendSendRequestHeader(w.bodies.get(need), b.epoch, b.n)
	for _, rn := range b.runs {
		for _, r := range rn.recs {
			body = protocol.AppendMessage(body, &r.msg)
		}
	}
	return body
}

// fault reports whether the reply counts against the group: a broken
// connection or a late answer does; a status the broker answered, for the
// whole batch or a message, as its row of the status table says.
func (a *reply) fault() bool {
	if a.err != nil {
		var pe *protocol.Error
		return !errors.As(a.err, &pe) || pe.Status.Fault()
	}
	for _, res := range a.results {
		if res.Status != protocol.StatusOK && res.Status.Fault() {
			return true
		}
	}
	return false
}

// noAnswer reports whether a call failed with no answer from the broker:
// a lost connection, a timeout.
func noAnswer(err error) bool {
	var pe *protocol.Error
	return !errors.As(err, &pe) || pe.Status == protocol.StatusTimeout
}
