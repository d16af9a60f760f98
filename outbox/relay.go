package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"time"

	"github.com/ferrymq/ferrymq/producer"
	"github.com/ferrymq/ferrymq/protocol"
)

// dbTimeout bounds the database writes that end a pass: they run even when
// the relay is closing, so that Close leaves no row it sent undeleted
// unless the database fails.
const dbTimeout = 10 * time.Second

// errCrash is the relay's end that tests inject (config.afterSend): it
// stops where it is, as a process killed there would.
var errCrash = errors.New("outbox: relay crashed (injected)")

// term is what the relay holds while it holds the lease: the lease's end
// by this process's clock, and the producer it took for this term.
type term struct {
	until time.Time
	p     *producer.Client
}

// relay is the relay's loop: passes until no row is ready, then a wait for
// a notification, a flush, or the poll interval. It returns when ctx ends.
func (o *Outbox) relay(ctx context.Context) error {
	find, err := newFinder(o.shared)
	if err != nil {
		return fmt.Errorf("outbox: %w", err)
	}
	defer find.close()
	var t term
	defer o.endTerm(&t)
	poll := time.NewTicker(o.cfg.poll)
	defer poll.Stop()
	var flushes []chan struct{}
	for {
		idle, err := o.drain(ctx, find, &t)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, errCrash) {
			o.endTermQuietly(&t) // as if the process died: the lease is left to expire
			return err
		}
		if err != nil {
			o.cfg.logger.Warn("outbox pass failed", "error", err)
		}
		if idle {
			for _, f := range flushes {
				close(f)
			}
			flushes = nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-o.notify:
		case <-poll.C:
		case f := <-o.flushq:
			flushes = append(flushes, f)
		}
	}
}

// drain runs passes while they find rows. idle: the last pass, holding the
// lease, found no row ready.
func (o *Outbox) drain(ctx context.Context, find *finder, t *term) (idle bool, err error) {
	for ctx.Err() == nil {
		n, held, err := o.pass(ctx, find, t)
		if err != nil || !held {
			return false, err
		}
		if n == 0 {
			return true, nil
		}
	}
	return false, ctx.Err()
}

// endTerm closes the term's producer and gives the lease up.
func (o *Outbox) endTerm(t *term) {
	if t.p != nil {
		_ = t.p.Close()
		t.p = nil
	}
	if !t.until.IsZero() {
		ctx, cancel := context.WithTimeout(context.Background(), dbTimeout)
		defer cancel()
		if _, err := o.db.ExecContext(ctx, o.q.release, o.cfg.table, o.owner); err != nil {
			o.cfg.logger.Warn("outbox lease not given up", "error", err)
		}
		t.until = time.Time{}
	}
}

// holdLease takes or renews the table's lease. A lease taken afresh (not
// renewed from an unexpired one) starts a term: a new producer, whose new
// epoch fences the previous term's (this relay's or another's) at every
// queue it writes to.
func (o *Outbox) holdLease(ctx context.Context, t *term) (bool, error) {
	start := time.Now()
	if t.until.IsZero() { // not holding it: the row may not exist yet
		if _, err := o.db.ExecContext(ctx, o.q.leaseRow, o.cfg.table); err != nil {
			return false, fmt.Errorf("lease row: %w", err)
		}
	}
	res, err := o.db.ExecContext(ctx, o.q.lease, o.owner, o.cfg.leaseTTL.Milliseconds(), o.cfg.table, o.owner)
	if err != nil {
		return false, fmt.Errorf("take lease: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("take lease: %w", err)
	}
	if n != 1 {
		if t.p != nil || !t.until.IsZero() {
			o.cfg.logger.Info("outbox lease lost")
		}
		o.endTermQuietly(t)
		return false, nil
	}
	if start.After(t.until) || t.p == nil {
		if t.p != nil {
			_ = t.p.Close()
			t.p = nil
		}
		p, err := producer.New(o.producerOpts()...)
		if err != nil {
			return false, fmt.Errorf("producer: %w", err)
		}
		t.p = p
	}
	t.until = start.Add(o.cfg.leaseTTL)
	return true, nil
}

// endTermQuietly drops the term's producer without touching the lease,
// which another relay holds.
func (o *Outbox) endTermQuietly(t *term) {
	if t.p != nil {
		_ = t.p.Close()
		t.p = nil
	}
	t.until = time.Time{}
}

func (o *Outbox) producerOpts() []producer.Opt {
	opts := make([]producer.Opt, 0, len(o.cfg.client)+len(o.cfg.producerOpts)+1)
	for _, c := range o.cfg.client {
		opts = append(opts, c)
	}
	opts = append(opts, o.cfg.producerOpts...)
	return append(opts, producer.Identity(o.name))
}

// sendResult is one row's send outcome.
type sendResult struct {
	res producer.Result
	err error
}

// pass takes up to a batch of ready rows, marks them attempted, sends them
// (an attempted row only once a lookup says it is not stored) and deletes
// the stored ones. n is the rows taken; held whether the relay holds the
// lease.
func (o *Outbox) pass(ctx context.Context, find *finder, t *term) (n int, held bool, err error) {
	if held, err := o.holdLease(ctx, t); !held || err != nil {
		return 0, false, err
	}
	// Sends end well before the lease could pass to another relay, which
	// then looks up what this one sent. They are not cut by ctx: Close
	// waits for the pass.
	deadline := t.until.Add(-o.cfg.leaseTTL / 4)
	if !time.Now().Before(deadline) {
		return 0, true, fmt.Errorf("taking the lease took over %v (LeaseTTL less a quarter): no time left to send", o.cfg.leaseTTL*3/4)
	}
	sendCtx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	defer cancel()
	rows, err := o.readyRows(ctx, o.cfg.batch)
	if err != nil || len(rows) == 0 {
		return 0, true, err
	}
	o.stats.passes.Add(1)
	dbCtx, cancelDB := context.WithTimeout(context.WithoutCancel(ctx), dbTimeout)
	defer cancelDB()

	// An attempted row may be stored already (its relay died, or lost its
	// lease, before deleting it): it is sent again only if a lookup says
	// it is not. A keyed row put off here holds its key's later rows back
	// for this pass (the ready query holds them in later passes).
	var done, toSend []row
	var later retries
	blocked := map[[2]string]bool{}
	look := find.pass()
	for _, r := range rows {
		if r.key != "" && blocked[[2]string{r.topic, r.key}] {
			continue
		}
		var found bool
		var lookupErr error
		if r.attempts > 0 {
			found, lookupErr = look.stored(sendCtx, &r, o.cfg.margin)
		}
		switch {
		case lookupErr != nil:
			later.add(o.retryLater(dbCtx, r, lookupErr), lookupErr)
			blocked[[2]string{r.topic, r.key}] = true
		case found:
			o.stats.resolved.Add(1)
			done = append(done, r)
		default:
			toSend = append(toSend, r)
		}
	}
	defer later.log(o.cfg.logger)
	if len(toSend) > 0 {
		if err := o.markAttempted(ctx, toSend); err != nil {
			return len(rows), true, errors.Join(err, o.deleteRows(dbCtx, done), later.dbErr)
		}
	}
	results := o.send(sendCtx, t.p, toSend)
	if o.cfg.afterSend != nil && o.cfg.afterSend(len(toSend)) {
		return len(rows), true, errCrash
	}
	var fenced bool
	for i, r := range toSend {
		res := results[i]
		switch {
		case res.err == nil:
			if res.res.Duplicate {
				o.stats.resolved.Add(1)
			} else {
				o.stats.sent.Add(1)
			}
			if res.res.PossibleDuplicate {
				o.stats.possibleDups.Add(1)
			}
			done = append(done, r)
		case errors.Is(res.err, protocol.ErrInvalid) || errors.Is(res.err, protocol.ErrMessageTooLarge):
			later.dbErr = errors.Join(later.dbErr, o.fail(dbCtx, r, res.err))
		default:
			fenced = fenced || errors.Is(res.err, producer.ErrFenced)
			later.add(o.retryLater(dbCtx, r, res.err), res.err)
		}
	}
	if fenced {
		// Another relay of this name sent after this one's lease term
		// began: this term is over; the next lease taken starts another.
		o.endTermQuietly(t)
	}
	// A row not put off as it should be would come back at once: the
	// error ends the drain until the next poll.
	return len(rows), true, errors.Join(o.deleteRows(dbCtx, done), later.dbErr)
}

// retries are a pass's rows left for later: counted and logged once per
// pass (the first cause), and the errors of putting them off.
type retries struct {
	n     int
	first error
	dbErr error
}

func (rs *retries) add(dbErr, cause error) {
	rs.n++
	if rs.first == nil {
		rs.first = cause
	}
	rs.dbErr = errors.Join(rs.dbErr, dbErr)
}

func (rs *retries) log(l *slog.Logger) {
	if rs.n > 0 {
		l.Warn("outbox messages not sent, retried later", "rows", rs.n, "error", rs.first)
	}
}

// send sends the rows' messages at once and waits for every result.
func (o *Outbox) send(ctx context.Context, p *producer.Client, rows []row) []sendResult {
	results := make([]sendResult, len(rows))
	var wg sync.WaitGroup
	wg.Add(len(rows))
	for i := range rows {
		r := &rows[i]
		props := maps.Clone(r.props)
		if props == nil {
			props = map[string]string{}
		}
		props[IDProperty] = r.msgID
		m := &producer.Message{Topic: r.topic, Key: sendKey(r), Tag: r.tag, Properties: props, Body: r.body, Reliability: r.reliability}
		p.SendAsync(ctx, m, func(res producer.Result, err error) {
			results[i] = sendResult{res, err}
			wg.Done()
		})
	}
	wg.Wait()
	return results
}

// retryLater leaves row r for a pass after its backoff, and no sooner than
// a quarter of the lease: a send given up at its deadline may still reach
// the broker, and the lookup before the next attempt must see it, as it
// must after a relay's death (see the package doc).
func (o *Outbox) retryLater(ctx context.Context, r row, cause error) error {
	o.stats.retried.Add(1)
	wait := o.cfg.backoff
	for i := 0; i < r.attempts && wait < o.cfg.maxBackoff; i++ {
		wait *= 2
	}
	wait = max(min(wait, o.cfg.maxBackoff), o.cfg.leaseTTL/4)
	return o.putOff(ctx, r, wait, cause, false)
}

// fail marks row r failed for good: kept, skipped, and reported.
func (o *Outbox) fail(ctx context.Context, r row, cause error) error {
	o.stats.failed.Add(1)
	err := o.putOff(ctx, r, 0, cause, true)
	if o.cfg.onFailed != nil {
		o.cfg.onFailed(FailedRow{RowID: r.id, ID: r.msgID, Topic: r.topic, Err: cause})
	} else {
		o.cfg.logger.Error("outbox message refused for good, kept in its table as failed", "id", r.msgID, "topic", r.topic, "row", r.id, "error", cause)
	}
	return err
}
