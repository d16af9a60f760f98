package producer

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/sdkmetrics"
)

// identity is the producer's (id, epoch) as the metaserver gave it. gen
// counts identities taken by this client (1 for the first): a queue's
// sequence belongs to one gen and restarts at 0 under the next.
type identity struct {
	id    uint64
	epoch uint16
	gen   uint64
}

// identitySource hands out producer identities: the metaserver, or a fake
// in tests.
type identitySource interface {
	initProducer(ctx context.Context, name string) (id uint64, epoch uint16, err error)
}

type metaIdentity struct{ meta *client.Client }

func (m metaIdentity) initProducer(ctx context.Context, name string) (uint64, uint16, error) {
	r, err := m.meta.InitProducer(ctx, name)
	return r.ID, r.Epoch, err
}

// initErr is metaErr of an identity request.
func initErr(err error) error { return metaErr("producer id", err) }

// ensureIdentity takes the producer's first identity, once, before the
// record's first batch can leave. The request ends by the record's delivery
// deadline (and RequestTimeout).
func (c *Client) ensureIdentity(rec *record) error {
	if c.ident.Load() != nil {
		return nil
	}
	ctx, cancel := context.WithDeadline(rec.ctx, rec.deadlineWithin(c.cfg.requestTimeout))
	defer cancel()
	return c.takeIdentity(ctx)
}

// takeIdentity takes the producer's first identity unless it has one.
func (c *Client) takeIdentity(ctx context.Context) error {
	if c.ident.Load() != nil {
		return nil
	}
	c.identMu.Lock()
	defer c.identMu.Unlock()
	if c.ident.Load() != nil {
		return nil
	}
	id, epoch, err := c.cfg.idSource.initProducer(ctx, c.cfg.name)
	if err != nil {
		return initErr(err)
	}
	c.setIdentity(id, epoch, 1)
	return nil
}

func (c *Client) setIdentity(id uint64, epoch uint16, gen uint64) {
	c.ident.Store(&identity{id: id, epoch: epoch, gen: gen})
	c.stats.producerID.Store(id)
	c.stats.epoch.Store(uint32(epoch))
}

// renewIdentity takes a new identity after an OUT_OF_ORDER_SEQUENCE under
// gen: the broker's state and the producer's diverged, so every queue
// restarts at sequence 0 under a fresh id (anonymous) or the next epoch
// (named). Sinks build no batch meanwhile; records whose delivery deadline
// passes while the metaserver cannot be reached fail. renewing is already
// set; it is cleared here. Runs under life.wg.
func (c *Client) renewIdentity(gen uint64) {
	defer c.life.wg.Done()
	c.identMu.Lock()
	defer c.identMu.Unlock()
	defer c.kickSinks()
	defer c.renewing.Store(false)
	if cur := c.ident.Load(); cur == nil || cur.gen != gen {
		return
	}
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithTimeout(c.life.ctx, c.cfg.requestTimeout)
		id, epoch, err := c.cfg.idSource.initProducer(ctx, c.cfg.name)
		cancel()
		if err == nil {
			c.setIdentity(id, epoch, gen+1)
			c.stats.add(sdkmetrics.ProducerRenewals)
			c.cfg.Logger.Info("new producer identity after OUT_OF_ORDER_SEQUENCE", "id", id, "epoch", epoch)
			return
		}
		err = initErr(err)
		c.cfg.Logger.Warn("producer id renewal failed", "error", err)
		for _, s := range c.sinks.all() {
			s.expire(time.Now(), err)
		}
		t := time.NewTimer(c.cfg.backoff(attempt, time.Second))
		select {
		case <-t.C:
		case <-c.life.stop:
			t.Stop()
			return
		}
	}
}

// Stats are the producer's counters since New.
type Stats struct {
	// ProducerID and Epoch are the current identity (0 and 0 before the
	// first send, or with idempotence off).
	ProducerID uint64
	Epoch      uint16
	// Duplicates counts messages a broker answered DUPLICATE: a retry of a
	// message already stored, answered with the original's offsets and not
	// stored again.
	Duplicates int64
	// PossibleDuplicates counts messages that had an attempt of unknown
	// outcome and were then sent again without their stamp (moved to
	// another queue, or re-stamped): they may be stored twice.
	// Result.PossibleDuplicate flags each.
	PossibleDuplicates int64
	// OutOfOrder counts OUT_OF_ORDER_SEQUENCE answers (each took a new
	// identity).
	OutOfOrder int64
	// Retries counts messages sent again after a failed attempt.
	Retries int64
	// Renewals counts identities taken after the first.
	Renewals int64
	// GivenUp counts SEND calls abandoned without an answer because a
	// route showed their group's master replaced (a new master or epoch),
	// or the group not writable while the call had waited RoutePoll. Their
	// messages had an unknown outcome and were retried like after a
	// timeout.
	GivenUp int64
	// TxnCommits and TxnAborts count this producer's transactions
	// committed and aborted; TxnChecks the open transactions of earlier
	// instances it asked its TxnChecker about.
	TxnCommits, TxnAborts, TxnChecks int64
}

// statCounters are Stats' counters, each also reported to the Metrics
// hooks as it moves.
type statCounters struct {
	producerID atomic.Uint64
	epoch      atomic.Uint32
	counts     [sdkmetrics.NumCounters]atomic.Int64
	hooks      sdkmetrics.Hooks
}

// add counts one event of counter k.
func (s *statCounters) add(k sdkmetrics.Counter) {
	s.counts[k].Add(1)
	s.hooks.Add(k, 1)
}

// Stats returns the producer's counters.
func (c *Client) Stats() Stats {
	s := &c.stats
	return Stats{
		ProducerID:         s.producerID.Load(),
		Epoch:              uint16(s.epoch.Load()),
		Duplicates:         s.counts[sdkmetrics.ProducerDuplicates].Load(),
		PossibleDuplicates: s.counts[sdkmetrics.ProducerPossibleDuplicates].Load(),
		OutOfOrder:         s.counts[sdkmetrics.ProducerOutOfOrder].Load(),
		Retries:            s.counts[sdkmetrics.ProducerRetries].Load(),
		Renewals:           s.counts[sdkmetrics.ProducerRenewals].Load(),
		GivenUp:            s.counts[sdkmetrics.ProducerGivenUp].Load(),
		TxnCommits:         s.counts[sdkmetrics.ProducerTxnCommits].Load(),
		TxnAborts:          s.counts[sdkmetrics.ProducerTxnAborts].Load(),
		TxnChecks:          s.counts[sdkmetrics.ProducerTxnChecks].Load(),
	}
}
