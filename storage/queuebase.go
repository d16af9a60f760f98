package storage

import (
	"errors"
	"fmt"
)

// A queue base: a queue that moved here from another log (a broker group
// took over a retired group's queue) continues at the queue offset where
// the other log left it, not at 0. SetQueueBase sets it for a queue this
// log holds no record of; the queue's first record then gets that offset,
// and its records carry it from there on (recovery and AppendRaw take a
// queue's first record at any offset, as after retention). A base is held
// in memory only until the queue's first record: its owner (the broker's
// route cache, which learns it from the registry) sets it again after a
// reopen or a truncation, before it appends to the queue.

var (
	// ErrBaseBelowNext is SetQueueBase's answer for a base below the
	// queue's next offset: the queue is past it already.
	ErrBaseBelowNext = errors.New("storage: queue base below the queue's next offset")
	// ErrQueueHasRecords is SetQueueBase's answer for a base above the next
	// offset of a queue the log holds records of: a queue's offsets have no
	// gaps.
	ErrQueueHasRecords = errors.New("storage: the queue has records")
)

// baseReq is a queued SetQueueBase, run by the writer between groups.
type baseReq struct {
	k    queueKey
	base int64
}

// SetQueueBase makes base the next offset of queue: its next record gets
// that queue offset, and its range is [base, base) until then. Setting the
// next offset the queue has is nothing; a base below it is
// ErrBaseBelowNext; a base above it for a queue the log holds records of
// is ErrQueueHasRecords. It waits for the appends queued before it, and
// appends queued after it see the base.
func (l *Log) SetQueueBase(topic string, queue uint32, base int64) error {
	if topic == "" || len(topic) > maxTopicLen || base < 0 {
		return fmt.Errorf("%w: queue base %d of %q/%d", ErrInvalidEntry, base, topic, queue)
	}
	ch := make(chan error, 1)
	l.enqueue(&appendReq{base: &baseReq{k: queueKey{topic, queue}, base: base}, done: func(_ []Position, err error) { ch <- err }})
	return <-ch
}

// setQueueBase runs a SetQueueBase; the caller holds the writer token.
func (l *Log) setQueueBase(b *baseReq) error {
	if l.broken != nil {
		return l.broken
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return ErrClosed
	}
	qi := l.index[b.k]
	var next int64
	if qi != nil {
		next = qi.next()
	}
	switch {
	case b.base == next:
		return nil
	case b.base < next:
		return fmt.Errorf("%w: %s/%d is at %d, past %d", ErrBaseBelowNext, b.k.topic, b.k.queue, next, b.base)
	case qi != nil && (len(qi.pos) > 0 || len(qi.parts) > 0):
		return fmt.Errorf("%w: %s/%d holds records up to %d; it cannot continue at %d", ErrQueueHasRecords, b.k.topic, b.k.queue, next, b.base)
	}
	l.index[b.k] = &queueIndex{first: b.base, base: b.base}
	return nil
}

// rawStartsQueue reports whether a raw record of queue k at queueOffset may
// start the queue there: the log holds no record of it (and this group
// placed none), and the offset is past its next (the master set a base).
// l.mu is read-held.
func (l *Log) rawStartsQueue(k queueKey, queueOffset, next int64, placed bool) bool {
	if placed || queueOffset <= next {
		return false
	}
	qi := l.index[k]
	return qi == nil || (len(qi.pos) == 0 && len(qi.parts) == 0)
}
