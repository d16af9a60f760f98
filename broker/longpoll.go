package broker

import (
	"container/heap"
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/storage"
)

const (
	// maxPullWait caps a PULL's WaitMillis.
	maxPullWait = 30 * time.Second
	// maxParkedPulls bounds the PULLs parked on one broker; past it a PULL
	// that finds nothing is answered at once, empty.
	maxParkedPulls = 10000
)

// pullKey names one queue.
type pullKey struct {
	topic string
	queue uint32
}

// parkedPull is a PULL waiting for its queue to grow.
type parkedPull struct {
	rep      replier
	req      protocol.PullRequest
	key      pullKey
	seen     int64 // the queue's next offset when it parked
	deadline time.Time
	at       int // its index in the deadline heap; -1 once taken out
}

// due reports whether a queue whose next offset is next has something for
// p: a message at its offset, or a log cut back under it (a slave's
// truncation), which its answer's header shows. Only who holds p may ask:
// run, under the lock, once p is parked (serveWoken moves a woken
// filtered PULL's offset).
func (p *parkedPull) due(next int64) bool { return dueAt(next, p.req.Offset, p.seen) }

func dueAt(next, offset, seen int64) bool { return next > offset || next < seen }

// longPoll holds PULLs that found nothing at their offset (at or past the
// queue's next offset: on a slave a consumer may be ahead of the copy)
// until a message for their queue is appended, their wait (WaitMillis,
// capped at maxPullWait) passes, or the broker stops. Nothing here holds a
// request worker or blocks the commit log's goroutines: a PULL's handler
// parks it and returns, the append paths only mark queues and signal run,
// and run, one goroutine per broker, reads the log and answers with Reply,
// which never blocks. The transport's reservation for a parked PULL's
// answer stays held until it is answered.
//
// Wake-ups: on a master the sender's completion (send.go, appended, on the
// commit log's writer or flusher goroutine) marks the queues that got
// messages, if any PULL of theirs is parked; on a slave the follower, which
// does not know which queues its raw records hold, marks every parked
// queue after each append. run reads each marked queue's range once and
// answers the PULLs it satisfies (the rest stay parked), so a slave's
// append costs one range look-up per parked queue.
//
// Deadlines are a heap on the broker's clock with one timer, set to the
// earliest; an expired PULL is answered with what its queue holds then
// (nothing, or a message that just came), with the usual header.
//
// A step-down or a truncation answers every parked PULL at once with what
// its queue holds (its header shows the queue's end, which a truncation
// may have moved back). Close answers them SHUTTING_DOWN (retriable), as
// it does parked HA fetches and new SENDs, so a consumer moves to the
// group's other broker at once rather than polling a closing one.
// Past maxParkedPulls a PULL is answered at once, empty.
type longPoll struct {
	store     queueReader
	clock     clockwork.Clock
	stats     *Stats
	lg        hclog.Logger
	maxParked int
	maxWait   time.Duration

	parked atomic.Int64  // len(heap), read by the append paths without the lock
	wake   chan struct{} // capacity 1: run has something to look at

	mu      sync.Mutex
	byKey   map[pullKey][]*parkedPull
	heap    pullHeap
	dirty   map[pullKey]struct{} // queues that got messages since run last looked
	all     bool                 // look at every parked queue (a slave's append)
	release bool                 // answer every parked PULL now (step-down, truncation)
	closed  bool
}

func newLongPoll(store queueReader, clock clockwork.Clock, stats *Stats, lg hclog.Logger) *longPoll {
	return &longPoll{store: store, clock: clock, stats: stats, lg: lg, maxParked: maxParkedPulls, maxWait: maxPullWait,
		wake: make(chan struct{}, 1), byKey: map[pullKey][]*parkedPull{}, dirty: map[pullKey]struct{}{}}
}

func (lp *longPoll) signal() {
	select {
	case lp.wake <- struct{}{}:
	default:
	}
}

// park holds req, which found the queue's next offset at next (at or before
// its offset), and reports true; it reports false when the PULL is to be
// answered at once (too many parked). After Close it answers SHUTTING_DOWN
// itself. It runs on a request worker and never waits.
func (lp *longPoll) park(rep replier, req protocol.PullRequest, next int64) bool {
	wait := min(time.Duration(req.WaitMillis)*time.Millisecond, lp.maxWait)
	p := &parkedPull{rep: rep, req: req, key: pullKey{req.Topic, req.Queue}, seen: next, deadline: lp.clock.Now().Add(wait)}
	return lp.enqueue(p, true)
}

// enqueue parks p (fresh: a PULL not parked before, refused with false
// when too many are parked) and reports true.
func (lp *longPoll) enqueue(p *parkedPull, fresh bool) bool {
	rep, req, seen := p.rep, p.req, p.seen // once parked, p is run's
	lp.mu.Lock()
	switch {
	case lp.closed:
		lp.mu.Unlock()
		rep.ReplyError(&protocol.Error{Status: protocol.StatusShuttingDown, Message: "the broker is shutting down"})
		return true
	case fresh && len(lp.heap) >= lp.maxParked:
		lp.mu.Unlock()
		lp.stats.PullsOverflow.Add(1)
		return false
	}
	heap.Push(&lp.heap, p)
	lp.byKey[p.key] = append(lp.byKey[p.key], p)
	lp.countLocked()
	earliest := lp.heap[0] == p
	lp.mu.Unlock()
	// An append that completed between the caller's look and the parking
	// saw no parked PULL and woke nobody: look again. (An append after the
	// parking sees it: parked is written before this read of the log.)
	if cur := readableNext(lp.store, req.Topic, req.Queue, req.ReadUncommitted); dueAt(cur, req.Offset, seen) {
		if lp.take(p) {
			lp.stats.PullWakeups.Add(1)
			servePull(lp.store, rep, req)
		}
		return true
	}
	if earliest {
		lp.signal() // run's timer is set for a later deadline
	}
	return true
}

// serveWoken answers a PULL that its queue's growth woke. A filtered PULL
// that finds no message its filter takes (the queue grew by others only)
// parks again past them until its deadline, rather than be answered
// empty and come back.
func (lp *longPoll) serveWoken(p *parkedPull) {
	if p.req.Filter == "" {
		lp.stats.PullWakeups.Add(1)
		servePull(lp.store, p.rep, p.req)
		return
	}
	if diverged(lp.store, p.rep, p.req) {
		return // answered: a failover sent its reader back
	}
	n, past := serveRead(lp.store, p.rep, p.req, true)
	if n < 0 {
		p.req.Offset, p.seen = past, readableNext(lp.store, p.req.Topic, p.req.Queue, p.req.ReadUncommitted)
		lp.enqueue(p, false)
		return
	}
	lp.stats.PullWakeups.Add(1) // after its answer, which a filter decides
}

// take removes p if it is still parked and reports whether it was.
func (lp *longPoll) take(p *parkedPull) bool {
	lp.mu.Lock()
	if p.at < 0 {
		lp.mu.Unlock()
		return false
	}
	heap.Remove(&lp.heap, p.at)
	lp.unindexLocked(p)
	lp.countLocked()
	lp.mu.Unlock()
	return true
}

// countLocked publishes how many PULLs are parked. It is written under the
// lock, so the count the append paths read is never an older one.
func (lp *longPoll) countLocked() {
	lp.parked.Store(int64(len(lp.heap)))
	lp.stats.PullsParked.Store(int64(len(lp.heap)))
}

// unindexLocked removes p (already out of the heap) from byKey.
func (lp *longPoll) unindexLocked(p *parkedPull) {
	ps := lp.byKey[p.key]
	for i, q := range ps {
		if q == p {
			ps[i] = ps[len(ps)-1]
			ps[len(ps)-1] = nil
			ps = ps[:len(ps)-1]
			break
		}
	}
	if len(ps) == 0 {
		delete(lp.byKey, p.key)
	} else {
		lp.byKey[p.key] = ps
	}
}

// waiting reports whether any PULL is parked, without the lock.
func (lp *longPoll) waiting() bool { return lp != nil && lp.parked.Load() > 0 }

// appended marks the queues of the stored messages of a batch (good[j] is
// the index in msgs of the entry at pos[j]). It runs on the commit log's
// writer or flusher goroutine: it takes the lock for a moment when a PULL
// is parked, reads nothing, and hands the rest to run.
func (lp *longPoll) appended(msgs []protocol.Message, good []int, pos []storage.Position) {
	if !lp.waiting() {
		return
	}
	marked := false
	var last pullKey
	lp.mu.Lock()
	for j, i := range good {
		if pos[j].Err != nil || pos[j].Duplicate || msgs[i].Schedule.Kind == protocol.ScheduleDelayed {
			continue // nothing new to read in the queue (a delayed message is pending elsewhere)
		}
		k := pullKey{msgs[i].Topic, msgs[i].Queue}
		if j > 0 && k == last {
			continue
		}
		last = k
		if _, ok := lp.byKey[k]; ok {
			lp.dirty[k] = struct{}{}
			marked = true
		}
	}
	lp.mu.Unlock()
	if marked {
		lp.signal()
	}
}

// wakeQueues has run look at the PULLs parked on queues: a transaction
// writing them was decided, which may have moved their stable ends.
func (lp *longPoll) wakeQueues(queues []protocol.TxnQueue) {
	if !lp.waiting() {
		return
	}
	marked := false
	lp.mu.Lock()
	for _, q := range queues {
		k := pullKey{q.Topic, q.Queue}
		if _, ok := lp.byKey[k]; ok {
			lp.dirty[k] = struct{}{}
			marked = true
		}
	}
	lp.mu.Unlock()
	if marked {
		lp.signal()
	}
}

// appendedAny has run look at every parked PULL: a slave's follower
// appended records of queues it does not know.
func (lp *longPoll) appendedAny() {
	if !lp.waiting() {
		return
	}
	lp.mu.Lock()
	lp.all = true
	lp.mu.Unlock()
	lp.signal()
}

// releaseAll has run answer every parked PULL now with what its queue holds
// (usually nothing): the broker stepped down, or its log was cut back.
func (lp *longPoll) releaseAll() {
	if lp == nil {
		return
	}
	lp.mu.Lock()
	lp.release = true
	lp.mu.Unlock()
	lp.signal()
}

// run answers parked PULLs as their queues grow or their waits pass, until
// ctx ends; then it answers every parked PULL SHUTTING_DOWN, and park
// answers later ones so.
func (lp *longPoll) run(ctx context.Context) {
	timer := lp.clock.NewTimer(lp.maxWait)
	defer timer.Stop()
	var armed time.Time
	for {
		if next, ok := lp.step(lp.clock.Now()); !ok {
			timer.Stop()
			armed = time.Time{}
		} else if !next.Equal(armed) {
			timer.Reset(next.Sub(lp.clock.Now()))
			armed = next
			if !lp.clock.Now().Before(next) {
				// The clock passed next while the timer was set (a fake
				// clock moved by a test): the timer counts from then.
				lp.signal()
			}
		}
		select {
		case <-ctx.Done():
			lp.close()
			return
		case <-lp.wake:
		case <-timer.Chan():
			armed = time.Time{}
		}
	}
}

// step answers what is due at now and returns the earliest deadline left.
func (lp *longPoll) step(now time.Time) (time.Time, bool) {
	var expired, released []*parkedPull
	lp.mu.Lock()
	for len(lp.heap) > 0 && !lp.heap[0].deadline.After(now) {
		p := heap.Pop(&lp.heap).(*parkedPull)
		lp.unindexLocked(p)
		expired = append(expired, p)
	}
	if lp.release {
		for len(lp.heap) > 0 {
			p := heap.Pop(&lp.heap).(*parkedPull)
			released = append(released, p)
		}
		clear(lp.byKey)
		lp.release, lp.all = false, false
		clear(lp.dirty)
	}
	var keys []pullKey
	if lp.all {
		keys = make([]pullKey, 0, len(lp.byKey))
		for k := range lp.byKey {
			keys = append(keys, k)
		}
		lp.all = false
		clear(lp.dirty)
	} else if len(lp.dirty) > 0 {
		keys = make([]pullKey, 0, len(lp.dirty))
		for k := range lp.dirty {
			if _, ok := lp.byKey[k]; ok {
				keys = append(keys, k)
			}
		}
		clear(lp.dirty)
	}
	lp.mu.Unlock()

	// The queues' ranges are read outside the lock: the lock is never held
	// across a call into the log.
	var woken []*parkedPull
	if len(keys) > 0 {
		nexts := make([][2]int64, len(keys)) // committed, uncommitted
		for i, k := range keys {
			nexts[i][0] = readableNext(lp.store, k.topic, k.queue, false)
			nexts[i][1] = readableNext(lp.store, k.topic, k.queue, true)
		}
		lp.mu.Lock()
		for i, k := range keys {
			ps := lp.byKey[k]
			kept := ps[:0]
			for _, p := range ps {
				n := nexts[i][0]
				if p.req.ReadUncommitted {
					n = nexts[i][1]
				}
				if p.due(n) {
					heap.Remove(&lp.heap, p.at)
					woken = append(woken, p)
				} else {
					kept = append(kept, p)
				}
			}
			clear(ps[len(kept):])
			if len(kept) == 0 {
				delete(lp.byKey, k)
			} else {
				lp.byKey[k] = kept
			}
		}
		lp.mu.Unlock()
	}

	lp.mu.Lock()
	n := len(lp.heap)
	var earliest time.Time
	if n > 0 {
		earliest = lp.heap[0].deadline
	}
	lp.countLocked()
	lp.mu.Unlock()

	// Answers go out after the lock, the freshest first; each is counted
	// before it is sent (a woken one as it is answered: a filtered PULL
	// may park again).
	lp.stats.PullsReleased.Add(int64(len(released)))
	lp.stats.PullsExpired.Add(int64(len(expired)))
	for _, p := range woken {
		lp.serveWoken(p)
	}
	for _, p := range released {
		servePull(lp.store, p.rep, p.req)
	}
	for _, p := range expired {
		servePull(lp.store, p.rep, p.req) // a message that came just now is returned, not left waiting
	}
	return earliest, n > 0
}

// close answers every parked PULL SHUTTING_DOWN and refuses later ones.
func (lp *longPoll) close() {
	lp.mu.Lock()
	ps := lp.heap
	for _, p := range ps {
		p.at = -1
	}
	lp.heap = nil
	clear(lp.byKey)
	lp.closed = true
	lp.countLocked()
	lp.mu.Unlock()
	for _, p := range ps {
		p.rep.ReplyError(&protocol.Error{Status: protocol.StatusShuttingDown, Message: "the broker is shutting down"})
	}
}

// pullHeap orders parked PULLs by deadline; each knows its index.
type pullHeap []*parkedPull

func (h pullHeap) Len() int           { return len(h) }
func (h pullHeap) Less(i, j int) bool { return h[i].deadline.Before(h[j].deadline) }
func (h pullHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].at, h[j].at = i, j
}

func (h *pullHeap) Push(x any) {
	p := x.(*parkedPull)
	p.at = len(*h)
	*h = append(*h, p)
}

func (h *pullHeap) Pop() any {
	old := *h
	p := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	p.at = -1
	return p
}
