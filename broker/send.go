package broker

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/storage"
)

// appender is the part of the commit log that the send path writes.
type appender interface {
	AppendAsync(entries []storage.Entry, flush bool, done func([]storage.Position, error))
	// AppendQueued never writes on the caller's goroutine: what is
	// appended under the transactions' lock (txns) shares group commits.
	AppendQueued(entries []storage.Entry, flush bool, done func([]storage.Position, error))
}

// sender is the send path. A SEND request is handled by a worker, or by
// its connection's reader when it came alone (transport's
// HandleOrderedInline), which decodes the batch, gives every message its own
// future, checks each one and appends the good ones as one group, and
// returns. The answer goes out from the completions: for NORMAL messages
// the goroutine that wrote the group (this one, when the commit log was idle
// and it wrote the group inline; else the log's writer) or the flusher,
// replication's for HIGH ones. So a lone SEND to an idle broker is read,
// stored and answered on one goroutine, with no wake-up of another. Nothing
// here waits on the slave or a metaserver, and only the inline append waits
// on the disk (one goroutine at a time: the commit log's writer token).
type sender struct {
	id     string
	store  appender
	sess   *session // the write lease, and claims of a client's epoch
	routes *routeCache
	// repl returns the running replication, nil unless the broker is the
	// master: a SEND then gets NOT_MASTER.
	repl  func() *replication
	pulls *longPoll // wakes the PULLs parked on queues that got messages (nil: none)
	// delays checks delayed messages against the maximum delay and the
	// topics' quotas, and is told when some were stored (nil: none are
	// taken).
	delays *delayer
	// txns admits the messages of transactions and writes their open
	// marks (nil: none are taken).
	txns  *txns
	stats *Stats
	clock clockwork.Clock
	lg    hclog.Logger

	// Broker-wide bounds on SEND requests in flight and their bytes; past
	// them a request is refused whole with BUSY.
	maxReqs, maxBytes int64
	reqs, bytes       atomic.Int64
	closing           atomic.Bool // set by Close: new SENDs get SHUTTING_DOWN
}

// newSender makes the send path of the broker cfg configures.
func newSender(cfg Config, store appender, sess *session, routes *routeCache, repl func() *replication, pulls *longPoll, stats *Stats, lg hclog.Logger) *sender {
	return &sender{id: cfg.ID, store: store, sess: sess, routes: routes, repl: repl, pulls: pulls, stats: stats, clock: cfg.Clock, lg: lg,
		maxReqs: cfg.MaxInflightRequests, maxBytes: cfg.MaxInflightBytes}
}

// sendRequest is a decoded SEND: the epoch its producer's route names, its
// messages, and each message's encoding as sent (aliasing the request's
// body).
type sendRequest struct {
	epoch uint32
	msgs  []protocol.Message
	raws  [][]byte
	size  int // the body's length
}

func decodeSend(body []byte) (sendRequest, error) {
	epoch, msgs, raws, err := protocol.DecodeSendRequestRaw(body)
	return sendRequest{epoch: epoch, msgs: msgs, raws: raws, size: len(body)}, err
}

// sendBatch is one SEND request in flight. Every message is its own future:
// it completes once, with a status and, when stored, its offsets, either at
// the checks, when the commit log has it (NORMAL), or when the slave
// confirmed it or the wait ran out (HIGH). The last message to complete
// answers the request with every result, in order.
//
// results[i] is written only by message i's completion, before it
// decrements pending; the goroutine that brings pending to zero reads them
// all, so the atomic counter orders every write before the read.
//
// The write lease is checked last at the answer's write (Check, a
// transport.Guard): an OK or DUPLICATE answer is made only while the lease
// holds for the epoch the batch was taken in, however long the answer
// waited for its HIGH messages, the commit log or the connection's writer.
type sendBatch struct {
	s       *sender
	rep     sendReplier
	size    int
	start   time.Time
	epoch   uint32 // the epoch the batch's messages were taken in
	results []protocol.SendResult
	pending atomic.Int64
	acked   int // OK and DUPLICATE answers Check let go (the writing goroutine's)
	// holds counts who still use the request's body: the handler, and the
	// append until it completed (the commit log copied the messages by
	// then); the last one releases it.
	holds atomic.Int32
}

// drop ends one hold on the request's body.
func (sb *sendBatch) drop() {
	if sb.holds.Add(-1) == 0 {
		sb.rep.Release()
	}
}

// sendReplier answers a SEND: a transport.Request.
type sendReplier interface {
	replier
	ReplyGuarded(body []byte, g transport.Guard) error
	// Release says the request's body, and all that aliases it (the
	// messages' bodies and encodings), is no longer used.
	Release()
}

func (sb *sendBatch) complete(i int, res protocol.SendResult) {
	sb.results[i] = res
	sb.done1()
}

func (sb *sendBatch) done1() {
	if sb.pending.Add(-1) != 0 {
		return
	}
	refused := 0
	for _, r := range sb.results {
		if !acknowledges(r.Status) {
			refused++
		}
	}
	st := sb.s.stats
	st.Refused.Add(int64(refused))
	st.SendDuration.Observe(sb.s.clock.Since(sb.start).Seconds())
	body := protocol.AppendSendResponse(make([]byte, 0, sendReplySize(len(sb.results))), sb.results)
	if refused < len(sb.results) {
		_ = sb.rep.ReplyGuarded(body, sb)
	} else {
		_ = sb.rep.Reply(body)
	}
	sb.s.release(sb.size)
}

// acknowledges reports whether a message's status tells its producer the
// message is stored.
func acknowledges(st protocol.Status) bool {
	return st == protocol.StatusOK || st == protocol.StatusDuplicate
}

// Check runs just before the answer's first byte is written (see
// transport.Guard; again if the socket kept it waiting): if the write lease
// no longer holds for the batch's epoch (it ran out in a pause, or a newer
// epoch was seen), every OK and DUPLICATE answer becomes LEASE_LOST (stored
// maybe, retriable) in body. So a master acknowledges nothing once its
// lease is gone, not even what it stored and answered in its mind before a
// pause.
func (sb *sendBatch) Check(body []byte) {
	acked := 0
	for _, r := range sb.results {
		if acknowledges(r.Status) {
			acked++
		}
	}
	if acked == 0 || sb.s.sess.lease.validFor(sb.epoch) {
		sb.acked = acked
		return
	}
	for i, r := range sb.results {
		if acknowledges(r.Status) {
			sb.results[i] = protocol.SendResult{Status: protocol.StatusLeaseLost}
		}
	}
	sb.acked = 0
	sb.s.stats.LeaseLost.Add(int64(acked))
	sb.s.stats.Refused.Add(int64(acked))
	protocol.AppendSendResponse(body[:0], sb.results) // the same length
}

// Sent runs once the answer's last byte was handed to the socket. If the
// lease ended between the last Check and now (a pause of the whole process
// right between them, or a peer slow to read), the acknowledgements it
// carried may reach the producer after a promotion; they are counted,
// since their NORMAL messages may then be lost with the old master's tail.
func (sb *sendBatch) Sent() {
	if sb.acked > 0 && !sb.s.sess.lease.validFor(sb.epoch) {
		sb.s.stats.AcksAfterLease.Add(int64(sb.acked))
	}
}

// sendReplySize is the size of a SEND answer for n messages.
func sendReplySize(n int) int { return 4 + 18*n }

// sendReplyEstimate is the size of the answer to a SEND request body, for
// the transport's admission: one result per message (the body's header
// ends with the message count), or an error's text.
func sendReplyEstimate(body []byte) int {
	if len(body) < protocol.SendRequestHeaderSize {
		return transport.DefaultReplySize
	}
	n := binary.BigEndian.Uint32(body[protocol.SendRequestHeaderSize-4:])
	return max(sendReplySize(int(min(n, protocol.MaxFrameSize/18))), transport.DefaultReplySize)
}

// handle serves one SEND, decoded (and authorized: endpoints.go); it runs
// on a request worker or the connection's reader, one at a time per
// connection, in arrival order.
func (s *sender) handle(rep sendReplier, req sendRequest) {
	if s.closing.Load() {
		rep.ReplyError(&protocol.Error{Status: protocol.StatusShuttingDown, Message: "broker " + s.id + " is shutting down"})
		return
	}
	size, epoch, msgs, raws := req.size, req.epoch, req.msgs, req.raws
	if !s.admit(size) {
		rep.ReplyError(&protocol.Error{Status: protocol.StatusBusy, Message: fmt.Sprintf("broker %s has too many requests in flight", s.id)})
		rep.Release()
		return
	}
	s.sess.claim(epoch) // a newer epoch refuses this batch below (NOT_MASTER), and fences nothing
	sb := &sendBatch{s: s, rep: rep, size: size, start: s.clock.Now(), results: make([]protocol.SendResult, len(msgs))}
	sb.pending.Store(int64(len(msgs)) + 1) // +1: the handler's own hold, dropped at the end
	sb.holds.Store(1)                      // the handler's

	// Check every message; the good ones are stored as they came, in the
	// encoding the producer sent (it aliases the request's buffer, which the
	// commit log copies before the append completes).
	good := make([]int, 0, len(msgs))
	checks := s.newBatchCheck(epoch)
	sb.epoch = checks.epoch
	for i := range msgs {
		if st := checks.check(&msgs[i]); st != protocol.StatusOK {
			sb.complete(i, protocol.SendResult{Status: st})
			continue
		}
		good = append(good, i)
	}
	var tx *txns
	if s.txns != nil && hasTxn(msgs, good) {
		// Admitted and appended in one order with the decisions (txns).
		tx = s.txns
		tx.wmu.Lock()
		defer tx.wmu.Unlock()
		tx.mu.Lock()
		good = tx.admitBatchLocked(msgs, raws, good, sb, &checks)
	}
	good = checks.dropAfterRefused(msgs, good, sb)
	if len(good) == 0 {
		if tx != nil {
			tx.mu.Unlock()
		}
	} else {
		entries := make([]storage.Entry, 0, len(good))
		var at []int // with marks: the entry of each good message
		for j, i := range good {
			if tx != nil && msgs[i].Txn != 0 {
				if mark, ok := tx.openLocked(&msgs[i], len(raws[i])); ok {
					if at == nil {
						at = make([]int, j, len(good))
						for k := range at {
							at[k] = k
						}
					}
					entries = append(entries, mark)
				}
			}
			if at != nil {
				at = append(at, len(entries))
			}
			entries = append(entries, storage.Entry{Topic: storedTopic(&msgs[i]), Queue: msgs[i].Queue, Payload: raws[i],
				Producer: storage.ProducerStamp(msgs[i].Producer)})
		}
		if tx != nil {
			tx.mu.Unlock()
		}
		repl := checks.repl
		sb.holds.Add(1)
		appendAsync := s.store.AppendAsync
		if tx != nil {
			appendAsync = s.store.AppendQueued // queued under tx.wmu, written with the others
		}
		appendAsync(entries, false, func(pos []storage.Position, err error) {
			if at != nil && err == nil {
				mine := make([]storage.Position, len(at))
				for j, e := range at {
					mine[j] = pos[e]
				}
				pos = mine
			}
			s.appended(sb, repl, msgs, good, pos, err)
			sb.drop()
		})
	}
	sb.done1()
	sb.drop()
}

// storedTopic is the topic m is stored under: its own, or for a delayed
// message the internal topic of its pending records (the producer's
// sequences of delayed messages to a queue are their own, apart from its
// ordinary ones, so the deduplication state stays per stored queue).
func storedTopic(m *protocol.Message) string {
	if m.Schedule.Kind == protocol.ScheduleDelayed {
		return protocol.DelayTopic(m.Topic)
	}
	return m.Topic
}

// appended completes the stored messages of a batch. It runs on the
// goroutine that wrote the group (the handler's own, or the commit log's
// writer) or on the flusher, so it only records results and hands HIGH
// messages to replication. Whether the write lease still holds is decided
// when the answer is written (sendBatch.Check).
func (s *sender) appended(sb *sendBatch, repl *replication, msgs []protocol.Message, good []int, pos []storage.Position, err error) {
	if err != nil {
		st := statusOfStoreError(err)
		s.lg.Warn("append failed", "messages", len(good), "status", st.String(), "error", err)
		for _, i := range good {
			sb.complete(i, protocol.SendResult{Status: st})
		}
		return
	}
	var stored, bytes, delayed int64
	var high []highResult
	highEnd := int64(-1)
	for j, i := range good {
		p := pos[j]
		if p.Err != nil {
			sb.complete(i, protocol.SendResult{Status: statusOfStoreError(p.Err)})
			continue
		}
		res := protocol.SendResult{Status: protocol.StatusOK, QueueOffset: p.QueueOffset, LogOffset: p.LogOffset}
		if p.Duplicate {
			// Already stored: answer the original offsets. A HIGH duplicate
			// (say a retry after SLAVE_SYNC_TIMEOUT) is still answered only
			// once the slave has the original.
			res.Status = protocol.StatusDuplicate
		} else {
			stored++
			bytes += int64(len(msgs[i].Body))
			if msgs[i].Schedule.Kind == protocol.ScheduleDelayed {
				delayed++
			}
		}
		if msgs[i].Reliability == protocol.High && p.End >= 0 {
			if high == nil {
				high = make([]highResult, 0, len(good)-j)
			}
			high = append(high, highResult{i, res})
			highEnd = max(highEnd, p.End)
			continue
		}
		sb.complete(i, res)
	}
	if len(high) > 0 {
		awaitSlave(repl, sb, high, highEnd)
	}
	s.stats.MessagesIn.Add(stored)
	s.stats.BytesIn.Add(bytes)
	if delayed > 0 {
		s.stats.DelayedIn.Add(delayed)
		s.delays.appended()
	}
	repl.notify()
	s.pulls.appended(msgs, good, pos)
}

// highResult is a HIGH message of a batch and its result once the sync
// set holds it.
type highResult struct {
	i   int
	res protocol.SendResult
}

// awaitSlave completes the HIGH messages of sb once the sync set holds the
// log up to end, the highest of their ends: one wait for the batch, not one
// per message, since its answer leaves only once every message has one.
// Each is answered OK (its own result), or all with the status that ended
// the wait.
func awaitSlave(repl *replication, sb *sendBatch, high []highResult, end int64) {
	repl.awaitN(end, len(high), func(st protocol.Status) {
		for _, h := range high {
			r := h.res
			if st != protocol.StatusOK {
				r.Status = st
			}
			sb.complete(h.i, r)
		}
	})
}

// admit counts a request in, or refuses it when the broker is over its bounds.
func (s *sender) admit(size int) bool {
	n := s.reqs.Add(1)
	by := s.bytes.Add(int64(size))
	if n > s.maxReqs || by > s.maxBytes {
		s.release(size)
		return false
	}
	return true
}

func (s *sender) release(size int) {
	s.reqs.Add(-1)
	s.bytes.Add(-int64(size))
}

// statusOfStoreError maps a commit-log error to a message status.
func statusOfStoreError(err error) protocol.Status {
	switch {
	case errors.Is(err, storage.ErrOutOfOrderSequence):
		return protocol.StatusOutOfOrderSequence
	case errors.Is(err, storage.ErrProducerFenced):
		return protocol.StatusProducerFenced
	case errors.Is(err, storage.ErrInvalidEntry):
		return protocol.StatusInvalid
	case errors.Is(err, storage.ErrClosed):
		return protocol.StatusShuttingDown
	default:
		return protocol.StatusStoreError
	}
}

// batchCheck decides whether each message of one batch may be appended
// here. The broker's role, its write lease and the slave's lag are read
// once per batch, not per message.
type batchCheck struct {
	s        *sender
	repl     *replication    // the running replication when the batch arrived
	epoch    uint32          // the lease's epoch when the batch arrived
	state    protocol.Status // NOT_MASTER, READ_ONLY or OK for the whole batch
	lagKnown bool
	lagging  bool
	// anyRefused: a stamped message was refused by a check.
	anyRefused bool
}

type stampKey struct {
	producer uint64
	topic    string
	queue    uint32
}

// dropAfterRefused refuses, with OUT_OF_ORDER_SEQUENCE, every stamped
// message that follows a refused message of the same producer in the same
// queue: storing it would leave a gap before it, and the commit log, which
// refuses gaps, cannot see a message refused here (nor can it when it has
// no state for the producer yet). So a refused message is never overtaken.
// good lists the messages that passed the checks, in order.
func (c *batchCheck) dropAfterRefused(msgs []protocol.Message, good []int, sb *sendBatch) []int {
	if !c.anyRefused {
		return good
	}
	refused := map[stampKey]struct{}{}
	kept := good[:0]
	g := 0
	for i := range msgs {
		m := &msgs[i]
		k := stampKey{m.Producer.ID, storedTopic(m), m.Queue}
		passed := g < len(good) && good[g] == i
		if passed {
			g++
		}
		switch {
		case m.Producer.IsZero():
			if passed {
				kept = append(kept, i)
			}
		case !passed:
			refused[k] = struct{}{}
		default:
			if _, after := refused[k]; after {
				sb.complete(i, protocol.SendResult{Status: protocol.StatusOutOfOrderSequence})
				continue
			}
			kept = append(kept, i)
		}
	}
	return kept
}

// newBatchCheck reads the broker's state once for a batch that names the
// group at epoch (0: the sender does not know).
func (s *sender) newBatchCheck(epoch uint32) batchCheck {
	lease := &s.sess.lease
	c := batchCheck{s: s, state: protocol.StatusOK, repl: s.repl(), epoch: lease.epoch()}
	switch {
	case c.repl == nil:
		c.state = protocol.StatusNotMaster
	case lease.fenced() || epoch > c.epoch:
		s.stats.Fenced.Add(1)
		c.state = protocol.StatusNotMaster
	case !lease.validFor(c.epoch):
		c.state = protocol.StatusReadOnly
	}
	return c
}

func (c *batchCheck) check(m *protocol.Message) protocol.Status {
	st := c.checkOne(m)
	if st != protocol.StatusOK && !m.Producer.IsZero() {
		c.anyRefused = true
	}
	return st
}

func (c *batchCheck) checkOne(m *protocol.Message) protocol.Status {
	if c.state != protocol.StatusOK {
		return c.state
	}
	if err := m.Validate(); err != nil {
		return protocol.StatusOf(err)
	}
	if !c.s.routes.routed(m.Topic, m.Queue) {
		c.s.stats.NoRoute.Add(1)
		return protocol.StatusNoRoute
	}
	if m.Schedule.Kind == protocol.ScheduleDelayed {
		if st := c.s.delays.admit(m); st != protocol.StatusOK {
			return st
		}
	}
	if m.Reliability == protocol.High {
		if !c.lagKnown {
			c.lagging, c.lagKnown = c.repl.refusesHigh(), true
		}
		if c.lagging {
			return protocol.StatusNotEnoughReplicas
		}
	}
	return protocol.StatusOK
}
