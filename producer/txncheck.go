package producer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/sdkmetrics"
)

// TxnDecision is a TxnChecker's answer.
type TxnDecision int

const (
	// TxnUnknown: the checker cannot tell yet; it is asked again at the
	// next check, at most MaxTxnChecks times, then the transaction is
	// aborted.
	TxnUnknown TxnDecision = iota
	// TxnCommit: the application's work committed: deliver the messages.
	TxnCommit
	// TxnAbort: it did not: drop them.
	TxnAbort
)

// MaxTxnChecks is how many times a checker may answer TxnUnknown for one
// transaction before the producer aborts it (recorded as decided by
// protocol.TxnByChecks, which `ferryctl txn ls` shows).
const MaxTxnChecks = 15

// TxnCheck is an open transaction left by an earlier instance of the
// producer's Identity, for its TxnChecker to resolve.
type TxnCheck struct {
	ID     protocol.TxnID
	Group  string    // the broker group holding it
	Began  time.Time // by the master's clock
	Queues []protocol.TxnQueue
}

// TxnChecker says whether the application's work of an open transaction
// committed: the check-back of RocketMQ's transactional messages. It runs
// on the producer's own goroutine and should honour ctx.
type TxnChecker func(ctx context.Context, t TxnCheck) TxnDecision

// CheckTxns resolves, with check, the transactions an earlier instance of
// this producer's Identity left open (it died, or lost its connection,
// between a transaction's messages and its commit or abort): at start (the
// producer takes its identity at once) and every TxnCheckInterval, it asks
// the masters of the groups holding topics' queues for the open
// transactions of its producer id and hands check those of earlier epochs.
// Without a checker, such a transaction is aborted by its broker at the
// broker's transaction timeout.
func CheckTxns(check TxnChecker, topics ...string) Opt {
	return optFunc(func(c *config) { c.txnCheck, c.txnTopics = check, topics })
}

// TxnCheckInterval is how often CheckTxns looks (default 10 s).
func TxnCheckInterval(d time.Duration) Opt { return optFunc(func(c *config) { c.txnCheckEvery = d }) }

// txnChecks is the checker's state: how many times each transaction was
// answered TxnUnknown. Only the checker's goroutine touches it.
type txnChecks struct {
	unknown map[protocol.TxnID]int
}

// runTxnChecks is the checker's goroutine (under life.wg).
func (c *Client) runTxnChecks() {
	defer c.life.wg.Done()
	ctx := c.life.ctx
	c.checks.unknown = map[protocol.TxnID]int{}
	for {
		if err := c.takeIdentity(ctx); err == nil {
			if err := c.checkTxns(ctx); err != nil && ctx.Err() == nil {
				c.cfg.Logger.Warn("producer: checking transactions left open", "error", err)
			}
		}
		select {
		case <-c.life.stop:
			return
		case <-c.cfg.clock.After(c.cfg.txnCheckEvery):
		}
	}
}

// checkTxns is one round of the checker.
func (c *Client) checkTxns(ctx context.Context) error {
	cur := c.ident.Load()
	body, _ := json.Marshal(protocol.TxnListRequest{Producer: cur.id})
	var errs []error
	listed := map[protocol.TxnID]bool{}
	defer func() {
		for id := range c.checks.unknown {
			if !listed[id] && len(errs) == 0 {
				delete(c.checks.unknown, id) // decided elsewhere
			}
		}
	}()
	for _, g := range c.txnGroups(ctx, &errs) {
		var list protocol.TxnList
		if err := c.callMaster(ctx, g.topic, g.queue, protocol.CodeTxnList, body, &list); err != nil {
			errs = append(errs, err)
			continue
		}
		live := c.liveTxn()
		for _, info := range list.Open {
			id := protocol.TxnID{Producer: info.Producer, Epoch: info.Epoch, Number: info.Number}
			if id.Producer != cur.id || id.Epoch >= cur.epoch || id == live {
				continue // this instance's own: its application commits or aborts it
			}
			listed[id] = true
			if err := c.resolve(ctx, id, g, info); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// liveTxn is the id of this instance's open transaction (zero: none).
func (c *Client) liveTxn() protocol.TxnID {
	c.txnMu.Lock()
	defer c.txnMu.Unlock()
	if c.txn == nil {
		return protocol.TxnID{}
	}
	return c.txn.id
}

// txnGroups is one queue of each group holding a queue of the checked
// topics.
func (c *Client) txnGroups(ctx context.Context, errs *[]error) []txnPart {
	seen := map[string]bool{}
	var out []txnPart
	for _, topic := range c.cfg.txnTopics {
		e, err := c.router.cache.Lookup(ctx, topic)
		if err != nil {
			*errs = append(*errs, lookupErr(err))
			continue
		}
		for _, q := range e.Route.Queues {
			if !seen[q.Group] {
				seen[q.Group] = true
				out = append(out, txnPart{group: q.Group, topic: topic, queue: q.Queue})
			}
		}
	}
	return out
}

// resolve asks the checker about one transaction and decides it.
func (c *Client) resolve(ctx context.Context, id protocol.TxnID, g txnPart, info protocol.TxnInfo) error {
	c.stats.add(sdkmetrics.ProducerTxnChecks)
	d := c.cfg.txnCheck(ctx, TxnCheck{ID: id, Group: g.group, Began: time.UnixMilli(info.Began), Queues: info.Queues})
	by := protocol.TxnByChecker
	if d == TxnUnknown {
		c.checks.unknown[id]++
		if c.checks.unknown[id] < MaxTxnChecks {
			return nil
		}
		d, by = TxnAbort, protocol.TxnByChecks
	}
	delete(c.checks.unknown, id)
	// The registry decides (the transaction may be on other groups too:
	// the first decision there is every group's), then this group applies.
	dec, err := c.meta.DecideTxn(ctx, api.TxnDecideRequest{Producer: id.Producer, Epoch: id.Epoch, Number: id.Number,
		Commit: d == TxnCommit, By: by, Groups: []string{g.group}})
	if err != nil {
		return fmt.Errorf("producer: resolve transaction %s: %w", id, metaErr("transaction decision", err))
	}
	rep, err := c.endTxn(ctx, id, g, dec.Committed, by)
	if err != nil {
		return fmt.Errorf("producer: resolve transaction %s: %w", id, err)
	}
	if rep.Committed != dec.Committed {
		return fmt.Errorf("producer: resolve transaction %s: group %s decided the other way (by %s) than the registry", id, g.group, orUnknown(rep.By))
	}
	c.txnDone(map[protocol.TxnID][]string{id: {g.group}})
	return nil
}
