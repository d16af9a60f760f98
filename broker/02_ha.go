package broker

import (
	"sync"
	"time"

	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/protocol"
)

// replication is the master's side of HA sync. The slave fetches raw log
// bytes from its own end offset; each fetch also acknowledges that offset.
// HIGH messages wait in a FIFO ordered by log offset (appends complete in
// log order) until an acknowledgement reaches their end, or their deadline.
// A fetch with nothing to return is parked until data arrives or its wait
// passes; the HA loop answers parked fetches and expires waiters, so no
// worker is held.
type replication struct {
	b    *Broker
	wake chan struct{} // capacity 1: new data was appended

	mu         sync.Mutex
	ack        int64     // the slave's acknowledged end offset
	lastFetch  time.Time // when the slave last asked
	caughtUpAt time.Time // when the slave last had everything it was offered
	offeredEnd int64     // the master's end when the last answer was built
	everSeen   bool
	waiters    []highWaiter
	parked     []parkedFetch
	closed     bool
}

type highWaiter struct {
	end      int64
	deadline time.Time
	done     func(protocol.Status)
}

type parkedFetch struct {
	req      *transport.Request
	fetch    protocol.HAFetchRequest
	deadline time.Time
}

func (r *replication) init(b *Broker) {
	r.b = b
	r.wake = make(chan struct{}, 1)
	r.caughtUpAt = time.Now()
}

// notify tells the HA loop that the log grew.
func (r *replication) notify() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// SlaveState is the master's view of its slave.
type SlaveState struct {
	Connected bool
	AckOffset int64
	LagBytes  int64
	LagTime   time.Duration
}

// Slave returns the master's view of its slave.
func (b *Broker) Slave() SlaveState { return b.repl.state(time.Now()) }

func (r *replication) state(now time.Time) SlaveState {
	end := r.b.store.EndOffset()
	r.mu.Lock()
	defer r.mu.Unlock()
	s := SlaveState{
		Connected: r.everSeen && (len(r.parked) > 0 || now.Sub(r.lastFetch) < 2*r.b.cfg.HAFetchWait+500*time.Millisecond),
		AckOffset: r.ack,
		LagBytes:  max(end-r.ack, 0),
	}
	if s.LagBytes > 0 {
		s.LagTime = now.Sub(r.caughtUpAt)
	}
	return s
}

// lagging reports whether a HIGH message must be refused at once: no slave,
// or one too far behind.
func (r *replication) lagging() bool {
	s := r.state(time.Now())
	return !s.Connected || s.LagBytes > r.b.cfg.SlaveLagBytes || s.LagTime > r.b.cfg.SlaveLagTime
}

// await registers a HIGH message ending at end; done is called once with OK
// when the slave acknowledges it, or SLAVE_SYNC_TIMEOUT.
func (r *replication) await(end int64, done func(protocol.Status)) {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		done(protocol.StatusSlaveSyncTimeout)
		return
	}
	if r.ack >= end {
		r.mu.Unlock()
		r.b.stats.HighAcked.Add(1)
		done(protocol.StatusOK)
		return
	}
	r.waiters = append(r.waiters, highWaiter{end: end, deadline: time.Now().Add(r.b.cfg.HighWait), done: done})
	r.mu.Unlock()
}

// handleFetch serves a slave's fetch: it records the acknowledgement,
// releases the HIGH waiters it covers, and answers with the log bytes that
// follow, or parks the fetch until there are some.
func (r *replication) handleFetch(req *transport.Request) {
	f, err := protocol.DecodeHAFetchRequest(req.Body)
	if err != nil {
		req.ReplyError(err)
		return
	}
	now := time.Now()
	end := r.b.store.EndOffset()
	if f.Offset > end {
		req.ReplyError(&protocol.Error{Status: protocol.StatusInvalid,
			Message: "slave log ends past the master's: the slave holds records the master lost"})
		return
	}
	r.mu.Lock()
	if f.Offset > r.ack {
		r.ack = f.Offset
	}
	if !r.everSeen || f.Offset >= r.offeredEnd {
		r.caughtUpAt = now
	}
	r.everSeen = true
	r.lastFetch = now
	released := r.releaseLocked()
	closed := r.closed
	if f.Offset == end && !closed {
		r.parked = append(r.parked, parkedFetch{req: req, fetch: f, deadline: now.Add(time.Duration(f.WaitMillis) * time.Millisecond)})
		r.mu.Unlock()
		r.complete(released, protocol.StatusOK)
		r.notify() // the log may have grown since end was read
		return
	}
	r.mu.Unlock()
	r.complete(released, protocol.StatusOK)
	r.answer(req, f)
}

// releaseLocked takes the waiters the acknowledgement covers.
func (r *replication) releaseLocked() []highWaiter {
	i := 0
	for i < len(r.waiters) && r.waiters[i].end <= r.ack {
		i++
	}
	if i == 0 {
		return nil
	}
	out := make([]highWaiter, i)
	copy(out, r.waiters[:i])
	r.waiters = append(r.waiters[:0], r.waiters[i:]...)
	return out
}

func (r *replication) complete(ws []highWaiter, st protocol.Status) {
	if len(ws) == 0 {
		return
	}
	if st == protocol.StatusOK {
		r.b.stats.HighAcked.Add(int64(len(ws)))
	} else {
		r.b.stats.HighTimeouts.Add(int64(len(ws)))
	}
	for _, w := range ws {
		w.done(st)
	}
}

// answer sends the log bytes from the fetch's offset (possibly none).
func (r *replication) answer(req *transport.Request, f protocol.HAFetchRequest) {
	maxBytes := int(f.MaxBytes)
	if maxBytes <= 0 || maxBytes > r.b.cfg.HAFetchBytes {
		maxBytes = r.b.cfg.HAFetchBytes
	}
	end := r.b.store.EndOffset()
	raw, err := r.b.store.ReadRaw(f.Offset, maxBytes)
	if err != nil {
		r.b.log.Warn("reading the log for the slave failed", "offset", f.Offset, "error", err)
		req.ReplyError(&protocol.Error{Status: protocol.StatusStoreError, Message: err.Error()})
		return
	}
	r.mu.Lock()
	r.offeredEnd = end
	r.mu.Unlock()
	body := protocol.AppendHAFetchResponseHeader(make([]byte, 0, 8+len(raw)), end)
	_ = req.Reply(append(body, raw...))
}

// loop answers parked fetches when data arrives or their wait passes, and
// answers HIGH waiters whose deadline passed, until the broker closes.
func (r *replication) loop() {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-r.b.ctx.Done():
			r.mu.Lock()
			parked := r.parked
			r.parked = nil
			r.closed = true
			r.mu.Unlock()
			for _, p := range parked {
				p.req.ReplyError(&protocol.Error{Status: protocol.StatusShuttingDown, Message: "master shutting down"})
			}
			return
		case <-r.wake:
		case <-tick.C:
		}
		now := time.Now()
		end := r.b.store.EndOffset()
		r.mu.Lock()
		var ready []parkedFetch
		kept := r.parked[:0]
		for _, p := range r.parked {
			if end > p.fetch.Offset || now.After(p.deadline) {
				ready = append(ready, p)
			} else {
				kept = append(kept, p)
			}
		}
		r.parked = kept
		var expired []highWaiter
		for len(r.waiters) > 0 && now.After(r.waiters[0].deadline) {
			expired = append(expired, r.waiters[0])
			r.waiters = r.waiters[1:]
		}
		r.mu.Unlock()
		for _, p := range ready {
			r.answer(p.req, p.fetch)
		}
		r.complete(expired, protocol.StatusSlaveSyncTimeout)
	}
}

// failWaiters answers every HIGH message still waiting and refuses later ones.
func (r *replication) failWaiters(why string) {
	r.mu.Lock()
	ws := r.waiters
	r.waiters = nil
	r.closed = true
	r.mu.Unlock()
	if len(ws) > 0 {
		r.b.log.Warn("answering HIGH messages without the slave's confirmation", "messages", len(ws), "why", why)
	}
	r.complete(ws, protocol.StatusSlaveSyncTimeout)
}
