package producer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"sync"

	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
	"github.com/ferrymq/ferrymq/sdkmetrics"
)

// Errors of transactions.
var (
	// ErrTxnAborted: the transaction was aborted (one of its messages was
	// not stored, the broker aborted it at its timeout, an operator did):
	// none of its messages is delivered.
	ErrTxnAborted = errors.New("producer: transaction aborted")
	// ErrTxnSpansGroups: the transaction's messages went to more than one
	// broker group (keys or topics whose queues are on different groups);
	// a transaction commits on one group. It was aborted.
	ErrTxnSpansGroups = errors.New("producer: transaction spans broker groups")
	// ErrTxnInProgress: BeginTxn while this producer's transaction is open
	// (a producer runs one at a time: the broker takes messages only of a
	// producer's newest transaction).
	ErrTxnInProgress = errors.New("producer: a transaction is already open")
	// ErrTxnNeedsIdentity: transactions need a named, idempotent producer
	// (Identity): a later instance resolves what an earlier one left open.
	ErrTxnNeedsIdentity = errors.New("producer: transactions need a named idempotent producer (Identity)")
	// ErrTxnEnded: Send, Commit or Abort on a transaction already ended.
	ErrTxnEnded = errors.New("producer: transaction already committed or aborted")
)

// Txn is a transaction of a named producer (BeginTxn): its messages are
// stored in their queues as they are sent, and delivered to consumers
// (reading committed messages, the default) only once Commit returns nil;
// after Abort, or a failed Commit, never. Its messages go to the broker
// group of its first message (an unkeyed one picks a queue of that group);
// a message keyed to another group's queue makes Commit fail with
// ErrTxnSpansGroups. A Txn is safe for concurrent use until it ends.
type Txn struct {
	c  *Client
	id protocol.TxnID // the producer id and epoch at BeginTxn, and its number

	mu      sync.Mutex
	pending int           // messages sent and not yet settled
	settled chan struct{} // closed when pending drops to 0 (nil while 0)
	group   string        // the group of its messages
	first   txnPart       // a queue of that group (its first message's), to abort it whatever came of its messages
	closing bool          // Commit or Abort began: no more messages
	parts   map[txnPartKey]txnPart
	err     error // the first message that failed
	ended   bool
}

// txnPartKey names one transaction id's messages on one group (a new
// identity taken during the transaction writes under another epoch).
type txnPartKey struct {
	id    protocol.TxnID
	group string
}

// txnPart is a queue of a part's messages, to find its group's master by
// the queue's route, and the last sequence stored in each of its queues,
// which the commit requires of the group's log.
type txnPart struct {
	group string
	topic string
	queue uint32
	seqs  map[txnQueue]int64
}

type txnQueue struct {
	topic string
	queue uint32
}

// lastSeqs is the part's last sequence per queue, as a commit names them.
func (p txnPart) lastSeqs() []protocol.TxnSeq {
	out := make([]protocol.TxnSeq, 0, len(p.seqs))
	for q, seq := range p.seqs {
		out = append(out, protocol.TxnSeq{Topic: q.topic, Queue: q.queue, Seq: seq})
	}
	return out
}

// BeginTxn opens a transaction. It takes the producer's identity first if
// it has none. A producer runs one transaction at a time.
func (c *Client) BeginTxn(ctx context.Context) (*Txn, error) {
	if c.cfg.name == "" || !c.cfg.idempotent {
		return nil, ErrTxnNeedsIdentity
	}
	if c.life.closed.Load() {
		return nil, ErrClosed
	}
	if err := c.takeIdentity(ctx); err != nil {
		return nil, err
	}
	c.txnMu.Lock()
	defer c.txnMu.Unlock()
	if c.txn != nil {
		return nil, ErrTxnInProgress
	}
	cur := c.ident.Load()
	c.txnNum++
	t := &Txn{c: c, id: protocol.TxnID{Producer: cur.id, Epoch: cur.epoch, Number: c.txnNum}, parts: map[txnPartKey]txnPart{}}
	c.txn = t
	return t, nil
}

// ID is the transaction's id, as brokers and ferryctl show it.
func (t *Txn) ID() protocol.TxnID { return t.id }

// Send sends one message in the transaction and waits for its result (it
// is stored, not delivered, until Commit).
func (t *Txn) Send(ctx context.Context, m *Message) (Result, error) {
	type out struct {
		r   Result
		err error
	}
	ch := make(chan out, 1)
	t.SendAsync(ctx, m, func(r Result, err error) { ch <- out{r, err} })
	o := <-ch
	return o.r, o.err
}

// SendAsync is Send in the background, as Client.SendAsync.
func (t *Txn) SendAsync(ctx context.Context, m *Message, promise func(Result, error)) {
	t.mu.Lock()
	if t.ended || t.closing {
		t.mu.Unlock()
		promise(Result{}, ErrTxnEnded)
		return
	}
	t.pending++
	if t.pending == 1 {
		t.settled = make(chan struct{})
	}
	t.mu.Unlock()
	t.c.sendIn(ctx, m, t, true, func(r Result, err error) {
		t.settle(r, err)
		promise(r, err)
	})
}

// settle notes a message's result.
func (t *Txn) settle(r Result, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err != nil {
		if t.err == nil {
			t.err = err
		}
	} else {
		k := txnPartKey{protocol.TxnID{Producer: r.ProducerID, Epoch: r.Epoch, Number: t.id.Number}, r.Group}
		p, ok := t.parts[k]
		if !ok {
			p = txnPart{group: r.Group, topic: r.Topic, queue: r.Queue, seqs: map[txnQueue]int64{}}
			t.parts[k] = p
		}
		topic := r.Topic
		if r.Delayed {
			topic = protocol.DelayTopic(topic) // its stamp's queue: the pending records'
		}
		if q := (txnQueue{topic, r.Queue}); r.Seq >= p.seqs[q] {
			p.seqs[q] = r.Seq
		}
	}
	t.pending--
	if t.pending == 0 {
		close(t.settled)
		t.settled = nil
	}
}

// stamped is told that a message of the transaction was stamped with
// identity cur: under another identity than the transaction's (a renewal
// after OUT_OF_ORDER_SEQUENCE), the transaction cannot commit.
func (t *Txn) stamped(cur *identity) {
	if cur.id == t.id.Producer && cur.epoch == t.id.Epoch {
		return
	}
	t.mu.Lock()
	if t.err == nil {
		t.err = fmt.Errorf("the producer took a new identity (epoch %d) during the transaction", cur.epoch)
	}
	t.mu.Unlock()
}

// queueIn picks, for a message of the transaction, a queue of the group of
// its first message among qs (ok false: none there, or no message yet,
// which then sets the group).
func (t *Txn) queueIn(topic string, qs []routing.QueueRoute) (routing.QueueRoute, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var mine []routing.QueueRoute
	for _, q := range qs {
		if t.group == "" && q.Writable {
			t.group = q.Group
		}
		if q.Group == t.group {
			mine = append(mine, q)
		}
	}
	if len(mine) == 0 {
		return routing.QueueRoute{}, false
	}
	q := mine[t.c.seq.Load()%uint64(len(mine))]
	if t.first.group == "" {
		t.first = txnPart{group: q.Group, topic: topic, queue: q.Queue}
	}
	return q, true
}

// close refuses the transaction's later messages (Commit or Abort began).
func (t *Txn) close() {
	t.mu.Lock()
	t.closing = true
	t.mu.Unlock()
}

// wait waits until every message sent so far has its result.
func (t *Txn) wait(ctx context.Context) error {
	t.mu.Lock()
	ch := t.settled
	t.mu.Unlock()
	if ch == nil {
		return nil
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("producer: transaction %s: waiting for its messages: %w", t.id, ctx.Err())
	}
}

// Commit waits for every message of the transaction to be stored, then
// commits it: consumers then receive them all. An error other than
// ErrTxnAborted or ErrTxnSpansGroups (the transaction was aborted) leaves
// the transaction open: Commit may be called again, or Abort; the broker
// aborts it at its timeout. ctx bounds the whole (default: the delivery
// timeout).
func (t *Txn) Commit(ctx context.Context) error {
	ctx, cancel := t.c.bounded(ctx)
	defer cancel()
	t.close()
	if err := t.wait(ctx); err != nil {
		return err
	}
	t.mu.Lock()
	if t.ended {
		t.mu.Unlock()
		return ErrTxnEnded
	}
	failed, parts := t.err, t.parts
	t.mu.Unlock()
	switch {
	case failed != nil:
		t.abortParts(ctx, parts, protocol.TxnByProducer)
		return fmt.Errorf("producer: transaction %s: a message failed: %w (%w)", t.id, ErrTxnAborted, failed)
	case len(parts) > 1:
		t.abortParts(ctx, parts, protocol.TxnByProducer)
		return fmt.Errorf("producer: transaction %s: %w", t.id, ErrTxnSpansGroups)
	}
	for k, p := range parts {
		id := k.id
		rep, err := t.c.endTxn(ctx, id, p, true, protocol.TxnByProducer)
		if protocol.StatusOf(err) == protocol.StatusTxnIncomplete {
			// A failover lost messages the old master had stored: abort.
			return errors.Join(fmt.Errorf("producer: transaction %s: %w (%w)", id, ErrTxnAborted, err), t.abortParts(ctx, parts, protocol.TxnByProducer))
		}
		if err != nil {
			return fmt.Errorf("producer: commit transaction %s: %w", id, err)
		}
		if !rep.Committed {
			t.end()
			t.c.stats.add(sdkmetrics.ProducerTxnAborts)
			return fmt.Errorf("producer: transaction %s: %w (by %s) before its commit", id, ErrTxnAborted, orUnknown(rep.By))
		}
	}
	t.end()
	t.c.stats.add(sdkmetrics.ProducerTxnCommits)
	return nil
}

// Abort aborts the transaction: none of its messages is delivered. It
// waits for the messages in flight first.
func (t *Txn) Abort(ctx context.Context) error {
	ctx, cancel := t.c.bounded(ctx)
	defer cancel()
	t.close()
	if err := t.wait(ctx); err != nil {
		return err
	}
	t.mu.Lock()
	if t.ended {
		t.mu.Unlock()
		return ErrTxnEnded
	}
	parts := t.parts
	t.mu.Unlock()
	return t.abortParts(ctx, parts, protocol.TxnByProducer)
}

// abortParts aborts every part and ends the transaction once all are.
func (t *Txn) abortParts(ctx context.Context, parts map[txnPartKey]txnPart, by string) error {
	t.mu.Lock()
	if k := (txnPartKey{t.id, t.first.group}); t.first.group != "" && parts[k].group == "" {
		// Its messages there all failed, some maybe stored: abort it too.
		parts = maps.Clone(parts)
		parts[k] = t.first
	}
	t.mu.Unlock()
	var errs []error
	for k, p := range parts {
		id := k.id
		rep, err := t.c.endTxn(ctx, id, p, false, by)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("producer: abort transaction %s: %w", id, err))
		case rep.Committed:
			errs = append(errs, fmt.Errorf("producer: abort transaction %s: it was committed before", id))
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	t.end()
	t.c.stats.add(sdkmetrics.ProducerTxnAborts)
	return nil
}

// end marks the transaction ended and lets the producer begin another.
func (t *Txn) end() {
	t.mu.Lock()
	t.ended = true
	t.mu.Unlock()
	t.c.txnMu.Lock()
	if t.c.txn == t {
		t.c.txn = nil
	}
	t.c.txnMu.Unlock()
}

func orUnknown(s string) string {
	if s == "" {
		return "an earlier decision"
	}
	return s
}

// SendInTxn is RocketMQ's transactional send: it sends msgs in a new
// transaction (stored, not delivered), runs work (the application's local
// transaction), and commits if work returns nil, else aborts. If this
// process dies before the commit or the abort reaches the broker, the next
// instance of this producer's Identity resolves the transaction with its
// TxnChecker (or the broker aborts it at its timeout).
func (c *Client) SendInTxn(ctx context.Context, msgs []*Message, work func(ctx context.Context) error) ([]Result, error) {
	t, err := c.BeginTxn(ctx)
	if err != nil {
		return nil, err
	}
	results := make([]Result, len(msgs))
	errs := make([]error, len(msgs))
	var wg sync.WaitGroup
	for i, m := range msgs {
		wg.Add(1)
		t.SendAsync(ctx, m, func(r Result, err error) {
			results[i], errs[i] = r, err
			wg.Done()
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return results, errors.Join(err, t.Abort(ctx))
	}
	if err := work(ctx); err != nil {
		return results, errors.Join(fmt.Errorf("producer: the transaction's work failed, aborted: %w", err), t.Abort(ctx))
	}
	return results, t.Commit(ctx)
}

// bounded is ctx, with the delivery timeout when it has no deadline.
func (c *Client) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, c.cfg.deliveryTimeout)
}

// endTxn decides transaction id on its group's master, found by the route
// of a queue it wrote, retrying what may succeed later (a failover, a
// busy or read-only group, a lost connection) until ctx ends.
func (c *Client) endTxn(ctx context.Context, id protocol.TxnID, p txnPart, commit bool, by string) (protocol.TxnEndReply, error) {
	req := protocol.TxnEndRequest{Producer: id.Producer, Epoch: id.Epoch, Number: id.Number, Commit: commit, By: by}
	if commit && by == protocol.TxnByProducer {
		req.Seqs = p.lastSeqs()
	}
	body, _ := json.Marshal(req)
	var rep protocol.TxnEndReply
	err := c.callMaster(ctx, p.topic, p.queue, protocol.CodeTxnEnd, body, &rep)
	return rep, err
}

// callMaster calls the master of the group holding topic's queue with a
// JSON request and decodes the answer into out, retrying with backoff what
// may succeed later until ctx ends.
func (c *Client) callMaster(ctx context.Context, topic string, queue uint32, code protocol.Code, body []byte, out any) error {
	var last error
	for attempt := 1; ; attempt++ {
		err := c.callMasterOnce(ctx, topic, queue, code, body, out)
		if err == nil || !retriableCall(err) {
			return err
		}
		last = err
		c.router.refreshSoon(topic)
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %w)", ctx.Err(), last)
		case <-c.cfg.clock.After(c.cfg.backoff(attempt, c.cfg.maxBackoff)):
		case <-c.life.stop:
			return ErrClosed
		}
	}
}

func (c *Client) callMasterOnce(ctx context.Context, topic string, queue uint32, code protocol.Code, body []byte, out any) error {
	if _, err := c.router.cache.Lookup(ctx, topic); err != nil {
		return lookupErr(err)
	}
	q, _, ok := c.router.queueRoute(topic, queue)
	if !ok || q.Master == "" {
		return &protocol.Error{Status: protocol.StatusNoRoute, Message: fmt.Sprintf("%s queue %d has no master in the route", topic, queue)}
	}
	conn := c.wire.conn(q.Master)
	if conn == nil {
		return ErrClosed
	}
	resp, err := conn.Call(ctx, code, body)
	if err != nil {
		return sendErr(q.Group, q.Master, err)
	}
	if err := json.Unmarshal(resp.Body, out); err != nil {
		return fmt.Errorf("producer: %v answer from %s: %w", code, q.Master, err)
	}
	return nil
}

// retriableCall reports whether a call's error may go away: a status that
// says so, or no answer at all.
func retriableCall(err error) bool {
	var pe *protocol.Error
	if errors.As(err, &pe) {
		return pe.Status.Retriable()
	}
	return errors.Is(err, ErrConnLost) || errors.Is(err, ErrUnreachable)
}
