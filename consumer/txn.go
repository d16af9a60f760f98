package consumer

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/ferrymq/ferrymq/metaserver/api"
)

// Consume-transform-produce exactly once (Kafka's sendOffsetsToTransaction):
// a ManualCommit consumer in poll style hands the offsets of a batch to a
// producer transaction (TxnOffsets, then the producer's Txn.CommitOffsets),
// and the registry commits them in the same Raft write as the transaction's
// decision. An input's offset thus moves exactly when the outputs made from
// it are committed: a crash before the decision leaves both undone (the
// inputs are delivered again, the outputs never), a crash after it leaves
// both done. The consumer is then told the outcome: TxnCommitted (its own
// commits never move those queues back, and it does not deliver those
// messages again) or TxnAborted (it delivers those queues again, so the
// inputs are transformed again).
//
// The offsets are a commit of the member's queues in its generation
// (group, member, generation, offset, epoch): the registry checks them as
// it checks the member's commits, and refuses them once the generation
// moved on (any rebalance, another member taking a queue, a newer instance
// fencing this one). The producer's Commit then aborts the transaction (ErrTxnAborted),
// so a zombie's outputs are never committed.

// ErrQueueLost is returned by TxnOffsets for a message of a queue the
// member no longer holds (its queue was let go, its lease lapsed, or the
// consumer delivered it again after TxnAborted): the batch is void, its
// outputs must not commit; the queue's owner delivers the message again,
// and this member the batch's messages of the queues it still holds.
var ErrQueueLost = errors.New("consumer: the member no longer holds the message's queue")

// errTxnNeedsPoll: TxnOffsets of a consumer whose own commits could move
// the offsets past a transaction's inputs before it commits.
var errTxnNeedsPoll = errors.New("consumer: transaction offsets need a ManualCommit consumer in poll style (Poll)")

// TxnOffsets returns the commit that moves the offsets of msgs' queues past
// msgs (messages Poll delivered to a ManualCommit consumer), for a producer
// transaction to carry (Txn.CommitOffsets). Every message Poll delivered
// before one of msgs in its queue must be in msgs or marked processed
// (MarkProcessed), or the offset would pass an input whose outputs are in
// no transaction. Messages of a transaction are not processed until
// TxnCommitted: the consumer's own commits (Commit, a queue let go, Close)
// stop before them. It fails with ErrQueueLost when the member no longer
// holds a queue of msgs: the batch is void then (its outputs must not be
// committed), and the consumer delivers its messages of the queues it still
// holds again, as after TxnAborted. It fails also for a message already
// processed or committed (its outputs would be committed twice).
func (c *Consumer) TxnOffsets(msgs ...*Message) (*api.CommitRequest, error) {
	if !c.cfg.manualCommit || mode(c.mode.Load()) != modePoll {
		return nil, errTxnNeedsPoll
	}
	if len(msgs) == 0 {
		return nil, errors.New("consumer: transaction offsets of no message")
	}
	byPart := map[*part][]int64{}
	for _, m := range msgs {
		if m == nil || m.part == nil || m.part.c != c {
			return nil, errors.New("consumer: transaction offsets of a message this consumer's Poll did not deliver")
		}
		byPart[m.part] = append(byPart[m.part], m.Offset)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if lost := c.lostLocked(byPart); lost != nil {
		// The batch is void: its outputs must not commit, and the queues
		// still held deliver its messages again, so that the next batch's
		// offsets pass nothing transformed in no transaction.
		for p := range byPart {
			if !c.closed && c.parts[p.key] == p {
				c.parts[p.key] = p.restart()
			}
		}
		return nil, fmt.Errorf("%w: %s", ErrQueueLost, lost.key)
	}
	// By generation, not incarnation: a member that lost a queue and got it
	// back (same incarnation) must not commit offsets built before (a
	// rebalance meanwhile makes the transaction abort, and the inputs come
	// again).
	req := &api.CommitRequest{Group: c.group, Member: c.cfg.member, Generation: c.gen}
	for p, offs := range byPart {
		o, err := p.txnOffset(offs)
		if err != nil {
			return nil, err
		}
		req.Offsets = append(req.Offsets, o)
	}
	slices.SortFunc(req.Offsets, func(a, b api.QueueOffset) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Queue, b.Queue))
	})
	return req, nil
}

// lostLocked returns a part of parts the member no longer holds (nil:
// none). Called with c.mu held.
func (c *Consumer) lostLocked(parts map[*part][]int64) *part {
	for p := range parts {
		p.mu.Lock()
		revoked := p.revoked
		p.mu.Unlock()
		if c.closed || revoked || c.parts[p.key] != p {
			return p
		}
	}
	return nil
}

// txnOffset is the part's commit once offs (handed out, in a transaction)
// are processed: where the member's own commit would then put the queue.
func (p *part) txnOffset(offs []int64) (api.QueueOffset, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	last := slices.Max(offs)
	var left []int64
	for _, o := range p.pending {
		if !slices.Contains(offs, o) {
			left = append(left, o)
		}
	}
	if len(left) > 0 && left[0] < last {
		return api.QueueOffset{}, fmt.Errorf("consumer: transaction offsets of %s past offset %d, delivered before them and neither in the transaction nor processed", p.key, left[0])
	}
	if len(p.pending)-len(left) != len(offs) {
		return api.QueueOffset{}, fmt.Errorf("consumer: transaction offsets of %s: a message already processed or committed, or named twice", p.key)
	}
	pos := p.delivered
	if len(left) > 0 {
		pos = left[0]
	}
	epoch, group := p.epochNow()
	return api.QueueOffset{Topic: p.key.topic, Queue: p.key.queue, Offset: pos, Epoch: epoch, EpochGroup: group, Rewound: p.rewound}, nil
}

// TxnCommitted tells the consumer that a transaction carrying req (from
// TxnOffsets) committed: the producer's Commit returned nil. Its messages
// are processed and their offsets committed: the consumer's own later
// commits never move those queues back, and it does not deliver them
// again. A queue the member no longer holds is left alone (the registry
// has its offset).
func (c *Consumer) TxnCommitted(req *api.CommitRequest) {
	for p, o := range c.txnParts(req) {
		p.mu.Lock()
		if !p.revoked {
			p.pending = slices.DeleteFunc(p.pending, func(off int64) bool { return off < o.Offset })
		}
		if o.Rewound {
			p.committed, p.rewound = o.Offset, false
		} else {
			p.committed = max(p.committed, o.Offset)
		}
		p.mu.Unlock()
	}
}

// TxnAborted tells the consumer that a transaction carrying req (from
// TxnOffsets) did not commit: the producer's Commit returned
// ErrTxnAborted, or Abort returned nil. The consumer delivers those queues
// again from their first message not processed (not marked, nor in a
// committed transaction: in a loop that marks nothing itself, the
// registry's committed offset), dropping what it buffered or delivered past
// it; so Poll hands the transaction's inputs out again, to be transformed
// again. Messages of those queues delivered before are void (TxnOffsets
// refuses them with ErrQueueLost).
func (c *Consumer) TxnAborted(req *api.CommitRequest) {
	parts := c.txnParts(req)
	c.mu.Lock()
	defer c.mu.Unlock()
	for p := range parts {
		if c.closed || c.parts[p.key] != p {
			continue // let go meanwhile: its next owner reads from the committed offset
		}
		c.parts[p.key] = p.restart()
	}
}

// restart stops the part and returns a new one of its queue, reading again
// from its first message not processed. Called with c.mu held.
func (p *part) restart() *part {
	c := p.c
	p.mu.Lock()
	from, committed, rewound, share := p.processedLocked(), p.committed, p.rewound, p.share
	p.mu.Unlock()
	p.stop()
	np := newPart(c, p.key, from)
	np.committed, np.rewound, np.share = committed, rewound, share
	if e := p.readIn.Load(); e != nil {
		np.readIn.Store(e)
	}
	p.log.Info("a transaction aborted: delivering the queue again", "offset", from)
	c.fetchWG.Add(1)
	go np.fetch(from)
	return np
}

// txnParts are the parts req names that this member holds, with their
// offsets; none when req is another member's (or another instance's).
func (c *Consumer) txnParts(req *api.CommitRequest) map[*part]api.QueueOffset {
	if req == nil || req.Group != c.group || req.Member != c.cfg.member {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[*part]api.QueueOffset{}
	for _, o := range req.Offsets {
		if p := c.parts[qkey{o.Topic, o.Queue}]; p != nil {
			out[p] = o
		}
	}
	return out
}
