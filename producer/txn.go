package producer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/ferrymq/ferrymq/metaserver/api"
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
// after Abort, or a failed Commit, never. An unkeyed message goes to a
// queue of the broker group of the transaction's first message, so that
// most transactions commit on one group with one write; keyed messages go
// to their keys' queues, and a transaction on several groups commits
// through the registry (see Commit). A Txn is safe for concurrent use
// until it ends.
type Txn struct {
	c  *Client
	id protocol.TxnID // the producer id and epoch at BeginTxn, and its number

	mu      sync.Mutex
	pending int           // messages sent and not yet settled
	settled chan struct{} // closed when pending drops to 0 (nil while 0)
	group   string        // the group of its messages
	first   txnPart       // a queue of that group (its first message's), to abort it whatever came of its messages
	closing bool          // Commit or Abort began: no more messages
	// prepared: Prepare succeeded (its checker may commit it should this
	// process die), so Close leaves it open.
	prepared bool
	offsets  *api.CommitRequest
	queues   map[string]txnQueues // by topic: its queues on group (queueIn)
	parts    map[txnPartKey]txnPart
	err      error // the first message that failed
	ended    bool
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

func (t *Txn) isPrepared() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.prepared
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
	t.send(ctx, m, true, func(r Result, err error) { ch <- out{r, err} })
	o := <-ch
	return o.r, o.err
}

// SendAsync is Send in the background, as Client.SendAsync.
func (t *Txn) SendAsync(ctx context.Context, m *Message, promise func(Result, error)) {
	t.send(ctx, m, false, promise)
}

// send sends m in the transaction (urgent: Send's, not waiting for
// Linger).
func (t *Txn) send(ctx context.Context, m *Message, urgent bool, promise func(Result, error)) {
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
	t.c.sendIn(ctx, m, t, urgent, func(r Result, err error) {
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
	if t.group == "" {
		for _, q := range qs {
			if q.Writable {
				t.group = q.Group
				break
			}
		}
	}
	// The group's queues of the topic, found once per route.
	c := t.queues[topic]
	if len(qs) == 0 || c.of != &qs[0] {
		c = txnQueues{of: nil}
		if len(qs) > 0 {
			c.of = &qs[0]
		}
		for _, q := range qs {
			if q.Group == t.group {
				c.mine = append(c.mine, q)
			}
		}
		if t.queues == nil {
			t.queues = map[string]txnQueues{}
		}
		t.queues[topic] = c
	}
	if len(c.mine) == 0 {
		return routing.QueueRoute{}, false
	}
	q := c.mine[t.c.seq.Load()%uint64(len(c.mine))]
	if t.first.group == "" {
		t.first = txnPart{group: q.Group, topic: topic, queue: q.Queue}
	}
	return q, true
}

// txnQueues are the queues of a topic's route (the one whose first queue
// is at of) on the transaction's group.
type txnQueues struct {
	of   *routing.QueueRoute
	mine []routing.QueueRoute
}

// wait waits until every message sent so far has its result.
func (t *Txn) wait(ctx context.Context) error {
	t.mu.Lock()
	ch := t.settled
	t.mu.Unlock()
	if ch == nil {
		return nil
	}
	// Its messages leave now rather than after Linger, as in a Flush.
	t.c.buf.flushing.Add(1)
	defer t.c.buf.flushing.Add(-1)
	t.c.buf.kick()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("producer: transaction %s: waiting for its messages: %w", t.id, ctx.Err())
	}
}

// Commit waits for every message of the transaction to be stored, then
// commits it: consumers then receive them all. On one broker group (and
// without offsets) that is one TXN_END to its master; on several, or with
// a consumer's offsets (CommitOffsets), each group is prepared (it holds
// the messages as its sync set does), the registry decides (one Raft
// write, with the offsets), and each group's master is told. An error
// other than ErrTxnAborted leaves the transaction
// open: Commit may be called again, or Abort; the broker aborts it at its
// timeout. ctx bounds the whole (default: the delivery timeout).
func (t *Txn) Commit(ctx context.Context) error {
	ctx, cancel := t.c.bounded(ctx)
	defer cancel()
	parts, offsets, err := t.closed(ctx)
	if err != nil {
		return err
	}
	switch {
	case len(parts) <= 1 && offsets == nil:
		return t.commitOne(ctx, parts)
	case len(parts) == 0:
		// Offsets alone (no message came of the inputs): a plain commit.
		if _, err := t.c.meta.CommitOffsets(ctx, *offsets); err != nil {
			return fmt.Errorf("producer: transaction %s: its offsets: %w", t.id, metaErr("offsets", err))
		}
		t.end(true)
		return nil
	}
	if err := t.prepareParts(ctx, parts); err != nil {
		if errors.Is(err, ErrTxnAborted) {
			return errors.Join(err, t.abortParts(ctx, parts))
		}
		return err
	}
	d, err := t.c.meta.DecideTxn(ctx, api.TxnDecideRequest{Producer: t.id.Producer, Epoch: t.id.Epoch, Number: t.id.Number,
		Commit: true, By: protocol.TxnByProducer, Groups: partGroups(parts), Offsets: offsets})
	switch {
	case err != nil && refusal(protocol.StatusOf(err)):
		// The offsets were refused (the member lost its queues): nothing is
		// recorded, and the transaction cannot commit.
		return errors.Join(fmt.Errorf("producer: transaction %s: the registry refused it: %w (%w)", t.id, ErrTxnAborted, err), t.abortParts(ctx, parts))
	case err != nil:
		return fmt.Errorf("producer: commit transaction %s: %w", t.id, metaErr("transaction decision", err))
	case !d.Committed:
		return errors.Join(fmt.Errorf("producer: transaction %s: %w (by %s) before its commit", t.id, ErrTxnAborted, orUnknown(d.By)), t.abortParts(ctx, parts))
	case offsets != nil && !d.Offsets:
		t.end(true)
		return fmt.Errorf("producer: transaction %s was committed before without its offsets (by %s): the consumer's offsets did not move", t.id, orUnknown(d.By))
	}
	t.tellParts(ctx, parts, true)
	t.end(true)
	return nil
}

// closed refuses the transaction's later messages, waits for those sent,
// and returns its parts and offsets, or why it cannot end now: ended
// before, or a message failed (then it is aborted).
func (t *Txn) closed(ctx context.Context) (map[txnPartKey]txnPart, *api.CommitRequest, error) {
	t.mu.Lock()
	t.closing = true
	t.mu.Unlock()
	if err := t.wait(ctx); err != nil {
		return nil, nil, err
	}
	t.mu.Lock()
	ended, failed, parts, offsets := t.ended, t.err, t.parts, t.offsets
	t.mu.Unlock()
	switch {
	case ended:
		return nil, nil, ErrTxnEnded
	case failed != nil:
		return nil, nil, errors.Join(fmt.Errorf("producer: transaction %s: a message failed: %w (%w)", t.id, ErrTxnAborted, failed), t.abortParts(ctx, parts))
	case len(parts) > 1 && len(t.ids(parts)) > 1:
		return nil, nil, errors.Join(fmt.Errorf("producer: transaction %s: %w", t.id, ErrTxnAborted), t.abortParts(ctx, parts))
	}
	return parts, offsets, nil
}

// ids are the transaction ids its parts were written under.
func (t *Txn) ids(parts map[txnPartKey]txnPart) map[protocol.TxnID]bool {
	ids := map[protocol.TxnID]bool{}
	for k := range parts {
		ids[k.id] = true
	}
	return ids
}

// commitOne commits a transaction of one group (or none) at its master:
// the master checks its log holds every message (else TXN_INCOMPLETE: a
// failover lost some, and the transaction is aborted).
func (t *Txn) commitOne(ctx context.Context, parts map[txnPartKey]txnPart) error {
	for k, p := range parts {
		rep, err := t.c.endTxn(ctx, k.id, p, true, protocol.TxnByProducer)
		if protocol.StatusOf(err) == protocol.StatusTxnIncomplete {
			return errors.Join(fmt.Errorf("producer: transaction %s: %w (%w)", k.id, ErrTxnAborted, err), t.abortParts(ctx, parts))
		}
		if err != nil {
			return fmt.Errorf("producer: commit transaction %s: %w", k.id, err)
		}
		if !rep.Committed {
			t.end(false)
			return fmt.Errorf("producer: transaction %s: %w (by %s) before its commit", k.id, ErrTxnAborted, orUnknown(rep.By))
		}
	}
	t.end(true)
	return nil
}

// Prepare has every group of the transaction hold its messages as its
// sync set does, so that no failover loses one before the decision. Commit
// does it for a transaction on several groups; call it before the local
// work of a transaction a TxnChecker may commit (SendInTxn does), so that
// the checker's commit finds every message.
func (t *Txn) Prepare(ctx context.Context) error {
	ctx, cancel := t.c.bounded(ctx)
	defer cancel()
	if err := t.wait(ctx); err != nil {
		return err
	}
	t.mu.Lock()
	parts, failed := t.parts, t.err
	t.mu.Unlock()
	if failed != nil {
		return fmt.Errorf("producer: transaction %s: a message failed: %w", t.id, failed)
	}
	if err := t.prepareParts(ctx, parts); err != nil {
		return err
	}
	t.mu.Lock()
	t.prepared = true
	t.mu.Unlock()
	return nil
}

// prepareParts prepares every part: ErrTxnAborted when a group lacks
// messages (TXN_INCOMPLETE) or it was decided aborted before.
func (t *Txn) prepareParts(ctx context.Context, parts map[txnPartKey]txnPart) error {
	for k, p := range parts {
		body, _ := json.Marshal(protocol.TxnEndRequest{Producer: k.id.Producer, Epoch: k.id.Epoch, Number: k.id.Number,
			By: protocol.TxnByProducer, Seqs: p.lastSeqs(), Prepare: true})
		var rep protocol.TxnEndReply
		err := t.c.callMaster(ctx, p.topic, p.queue, protocol.CodeTxnEnd, body, &rep)
		switch {
		case protocol.StatusOf(err) == protocol.StatusTxnIncomplete:
			return fmt.Errorf("producer: transaction %s: %w (%w)", k.id, ErrTxnAborted, err)
		case err != nil:
			return fmt.Errorf("producer: prepare transaction %s in group %s: %w", k.id, p.group, err)
		case !rep.Prepared && !rep.Committed:
			return fmt.Errorf("producer: transaction %s: %w before its commit", k.id, ErrTxnAborted)
		}
	}
	return nil
}

// CommitOffsets adds a consumer group member's offsets (see the consumer's
// TxnOffsets) to the transaction: the registry commits them in the same
// write as the transaction, so an input's offset moves exactly when the
// outputs made from it are committed (consume-transform-produce exactly
// once). A refusal (the member no longer holds a queue) aborts the
// transaction at Commit.
func (t *Txn) CommitOffsets(req *api.CommitRequest) {
	t.mu.Lock()
	t.offsets = req
	t.mu.Unlock()
}

// Abort aborts the transaction: none of its messages is delivered. It
// waits for the messages in flight first.
func (t *Txn) Abort(ctx context.Context) error {
	ctx, cancel := t.c.bounded(ctx)
	defer cancel()
	t.mu.Lock()
	t.closing = true
	t.mu.Unlock()
	if err := t.wait(ctx); err != nil {
		return err
	}
	t.mu.Lock()
	ended, parts := t.ended, t.parts
	t.mu.Unlock()
	if ended {
		return ErrTxnEnded
	}
	return t.abortParts(ctx, parts)
}

// abortParts aborts every part (and the group of its first message, which
// may hold messages of unknown outcome) and ends the transaction once all
// are. A transaction on one group is aborted at its master; on several (or
// with offsets), through the registry first, whose decision (the first
// made) every group then applies.
func (t *Txn) abortParts(ctx context.Context, parts map[txnPartKey]txnPart) error {
	t.mu.Lock()
	if k := (txnPartKey{t.id, t.first.group}); t.first.group != "" && parts[k].group == "" {
		parts = maps.Clone(parts)
		parts[k] = t.first
	}
	viaRegistry := len(parts) > 1 || t.offsets != nil
	t.mu.Unlock()
	if viaRegistry {
		for id := range t.ids(parts) {
			d, err := t.c.meta.DecideTxn(ctx, api.TxnDecideRequest{Producer: id.Producer, Epoch: id.Epoch, Number: id.Number,
				By: protocol.TxnByProducer, Groups: partGroups(parts)})
			if err != nil {
				return fmt.Errorf("producer: abort transaction %s: %w", id, metaErr("transaction decision", err))
			}
			if d.Committed {
				return fmt.Errorf("producer: abort transaction %s: it was committed before (by %s)", id, orUnknown(d.By))
			}
		}
		if err := t.tellParts(ctx, parts, false); err != nil {
			return err
		}
		t.end(false)
		return nil
	}
	var errs []error
	for k, p := range parts {
		rep, err := t.c.endTxn(ctx, k.id, p, false, protocol.TxnByProducer)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("producer: abort transaction %s: %w", k.id, err))
		case rep.Committed:
			errs = append(errs, fmt.Errorf("producer: abort transaction %s: it was committed before", k.id))
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	t.end(false)
	return nil
}

// tellParts tells every part's master the registry's decision, then, in
// the background, the registry which groups applied it. A group not told
// before ctx ends learns the decision from the registry at its timeout.
func (t *Txn) tellParts(ctx context.Context, parts map[txnPartKey]txnPart, commit bool) error {
	var errs []error
	done := map[protocol.TxnID][]string{}
	for k, p := range parts {
		rep, err := t.c.endTxn(ctx, k.id, p, commit, protocol.TxnByProducer)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("group %s: %w", p.group, err))
			continue
		case rep.Committed != commit:
			// Never after a registry's decision: say so loudly.
			errs = append(errs, fmt.Errorf("group %s decided the other way (by %s)", p.group, orUnknown(rep.By)))
			continue
		}
		done[k.id] = append(done[k.id], p.group)
	}
	t.c.txnDone(done)
	if len(errs) > 0 && !commit {
		return fmt.Errorf("producer: abort transaction %s: %w", t.id, errors.Join(errs...))
	}
	if len(errs) > 0 {
		t.c.cfg.Logger.Warn("producer: a committed transaction's groups not told yet: they apply it at their timeout", "txn", t.id.String(), "error", errors.Join(errs...))
	}
	return nil
}

// refusal reports whether a decision's error says nothing was recorded:
// a known status that neither a retry nor the outcome being unknown
// (INTERNAL, TIMEOUT: maybe written) can change.
func refusal(st protocol.Status) bool { return st.Known() && !st.Retriable() && !st.MaybeStored() }

// txnDone reports to the registry, in the background, the groups that
// applied its decisions.
func (c *Client) txnDone(done map[protocol.TxnID][]string) {
	if len(done) == 0 {
		return
	}
	report := func(ctx context.Context) {
		ctx, cancel := context.WithTimeout(ctx, c.cfg.requestTimeout)
		defer cancel()
		for id, groups := range done {
			if err := c.meta.TxnDone(ctx, api.TxnDoneRequest{Producer: id.Producer, Epoch: id.Epoch, Number: id.Number, Groups: groups}); err != nil {
				c.cfg.Logger.Warn("producer: reporting a transaction's decision applied failed (the registry forgets it after 7 days)", "txn", id.String(), "error", err)
			}
		}
	}
	c.sinks.mu.Lock() // Close marks the producer dead under it before it waits for life.wg
	dead := c.life.dead.Load()
	if !dead {
		c.life.wg.Add(1)
	}
	c.sinks.mu.Unlock()
	if dead {
		report(context.Background()) // closing: at once, bounded by RequestTimeout
		return
	}
	go func() {
		defer c.life.wg.Done()
		report(c.life.ctx)
	}()
}

// partGroups are the groups of parts, sorted.
func partGroups(parts map[txnPartKey]txnPart) []string {
	var out []string
	for k := range parts {
		if !slices.Contains(out, k.group) {
			out = append(out, k.group)
		}
	}
	slices.Sort(out)
	return out
}

// end marks the transaction ended (committed or aborted, as counted) and
// lets the producer begin another.
func (t *Txn) end(committed bool) {
	if committed {
		t.c.stats.add(sdkmetrics.ProducerTxnCommits)
	} else {
		t.c.stats.add(sdkmetrics.ProducerTxnAborts)
	}
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
	// Prepared before the work: should this process die after the work
	// committed, the checker's commit finds every message.
	if err := t.Prepare(ctx); err != nil {
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
	q, _, ok := c.router.queueRoute(topic, queue)
	if !ok {
		if _, err := c.router.cache.Lookup(ctx, topic); err != nil {
			return lookupErr(err)
		}
		q, _, ok = c.router.queueRoute(topic, queue)
	}
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
