package broker

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/protocol"
)

// masterLog is the part of the commit log that replication reads.
type masterLog interface {
	EndOffset() int64
	ReadRaw(offset int64, maxBytes int) ([]byte, error)
}

// replier answers one request; *transport.Request is one. Its methods never
// block on the peer.
type replier interface {
	Reply(body []byte) error
	ReplyError(err error)
}

// replConfig is what replication takes from the broker's Config.
type replConfig struct {
	HighWait      time.Duration // how long a HIGH message waits for the slave
	FetchBytes    int           // cap of one fetch answer
	FetchWait     time.Duration // the slave's fetch interval, for "connected"
	SlaveLagBytes int64
	SlaveLagTime  time.Duration
}

// replication is the master's side of HA sync. The slave fetches raw log
// bytes from its own end offset; each fetch also acknowledges that offset.
// HIGH messages wait in a FIFO ordered by log offset (appends complete in
// log order) until an acknowledgement reaches their end, or their deadline.
// A fetch with nothing to return is parked until data arrives or its wait
// passes. run answers parked fetches and expires waiters, so no request
// worker is ever held, and nothing here waits on the slave's socket.
type replication struct {
	log   masterLog
	cfg   replConfig
	stats *Stats
	clock clockwork.Clock
	lg    hclog.Logger
	wake  chan struct{} // capacity 1: new data was appended
	// fence takes an epoch a fetch showed; a newer one than the master's
	// ends its write lease.
	fence func(epoch uint32)
	// unknownSlave is told of a fetch in this master's epoch from a broker
	// it does not know as its slave: the registry may have just placed it
	// (a former master rejoining), so the broker heartbeats soon to learn.
	unknownSlave func()

	mu         sync.Mutex
	slaveID    string    // the only broker whose fetches are served and counted
	epoch      uint32    // the epoch this master serves
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
	rep      replier
	fetch    protocol.HAFetchRequest
	deadline time.Time
}

func newReplication(log masterLog, cfg replConfig, stats *Stats, clock clockwork.Clock, lg hclog.Logger, fence func(uint32)) *replication {
	if fence == nil {
		fence = func(uint32) {}
	}
	return &replication{log: log, cfg: cfg, stats: stats, clock: clock, lg: lg, fence: fence, unknownSlave: func() {},
		wake: make(chan struct{}, 1), caughtUpAt: clock.Now()}
}

// setSlave names the broker whose fetches are served and counted, and the
// epoch this master serves, as the registry has them.
func (r *replication) setSlave(id string, epoch uint32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if id != r.slaveID && r.slaveID != "" {
		// Another broker: what the old one acknowledged says nothing of it.
		r.everSeen, r.ack = false, 0
	}
	r.slaveID, r.epoch = id, epoch
}

// notify tells run that the log grew.
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

func (r *replication) state() SlaveState {
	now := r.clock.Now()
	end := r.log.EndOffset()
	r.mu.Lock()
	defer r.mu.Unlock()
	s := SlaveState{
		Connected: r.everSeen && (len(r.parked) > 0 || now.Sub(r.lastFetch) < 2*r.cfg.FetchWait+500*time.Millisecond),
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
	s := r.state()
	return !s.Connected || s.LagBytes > r.cfg.SlaveLagBytes || s.LagTime > r.cfg.SlaveLagTime
}

// await registers a HIGH message ending at end; done is called once with OK
// when the slave acknowledges it, or SLAVE_SYNC_TIMEOUT.
func (r *replication) await(end int64, done func(protocol.Status)) {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		r.complete([]highWaiter{{done: done}}, protocol.StatusSlaveSyncTimeout)
		return
	}
	if r.ack >= end {
		r.mu.Unlock()
		r.complete([]highWaiter{{done: done}}, protocol.StatusOK)
		return
	}
	r.waiters = append(r.waiters, highWaiter{end: end, deadline: r.clock.Now().Add(r.cfg.HighWait), done: done})
	r.mu.Unlock()
}

// handleFetch serves a slave's fetch: it records the acknowledgement,
// releases the HIGH waiters it covers, and answers with the log bytes that
// follow, or parks the fetch until there are some.
func (r *replication) handleFetch(rep replier, body []byte) {
	f, err := protocol.DecodeHAFetchRequest(body)
	if err != nil {
		rep.ReplyError(err)
		return
	}
	r.fence(f.Epoch)
	r.mu.Lock()
	slaveID, epoch := r.slaveID, r.epoch
	r.mu.Unlock()
	switch {
	case f.Epoch > epoch:
		rep.ReplyError(&protocol.Error{Status: protocol.StatusNotMaster,
			Message: fmt.Sprintf("this master serves epoch %d; the fetch is for epoch %d", epoch, f.Epoch)})
		return
	case slaveID == "" || f.BrokerID != slaveID || f.Epoch != epoch:
		if f.Epoch == epoch && f.BrokerID != slaveID {
			r.unknownSlave()
		}
		if r.stats.HAFetchRefused.Add(1) == 1 {
			r.lg.Warn("refusing an HA fetch from a broker that is not this group's slave in this epoch",
				"from", f.BrokerID, "epoch", f.Epoch, "slave", slaveID, "serving-epoch", epoch)
		}
		rep.ReplyError(&protocol.Error{Status: protocol.StatusNotAuthorized,
			Message: fmt.Sprintf("only the group's slave %q in epoch %d may fetch; got %q in epoch %d", slaveID, epoch, f.BrokerID, f.Epoch)})
		return
	}
	now := r.clock.Now()
	end := r.log.EndOffset()
	if f.Offset > end {
		rep.ReplyError(&protocol.Error{Status: protocol.StatusInvalid,
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
	if f.Offset == end && !r.closed {
		r.parked = append(r.parked, parkedFetch{rep: rep, fetch: f, deadline: now.Add(time.Duration(f.WaitMillis) * time.Millisecond)})
		r.mu.Unlock()
		r.complete(released, protocol.StatusOK)
		r.notify() // the log may have grown since end was read
		return
	}
	r.mu.Unlock()
	r.complete(released, protocol.StatusOK)
	r.answer(rep, f)
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

// complete answers waiters, outside r.mu.
func (r *replication) complete(ws []highWaiter, st protocol.Status) {
	if len(ws) == 0 {
		return
	}
	if st == protocol.StatusOK {
		r.stats.HighAcked.Add(int64(len(ws)))
	} else {
		r.stats.HighTimeouts.Add(int64(len(ws)))
	}
	for _, w := range ws {
		w.done(st)
	}
}

// answer sends the log bytes from the fetch's offset (possibly none).
func (r *replication) answer(rep replier, f protocol.HAFetchRequest) {
	maxBytes := int(f.MaxBytes)
	if maxBytes <= 0 || maxBytes > r.cfg.FetchBytes {
		maxBytes = r.cfg.FetchBytes
	}
	end := r.log.EndOffset()
	raw, err := r.log.ReadRaw(f.Offset, maxBytes)
	if err != nil {
		r.lg.Warn("reading the log for the slave failed", "offset", f.Offset, "error", err)
		rep.ReplyError(&protocol.Error{Status: protocol.StatusStoreError, Message: err.Error()})
		return
	}
	r.mu.Lock()
	r.offeredEnd = end
	epoch := r.epoch
	r.mu.Unlock()
	body := protocol.AppendHAFetchResponseHeader(make([]byte, 0, protocol.HAFetchResponseHeaderSize+len(raw)), end, epoch)
	_ = rep.Reply(append(body, raw...))
}

// run answers parked fetches when data arrives or their wait passes, and
// answers HIGH waiters whose deadline passed, until ctx ends. Then it
// answers every parked fetch and refuses later ones.
func (r *replication) run(ctx context.Context) {
	tick := r.clock.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			r.mu.Lock()
			parked := r.parked
			r.parked = nil
			r.closed = true
			r.mu.Unlock()
			for _, p := range parked {
				p.rep.ReplyError(&protocol.Error{Status: protocol.StatusShuttingDown, Message: "master shutting down"})
			}
			return
		case <-r.wake:
		case <-tick.Chan():
		}
		r.step()
	}
}

// step answers what is due now.
func (r *replication) step() {
	now := r.clock.Now()
	end := r.log.EndOffset()
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
		r.answer(p.rep, p.fetch)
	}
	r.complete(expired, protocol.StatusSlaveSyncTimeout)
}

// failWaiters answers every HIGH message still waiting with st and refuses
// later ones.
func (r *replication) failWaiters(why string, st protocol.Status) {
	r.mu.Lock()
	ws := r.waiters
	r.waiters = nil
	r.closed = true
	r.mu.Unlock()
	if len(ws) > 0 {
		r.lg.Warn("answering HIGH messages without the slave's confirmation", "messages", len(ws), "why", why)
	}
	r.complete(ws, st)
}
