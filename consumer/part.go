package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// part is one queue the member holds in its current generation: its
// fetcher's buffer and the offsets handed out and processed. A queue taken
// again later is a new part.
type part struct {
	c   *Consumer
	key qkey
	log *slog.Logger // the consumer's, naming the group and the queue

	ctx       context.Context // ends when the queue is revoked or the consumer closes
	stopFetch context.CancelFunc
	hctx      context.Context // the handler's: ends when the queue is revoked or Run's context ends
	stopH     context.CancelFunc
	fetchDone chan struct{}

	mu        sync.Mutex
	buf       []*Message
	bufBytes  int64
	share     int64
	room      chan struct{} // the buffer shrank (the fetcher waits on it)
	ready     chan struct{} // the buffer grew (Run's worker waits on it)
	delivered int64         // the offset after the last message handed out; -1 until the start is known
	// redelivered are messages handled after more than one delivery, for
	// the next commit to report (at most api.MaxRedelivered).
	redelivered []api.Redelivery
	// readTo is where the last answer's messages and the ones the broker
	// skipped past them (the group's filter) end: once the buffer is
	// handed out, delivered moves there, so the commits pass the skipped.
	readTo    int64
	pending   []int64 // offsets handed out and not processed, ascending
	committed int64   // the group's committed offset as this member knows it; -1 none
	// rewound: the broker sent this member below the committed offset (the
	// queue's log ends before it, or a failover cut it): its next commit
	// says so, and the registry takes the lower offset.
	rewound   bool
	maxOffset int64 // the queue's end at the last answer; -1 none yet
	revoked   bool
	// readIn is the group epoch in which this member read what it read of
	// the queue, and the broker group it is of (nil: nothing yet). PULLs
	// name the epoch, so that after a failover the new master can send the
	// member back to where its epoch's log ended, if the member read past
	// that (messages the new master never had, whose offsets now hold
	// others). An epoch is one group's: once the queue's route names
	// another group (the queue moved off a retired group), the member
	// names none. Written by the fetcher, read by commits (a commit names
	// it); starts at the committed offset's epoch.
	readIn atomic.Pointer[epochIn]
}

// epochIn is a group epoch and the broker group it is of ("": the queue's
// group, as an older metaserver's assignment leaves it).
type epochIn struct {
	epoch uint32
	group string
}

// epochFor returns the epoch what the member read was read in, if it is of
// group (0 otherwise).
func (p *part) epochFor(group string) uint32 {
	e := p.readIn.Load()
	if e == nil || e.group != "" && e.group != group {
		return 0
	}
	return e.epoch
}

// epochNow returns the epoch and group a commit names.
func (p *part) epochNow() (uint32, string) {
	if e := p.readIn.Load(); e != nil {
		return e.epoch, e.group
	}
	return 0, ""
}

func (p *part) setEpoch(epoch uint32, group string) {
	p.readIn.Store(&epochIn{epoch: epoch, group: group})
}

func newPart(c *Consumer, k qkey, committed int64) *part {
	p := &part{
		c: c, key: k, fetchDone: make(chan struct{}),
		room: make(chan struct{}, 1), ready: make(chan struct{}, 1),
		delivered: committed, committed: committed, maxOffset: -1,
		log: c.cfg.Logger.With("group", c.group, "queue", k.String()),
	}
	p.ctx, p.stopFetch = context.WithCancel(c.bg)
	hparent := c.runCtx
	if hparent == nil {
		hparent = c.bg
	}
	p.hctx, p.stopH = context.WithCancel(hparent)
	return p
}

// stop revokes the part: its fetcher and its handler's context end, and
// offsets marked processed from now on are ignored.
func (p *part) stop() {
	p.mu.Lock()
	p.revoked = true
	p.mu.Unlock()
	p.stopFetch()
	p.stopH()
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// processed is where a commit would put the queue: its first message handed
// out and not processed, or the offset after the last handed out; -1 while
// the start is unknown.
func (p *part) processedLocked() int64 {
	if len(p.pending) > 0 {
		return p.pending[0]
	}
	return p.delivered
}

// rewind drops what the member buffered or handed out at or past offset,
// so that its commit goes no further than offset until it reads there
// again.
func (p *part) rewind(offset int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	keep := p.buf[:0]
	for _, m := range p.buf {
		if m.Offset < offset {
			keep = append(keep, m)
		} else {
			p.bufBytes -= m.size
		}
	}
	clear(p.buf[len(keep):])
	p.buf = keep
	pend := p.pending[:0]
	for _, o := range p.pending {
		if o < offset {
			pend = append(pend, o)
		}
	}
	p.pending = pend
	p.delivered = min(p.delivered, offset)
	p.readTo = min(p.readTo, offset)
	if p.committed > offset {
		p.committed = -1 // so the lower offset is committed again
		p.rewound = true
	}
	signal(p.room)
}

// take appends up to most buffered messages to dst, recording them as
// pending.
func (p *part) take(dst []*Message, most int) []*Message {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.revoked || len(p.buf) == 0 {
		return dst
	}
	// The fetcher waits for room only while the share is full (fetch).
	full := p.bufBytes >= p.share
	n := min(most, len(p.buf))
	out := p.buf[:n]
	dst = append(dst, out...)
	clear(out)
	p.buf = p.buf[n:]
	out = dst[len(dst)-n:]
	for _, m := range out {
		p.bufBytes -= m.size
		p.pending = append(p.pending, m.Offset)
		m.Deliveries = 1
	}
	p.delivered = out[n-1].Offset + 1
	if len(p.buf) == 0 {
		p.delivered = max(p.delivered, p.readTo)
	}
	if full {
		signal(p.room)
	}
	return dst
}

// noteRedelivered records, for the next commit, the messages of msgs handled
// after more than one delivery; past the bound the oldest are dropped.
func (p *part) noteRedelivered(msgs []*Message, at time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range msgs {
		if m.Deliveries > 1 {
			p.redelivered = append(p.redelivered, api.Redelivery{Topic: m.Topic, Queue: m.Queue, Offset: m.Offset, Deliveries: m.Deliveries,
				At: at.UnixMilli()})
		}
	}
	if over := len(p.redelivered) - api.MaxRedelivered; over > 0 {
		p.redelivered = slices.Clone(p.redelivered[over:])
	}
}

// done marks the pending offsets from first to last (inclusive) processed.
func (p *part) done(first, last int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.revoked {
		return
	}
	j := 0
	for _, o := range p.pending {
		if o < first || o > last {
			p.pending[j] = o
			j++
		}
	}
	p.pending = p.pending[:j]
}

func (p *part) stats() QueueStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := QueueStats{Topic: p.key.topic, Queue: p.key.queue, Committed: p.committed, Processed: p.processedLocked(),
		MaxOffset: p.maxOffset, Lag: -1, Buffered: len(p.buf)}
	if s.Processed >= 0 && s.MaxOffset >= 0 {
		s.Lag = max(0, s.MaxOffset-s.Processed)
	}
	return s
}

// wait sleeps d on the consumer's clock, or until ctx ends (false).
func wait(ctx context.Context, clk clockwork.Clock, d time.Duration) bool {
	t := clk.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.Chan():
		return true
	case <-ctx.Done():
		return false
	}
}

// slaveStay is how long a fetcher reads from the slave after its master
// did not answer, before it looks the route up and tries the master again.
const slaveStay = 5 * time.Second

// PULL sizes. The broker admits a request on a connection only while the
// answers it owes there (each reserved at its PULL's MaxBytes, plus a
// header) fit in the connection's write buffer (4 MiB, the transport's
// default), and reads nothing more from the connection until they do; a
// parked PULL owes its answer until a message comes or its wait ends. The
// PULLs of a member's queues on one broker share one connection, so a PULL
// that asked for the whole buffer, once parked, held every other queue's
// PULL unread until its wait ended: a message to one idle queue waited up
// to PollWait while another was idle too. So a PULL at the queue's end asks
// for parkPullBytes, and one behind it (answered at once) for at most
// drainPullBytes: one of those and 47 parked ones fit, and a PULL waits for
// room only behind answers that are being made, never behind a parked one.
const (
	parkPullBytes  = minQueueShare            // 64 KiB
	drainPullBytes = min(maxPullBytes, 1<<20) // 1 MiB
)

// fetch is the part's fetcher: PULLs with a long-poll wait from the queue's
// master (or its slave while the master does not answer), into the buffer,
// within the part's share of the prefetch budget.
func (p *part) fetch(pos int64) {
	c := p.c
	defer c.fetchWG.Done()
	defer close(p.fetchDone)
	log := p.log
	resolved := pos >= 0
	var slaveUntil time.Time
	backoff := 50 * time.Millisecond
	failing := false
	clampedLogged, pastLogged := false, false
	// The answers' messages are decoded into dec's memory: each answer's
	// are turned into Messages before the next PULL.
	var dec protocol.PullDecoder
	// The group's retry topic starts at its oldest message whatever
	// StartFrom says: a retry stored before the member took its queue is
	// not skipped.
	start := c.cfg.start
	if p.key.topic == c.cfg.retryTopic {
		start = Earliest
	}
	for p.ctx.Err() == nil {
		// Wait for room in the share.
		p.mu.Lock()
		for p.bufBytes >= p.share {
			p.mu.Unlock()
			select {
			case <-p.room:
			case <-p.ctx.Done():
				return
			}
			p.mu.Lock()
		}
		want := p.share - p.bufBytes
		// Behind the queue's end as the last answer showed it, the PULL is
		// answered at once and may ask for more; at the end (or not knowing
		// it) it will likely be parked, holding what it asks for.
		ask := int64(parkPullBytes)
		if !resolved || p.maxOffset > pos {
			ask = drainPullBytes
		}
		p.mu.Unlock()
		req := protocol.PullRequest{Topic: p.key.topic, Queue: p.key.queue, Offset: max(pos, 0),
			MaxBytes: uint32(min(max(want, 1), ask)), WaitMillis: uint32(c.cfg.pollWait / time.Millisecond),
			Group: c.group, Member: c.cfg.member, // who reads: a message's journey shows it
			ReadUncommitted: c.cfg.uncommitted}
		if f := c.filter.Load(); f != nil && p.key.topic != c.cfg.retryTopic {
			req.Filter = *f // a retry is of a message the group received
		}
		if !resolved {
			req.WaitMillis = 0 // the queue's range is wanted at once
			if start == Latest {
				req.MaxBytes = 1 // and only its range
			}
		}
		began := c.cfg.clock.Now()
		resp, fromSlave, group, err := p.pull(&req, &dec, &slaveUntil, log)
		var mv *movedQueue
		if errors.As(err, &mv) && resolved {
			// The queue moved off a retired group past what the registry
			// knew of it: what this member read there past the base now
			// has other messages' offsets. Go back to the base.
			log.Warn("the queue moved to another broker group, which took it up before where this member read to: reading again from there",
				"offset", req.Offset, "from", mv.base, "group", mv.group)
			p.rewind(mv.base)
			pos = mv.base
			p.setEpoch(0, mv.group)
			c.stats.rewinds.Add(1)
			continue
		}
		if err != nil {
			if p.ctx.Err() != nil {
				return
			}
			c.stats.fetchErrors.Add(1)
			if errors.Is(err, protocol.ErrNotAuthorized) || errors.Is(err, protocol.ErrUnknownTopic) {
				log.Error("the broker refuses this member's reads for good", "offset", req.Offset, "err", err)
				c.fail(fmt.Errorf("consumer: fetch %s: %w", p.key, err))
				return
			}
			if !failing {
				log.Warn("fetch failed; retrying", "offset", req.Offset, "err", err)
				failing = true
			} else {
				log.Debug("fetch failed; retrying", "offset", req.Offset, "err", err)
			}
			if !wait(p.ctx, c.cfg.clock, backoff) {
				return
			}
			backoff = min(2*backoff, 2*time.Second)
			continue
		}
		if failing {
			log.Info("fetching again", "offset", req.Offset)
			failing = false
		}
		backoff = 50 * time.Millisecond
		c.stats.fetches.Add(1)
		if f := c.filter.Load(); f != nil && *f != req.Filter && p.key.topic != c.cfg.retryTopic {
			continue // the group's filter changed while the PULL was out: read again by the new one
		}
		if fromSlave {
			c.stats.fromSlave.Add(1)
		}
		msgs := resp.Messages
		if resolved && len(msgs) == 0 && resp.NextOffset < req.Offset {
			// A failover: the queue's log in the new epoch ends before
			// where this member read to. Go back there; what it read past
			// it was the old master's, and those offsets now hold others.
			log.Warn("the queue's log was cut by a failover: reading again from where the new epoch took it up",
				"offset", req.Offset, "from", resp.NextOffset, "read-in-epoch", req.Epoch)
			p.rewind(resp.NextOffset)
			pos = resp.NextOffset
			p.setEpoch(resp.Epoch, group)
			c.stats.rewinds.Add(1)
			continue
		}
		// The broker checked the position against its epochs (or had no
		// newer one): what is read from here on is of its epoch.
		p.setEpoch(max(p.epochFor(group), resp.Epoch), group)
		p.mu.Lock()
		p.maxOffset = resp.MaxOffset
		switch {
		case !resolved:
			resolved = true
			if start == Latest {
				pos, msgs = resp.MaxOffset, nil
			} else {
				pos = resp.MinOffset
			}
			if len(p.buf) == 0 && len(p.pending) == 0 {
				p.delivered = pos
			}
			log.Debug("no committed offset: starting", "from", start, "offset", pos)
		case pos < resp.MinOffset:
			if !clampedLogged {
				log.Warn("offset before the queue's oldest message (deleted by retention, or the queue moved to another broker group): starting from the oldest",
					"offset", pos, "oldest", resp.MinOffset)
				clampedLogged = true
			}
			pos = resp.MinOffset
			if len(p.buf) == 0 && len(p.pending) == 0 && p.delivered < pos {
				p.delivered = pos
			}
		case pos > resp.MaxOffset && !fromSlave:
			// The log is shorter than the committed offset (a tail lost in
			// a failover): go on from its end rather than wait for it to
			// grow past the offset and skip what comes meanwhile.
			if !pastLogged {
				log.Warn("offset past the queue's end: going on from the end", "offset", pos, "end", resp.MaxOffset)
				pastLogged = true
			}
			pos = resp.MaxOffset
			if len(p.buf) == 0 && len(p.pending) == 0 {
				p.delivered = pos
			}
			// Nothing past the new end counts as read: not what was
			// handed out there, nor what a filter skipped there.
			p.delivered, p.readTo = min(p.delivered, pos), min(p.readTo, pos)
			if p.committed > pos {
				p.rewound = true
			}
		}
		var size int64
		// One allocation for the answer's messages: their bodies share
		// the answer's frame already, so one held message holds both.
		slab := make([]Message, len(msgs))
		for i := range msgs {
			if msgs[i].QueueOffset < pos {
				continue // never: a PULL answers from its offset on
			}
			m := &slab[i]
			toMessage(m, &msgs[i], p, group)
			size += m.size
			p.buf = append(p.buf, m)
			pos = msgs[i].QueueOffset + 1
		}
		p.bufBytes += size
		if resp.NextOffset > pos && resp.NextOffset <= resp.MaxOffset && req.Filter != "" {
			// The broker skipped messages the filter does not take.
			pos = resp.NextOffset
			p.readTo = pos
			if len(p.buf) == 0 {
				p.delivered = max(p.delivered, pos)
			}
		}
		if len(msgs) > 0 {
			signal(p.ready)
		}
		p.mu.Unlock()
		if len(msgs) > 0 {
			c.stats.messages.Add(int64(len(msgs)))
			signal(c.avail)
			continue
		}
		if resp.NextOffset <= resp.MaxOffset { // not an offset past the end, answered as asked
			pos = max(pos, resp.NextOffset)
		}
		// An empty answer well before the wait that did not move on (a
		// filter's skip does): a broker that does not hold PULLs (or a
		// slave). Do not spin.
		if req.WaitMillis > 0 && resp.NextOffset <= req.Offset && c.cfg.clock.Since(began) < c.cfg.pollWait/2 {
			if !wait(p.ctx, c.cfg.clock, min(c.cfg.pollWait/2, 20*time.Millisecond)) {
				return
			}
		}
	}
}

// pull reads from the queue's master, or its slave when the master does not
// answer; it returns the broker group it asked.
func (p *part) pull(req *protocol.PullRequest, dec *protocol.PullDecoder, slaveUntil *time.Time, log interface {
	Info(string, ...any)
}) (resp protocol.PullResponse, fromSlave bool, group string, err error) {
	c := p.c
	qr, err := c.queueRoute(p.ctx, p.key)
	if err != nil {
		return protocol.PullResponse{}, false, "", err
	}
	if qr.Master == "" && qr.Slave == "" {
		c.routes.MarkStale(p.key.topic)
		return protocol.PullResponse{}, false, qr.Group, &protocol.Error{Status: protocol.StatusNoRoute, Message: "queue " + p.key.String() + " has no broker"}
	}
	if e := p.readIn.Load(); e != nil && e.group != "" && e.group != qr.Group && req.Offset > qr.Base {
		return protocol.PullResponse{}, false, qr.Group, &movedQueue{group: qr.Group, base: qr.Base}
	}
	req.Epoch = qr.Epoch
	if e := p.epochFor(qr.Group); e != 0 {
		req.Epoch = e // what was read was read in this epoch: let the broker check it
	}
	timeout := c.cfg.requestTimeout + time.Duration(req.WaitMillis)*time.Millisecond
	call := func(addr string) (protocol.PullResponse, error) {
		ctx, cancel := context.WithTimeout(p.ctx, timeout)
		defer cancel()
		return c.cfg.puller.Pull(ctx, addr, req, dec)
	}
	useSlave := qr.Slave != "" && (qr.Master == "" || c.cfg.clock.Now().Before(*slaveUntil))
	if !useSlave {
		resp, err := call(qr.Master)
		if err == nil {
			return resp, false, qr.Group, nil
		}
		if p.ctx.Err() != nil || !masterDown(err) {
			return resp, false, qr.Group, err
		}
		c.routes.MarkStale(p.key.topic)
		if qr.Slave == "" {
			return resp, false, qr.Group, err
		}
		log.Info("the master does not answer: reading from the slave", "master", qr.Master, "slave", qr.Slave, "err", err)
		*slaveUntil = c.cfg.clock.Now().Add(slaveStay)
	}
	resp, err = call(qr.Slave)
	if err != nil {
		c.routes.MarkStale(p.key.topic)
		*slaveUntil = time.Time{}
	}
	return resp, true, qr.Group, err
}

// movedQueue is pull's answer when the queue's route names another group
// than the one the member read it in, which took the queue up at base,
// below the member's offset.
type movedQueue struct {
	group string
	base  int64
}

func (m *movedQueue) Error() string {
	return fmt.Sprintf("the queue moved to group %s, which took it up at offset %d", m.group, m.base)
}

// toMessage converts a stored message, read from the broker group group,
// into m.
func toMessage(m *Message, sm *protocol.StoredMessage, p *part, group string) {
	pm := &sm.Message
	*m = Message{
		Topic: pm.Topic, Queue: pm.Queue, Offset: sm.QueueOffset, ID: pm.ID, Tag: pm.Tag, Body: pm.Body,
		StoreTime: time.UnixMilli(sm.StoreTime), Timestamp: time.UnixMilli(pm.Timestamp),
		ProducerID: pm.Producer.ID, Seq: pm.Producer.Seq,
		part: p, size: int64(24 + pm.EncodedSize()),
	}
	if m.Topic == "" {
		m.Topic, m.Queue = p.key.topic, p.key.queue
	}
	if sc := pm.Schedule; sc.Kind == protocol.ScheduleReleased {
		m.DueAt, m.ReleasedAt = time.UnixMilli(sc.At), m.StoreTime
		m.DelayedHandle = protocol.Handle{Group: group, Offset: sc.Ref, DueAt: sc.At}
		if o := protocol.DelayedOrigin(pm); o >= 0 {
			m.DelayedHandle.Offset = o // moved by retention: the first record, as the producer's handle
		}
	}
	for _, pr := range pm.Properties {
		if pr.Key == protocol.KeyProperty {
			m.Key = pr.Value
			continue
		}
		if pr.Key == protocol.RecoveredProperty {
			m.Recovered = true
		}
		if m.Properties == nil {
			m.Properties = make(map[string]string, len(pm.Properties))
		}
		m.Properties[pr.Key] = pr.Value
	}
}

// Route cache timings: a route is used for routeMaxAge before it is looked
// up again; errors mark it stale sooner, looked up again once it is
// routeMinRefresh old.
const (
	routeMaxAge     = 30 * time.Second
	routeMinRefresh = time.Second
)

// route returns topic's cached route, looking it up (one lookup per topic at
// a time) when it is missing, older than routeMaxAge, or marked stale and at
// least routeMinRefresh old. A failed lookup returns the cached route, if
// any, until the metaserver answers.
func (c *Consumer) route(ctx context.Context, topic string) (routing.Route, error) {
	e := c.routes.Get(topic)
	if e != nil && e.Known {
		age := c.routes.Now().Sub(e.Fetched)
		if age < routeMaxAge && (!e.Stale || age < routeMinRefresh) {
			return e.Route, nil
		}
	}
	looked, err := c.routes.Lookup(ctx, topic)
	if err != nil {
		if e != nil && e.Known {
			return e.Route, nil
		}
		return routing.Route{}, err
	}
	return looked.Route, nil
}

// queueRoute returns one queue's route.
func (c *Consumer) queueRoute(ctx context.Context, k qkey) (routing.QueueRoute, error) {
	r, err := c.route(ctx, k.topic)
	if err != nil {
		return routing.QueueRoute{}, err
	}
	for _, q := range r.Queues {
		if q.Queue == k.queue {
			return q, nil
		}
	}
	c.routes.MarkStale(k.topic)
	return routing.QueueRoute{}, &protocol.Error{Status: protocol.StatusNoRoute, Message: "the route of " + k.topic + " has no queue " + k.String()}
}
