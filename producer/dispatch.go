package producer

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ferrymq/ferrymq/internal/clientcore"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/sdkmetrics"
)

// dispatch picks a queue for the record and hands it to that group's sink.
// A keyed record that must stay on its key's queue passes its key's gate
// first, so it never overtakes an earlier record of its key that is still
// waiting for a route or an identity.
func (c *Client) dispatch(rec *record, urgent bool) { c.dispatchBy(rec, urgent, false) }

// dispatchBy is dispatch; caller says the goroutine calling it is Send's,
// which waits for rec's result anyway: the batch that carries rec, if it
// leaves now, is then sent from this goroutine, not a new one (one
// goroutine hand-off and one wake-up less on each side of the call).
func (c *Client) dispatchBy(rec *record, urgent, caller bool) {
	if !c.cfg.gated(rec) {
		c.dispatchOne(rec, urgent, caller)
		return
	}
	if !c.gates.pass(rec) {
		return // behind an earlier record of its key; dispatched when that one is
	}
	settled := c.dispatchOne(rec, urgent, caller)
	for _, w := range c.gates.after(rec, settled) {
		c.dispatch(w, urgent)
	}
}

// dispatchOne is dispatch without the key's gate. It reports whether the
// record is settled: handed to a sink, or finished; false means a retry of
// the dispatch is scheduled.
func (c *Client) dispatchOne(rec *record, urgent, caller bool) (settled bool) {
	if err := c.unsendable(rec); err != nil {
		c.buf.finish(rec, Result{}, err)
		return true
	}
	plan, err := c.router.route(rec)
	if err != nil {
		return !c.retryOrFail(rec, err)
	}
	q, err := c.router.pick(plan, rec)
	if err != nil {
		// No writable queue: the topic's groups are read-only (or have no
		// master), or it has no queues at all. Both refresh the route.
		st := protocol.StatusReadOnly
		if len(plan.Route.Queues) == 0 {
			st = protocol.StatusNoRoute
		}
		return !c.retryOrFail(rec, &protocol.Error{Status: st, Message: fmt.Sprintf("topic %q: %v", rec.msg.Topic, err)})
	}
	if c.cfg.idempotent {
		// The identity is taken before the record's first batch can leave.
		if err := c.ensureIdentity(rec); err != nil {
			return !c.retryOrFail(rec, err)
		}
	}
	rec.msg.Queue, rec.group, rec.view = q.Queue, q.Group, viewOf(plan.Route.Version, q)
	c.sink(q.Group).add(rec, urgent, caller)
	return true
}

// unsendable says why a record can no longer be sent (the producer is
// closed, the record's context ended, or the producer is fenced), or nil.
func (c *Client) unsendable(rec *record) error {
	switch {
	case c.life.dead.Load():
		if rec.lastErr != nil {
			return fmt.Errorf("%w: message %s to %q (last attempt: %w)", ErrClosed, rec.msg.ID, rec.msg.Topic, rec.lastErr)
		}
		return fmt.Errorf("%w: message %s to %q", ErrClosed, rec.msg.ID, rec.msg.Topic)
	case rec.ctx.Err() != nil:
		err := rec.ctx.Err()
		if rec.lastErr != nil {
			err = fmt.Errorf("%w (last attempt: %w)", err, rec.lastErr)
		}
		return fmt.Errorf("producer: message %s to %q not sent: %w", rec.msg.ID, rec.msg.Topic, err)
	case c.fenced.Load():
		return fmt.Errorf("%w: message %s to %q", ErrFenced, rec.msg.ID, rec.msg.Topic)
	}
	return nil
}

// retryOrFail schedules another dispatch of rec after a backoff with
// jitter and reports true, or finishes it and reports false when the error
// is final or its delivery deadline would pass. A status that says the
// route is stale refreshes it first.
func (c *Client) retryOrFail(rec *record, err error) (scheduled bool) {
	rec.failed(err)
	var pe *protocol.Error
	if errors.As(err, &pe) && pe.Status.RefreshesRoute() {
		c.router.refreshSoon(rec.msg.Topic)
	}
	if !clientcore.Retriable(err) && !(c.cfg.idempotent && maybeStored(err)) {
		c.buf.finish(rec, Result{}, fmt.Errorf("producer: message %s to %q: %w", rec.msg.ID, rec.msg.Topic, err))
		return false
	}
	rec.attempts++
	backoff := c.cfg.backoff(rec.attempts, time.Second)
	if time.Now().Add(backoff).After(rec.deadline) {
		c.buf.finish(rec, Result{}, deliveryTimeout(rec, err, rec.cause))
		return false
	}
	c.stats.add(sdkmetrics.ProducerRetries)
	c.life.wg.Add(1)
	t := time.NewTimer(backoff)
	go func() {
		defer c.life.wg.Done()
		defer t.Stop()
		select {
		case <-t.C:
		case <-c.life.stop:
		}
		c.dispatch(rec, true)
	}()
	return true
}

// keyGates keep each key's records in send order before they reach a sink
// (in a sink, a key's records wait in their queue's line in order). While a
// record of a key waits to retry its dispatch (no route or identity yet),
// later records of the key queue behind it and are dispatched, in order,
// once it is settled.
type keyGates struct {
	mu    sync.Mutex
	gates map[string]*keyGate // topic + "\x00" + key
}

type keyGate struct {
	head    *record
	waiting []*record
}

// gateKey is the gate of rec's key: delayed messages of a key have their
// own, as they have their own sequence space (see qkey).
func gateKey(rec *record) string {
	if rec.delayed() {
		return rec.msg.Topic + "\x00" + rec.key + "\x00delayed"
	}
	return rec.msg.Topic + "\x00" + rec.key
}

// pass reports whether rec may be dispatched now; if not, it waits in its
// key's gate.
func (g *keyGates) pass(rec *record) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	gt := g.gates[gateKey(rec)]
	if gt == nil || gt.head == rec {
		return true
	}
	gt.waiting = append(gt.waiting, rec)
	return false
}

// after records the outcome of rec's dispatch: unsettled, rec heads its
// key's gate; settled, the gate it headed opens and its waiting records are
// returned, in order, to be dispatched.
func (g *keyGates) after(rec *record, settled bool) []*record {
	g.mu.Lock()
	defer g.mu.Unlock()
	k := gateKey(rec)
	gt := g.gates[k]
	if !settled {
		if gt == nil {
			if g.gates == nil {
				g.gates = map[string]*keyGate{}
			}
			g.gates[k] = &keyGate{head: rec}
		}
		return nil
	}
	if gt == nil || gt.head != rec {
		return nil
	}
	delete(g.gates, k)
	return gt.waiting
}
