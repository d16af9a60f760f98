package broker

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/storage"
)

const (
	defaultPullBytes = 1 << 20
	maxPullBytes     = 8 << 20
)

// queueReader is the part of the commit log that PULL reads.
type queueReader interface {
	QueueRange(topic string, queue uint32) (first, next int64)
	// ReadMatching is storage.Log.ReadMatching.
	ReadMatching(dst []byte, topic string, queue uint32, offset int64, maxBytes int, stopAt int64, want func(fp uint32) bool,
		emit func([]byte, storage.StoredEntry) []byte) ([]byte, int64, error)
	QueueOffsetAt(topic string, queue uint32, logOffset int64) (int64, error)
	// LogEpoch is the group epoch of the broker's log, answered in every PULL.
	LogEpoch() uint32
	// EpochStart is where the epoch after epoch began (see roles.epochStart).
	EpochStart(epoch uint32) (start int64, ok, known bool)
	// Placed reports whether the broker may answer for a queue its log
	// holds nothing of (see handlePull).
	Placed(topic string, queue uint32) bool
	// ReadableEnd is the log offset reads stop at (a slave's: what every
	// member of the sync set held at the master's last report); -1: none.
	ReadableEnd() int64
	// Delivered notes that a PULL naming group and member was answered the
	// queue's offsets [from, to) (deliveries.record).
	Delivered(topic string, queue uint32, group, member string, from, to int64)
	// TxnLimit is the log offset reads stop at so that no record is read
	// before the transaction index saw its open mark (-1: none);
	// StableEnd is a queue's end for a reader of committed messages
	// (next, the queue's next offset, when no transaction is open on it);
	// Aborted says a record's payload belongs to an aborted transaction.
	TxnLimit() int64
	StableEnd(topic string, queue uint32, next int64) int64
	Aborted(payload []byte) bool
	// LogOffsetOf is storage.Log.LogOffsetOf.
	LogOffsetOf(topic string, queue uint32, qo int64) (int64, error)
}

// pullStore is the commit log with the broker's epochs, as PULL reads it.
type pullStore struct {
	*storage.Log
	epoch      func() uint32
	epochStart func(uint32) (int64, bool, bool) // nil: no failover has been seen
	// routed is the route cache's answer: the queue is this group's (and
	// the log continues it at its base, if it moved here). It never waits;
	// a miss queues a lookup. nil: every queue is.
	routed func(topic string, queue uint32) bool
	// readable is ReadableEnd (nil: no limit).
	readable func() int64
	// reads remembers who read what (nil: nothing is remembered).
	reads *deliveries
	// txns is the transaction index (nil: every record is committed).
	txns *txns
}

func (s pullStore) TxnLimit() int64 {
	if s.txns == nil {
		return -1
	}
	return s.txns.readLimit(s.ReadableEnd())
}

func (s pullStore) StableEnd(topic string, queue uint32, next int64) int64 {
	if s.txns == nil {
		return next
	}
	return s.txns.stableEnd(topic, queue, next)
}

func (s pullStore) Aborted(payload []byte) bool { return s.txns != nil && s.txns.aborted(payload) }

func (s pullStore) Delivered(topic string, queue uint32, group, member string, from, to int64) {
	s.reads.record(topic, queue, group, member, from, to)
}

func (s pullStore) ReadableEnd() int64 {
	if s.readable == nil {
		return -1
	}
	return s.readable()
}

func (s pullStore) Placed(topic string, queue uint32) bool {
	return s.routed == nil || s.routed(topic, queue)
}

func (s pullStore) LogEpoch() uint32 { return s.epoch() }

func (s pullStore) EpochStart(epoch uint32) (int64, bool, bool) {
	if s.epochStart == nil {
		return 0, false, true
	}
	return s.epochStart(epoch)
}

// pullBytes is how many message bytes a PULL asks for, after the defaults
// and the cap.
func pullBytes(req protocol.PullRequest) int {
	if req.MaxBytes == 0 {
		return defaultPullBytes
	}
	return min(int(req.MaxBytes), maxPullBytes)
}

// pullReplySize estimates the answer to a PULL request body, which the
// transport reserves before it admits the request: the bytes asked for and
// a header. An answer can exceed it by one message, since a PULL returns at
// least one whole message. A parked PULL (longpoll.go) keeps its
// reservation until it is answered.
func pullReplySize(body []byte) int {
	req, err := protocol.DecodePullRequest(body)
	if err != nil {
		return transport.DefaultReplySize // the error's text
	}
	return 64 + pullBytes(req)
}

// handlePull answers a PULL, decoded and authorized (endpoints.go), from
// the commit log, on a master or a slave (a slave serves what it holds).
// claim takes the epoch the reader's route names (session.claim): a newer
// one than the broker's asks the registry now, and fences nothing by
// itself; the read is served. A PULL with a wait that finds nothing at its
// offset is handed to pulls (nil: answered at once), which answers it
// later; the worker never waits.
//
// A PULL names the epoch in which the reader got what it read so far. When
// a later epoch began (a failover) at a log offset where the queue's end
// was below the reader's offset, the reader read messages of the old
// master's tail that the new master never had, and the queue's offsets
// past that end now hold other messages: the answer sends it back there
// (NextOffset below the requested offset, no messages); the store's
// EpochStart says where the epoch after a given one began.
func handlePull(store queueReader, claim func(uint32) bool, pulls *longPoll, rep replier, req protocol.PullRequest) {
	claim(req.Epoch)
	if badFilter(rep, req) || unplaced(store, rep, req) || diverged(store, rep, req) {
		return
	}
	if req.WaitMillis > 0 && pulls != nil {
		if next := readableNext(store, req.Topic, req.Queue, req.ReadUncommitted); req.Offset >= next && pulls.park(rep, req, next) {
			return
		}
		if req.Filter != "" || store.TxnLimit() >= 0 {
			// Nothing the filter takes (or only records of aborted
			// transactions) up to the queue's end: wait there.
			n, past := serveRead(store, rep, req, true)
			if n >= 0 {
				return
			}
			req.Offset = past
			if next := readableNext(store, req.Topic, req.Queue, req.ReadUncommitted); req.Offset >= next && pulls.park(rep, req, next) {
				return
			}
		}
	}
	serveRead(store, rep, req, false)
}

// badFilter answers req INVALID and reports true when its filter does not
// parse.
func badFilter(rep replier, req protocol.PullRequest) bool {
	if req.Filter == "" {
		return false
	}
	if _, err := filters.get(req.Filter); err != nil {
		rep.ReplyError(&protocol.Error{Status: protocol.StatusInvalid, Message: err.Error()})
		return true
	}
	return false
}

// filterCache keeps parsed filters by their text: a group's members send
// the same one in every PULL. It is bounded: when full it starts again.
type filterCache struct {
	mu sync.Mutex
	m  map[string]*protocol.Filter
}

const maxCachedFilters = 1024

var filters filterCache

func (c *filterCache) get(expr string) (*protocol.Filter, error) {
	c.mu.Lock()
	f := c.m[expr]
	c.mu.Unlock()
	if f != nil {
		return f, nil
	}
	f, err := protocol.ParseFilter(expr)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.m == nil || len(c.m) >= maxCachedFilters {
		c.m = map[string]*protocol.Filter{}
	}
	c.m[expr] = f
	c.mu.Unlock()
	return f, nil
}

// readableNext is the queue's next offset, or where its readable part ends
// when reads stop short of the log's end (ReadableEnd, TxnLimit) or, for a
// reader of committed messages, at the first record of an open
// transaction: a PULL there waits as at the end of the queue.
func readableNext(store queueReader, topic string, queue uint32, uncommitted bool) int64 {
	_, next := store.QueueRange(topic, queue)
	if limit := readLimit(store); limit >= 0 {
		if at, err := store.QueueOffsetAt(topic, queue, limit); err == nil {
			next = min(next, at)
		}
	}
	if !uncommitted {
		next = store.StableEnd(topic, queue, next)
	}
	return next
}

// readLimit is the log offset a read stops at: a slave's readable end, or
// where the transaction index stands, whichever comes first (-1: none).
func readLimit(store queueReader) int64 {
	limit := store.ReadableEnd()
	if tl := store.TxnLimit(); tl >= 0 && (limit < 0 || tl < limit) {
		limit = tl
	}
	return limit
}

// unplaced answers req NO_ROUTE and reports true when it asks for an offset
// past 0 of a queue the log holds nothing of, and the queue is not this
// group's by the route cache (which looks the topic up meanwhile). Such a
// reader read the queue elsewhere: at a group the queue moved off (this
// group's log takes it up at its base once the route cache learns of the
// move), or at the wrong broker. Answered as an empty queue, it would go on
// from offset 0 and commit offsets that went back; NO_ROUTE makes it look
// its route up and ask again.
func unplaced(store queueReader, rep replier, req protocol.PullRequest) bool {
	if req.Offset == 0 {
		return false
	}
	if _, next := store.QueueRange(req.Topic, req.Queue); next > 0 || store.Placed(req.Topic, req.Queue) {
		return false
	}
	rep.ReplyError(&protocol.Error{Status: protocol.StatusNoRoute,
		Message: fmt.Sprintf("this broker's group holds nothing of %s queue %d yet: it is looking the queue's route up", req.Topic, req.Queue)})
	return true
}

// diverged answers req and reports true when its reader read, in an
// earlier epoch, past where the next epoch took the queue up (see
// handlePull), or when the broker cannot tell yet.
func diverged(store queueReader, rep replier, req protocol.PullRequest) bool {
	if req.Epoch == 0 {
		return false
	}
	start, ok, known := store.EpochStart(req.Epoch)
	if !known {
		rep.ReplyError(&protocol.Error{Status: protocol.StatusBusy,
			Message: "the broker has not heard its group's epochs from the metaserver yet"})
		return true
	}
	if !ok {
		return false
	}
	end, err := store.QueueOffsetAt(req.Topic, req.Queue, start)
	if err != nil {
		rep.ReplyError(&protocol.Error{Status: protocol.StatusStoreError,
			Message: "cannot check the read against the group's epochs: " + err.Error()})
		return true
	}
	if req.Offset <= end {
		return false
	}
	first, next := store.QueueRange(req.Topic, req.Queue)
	_ = rep.Reply(protocol.AppendPullResponseHeader(nil, end, first, next, store.LogEpoch(), 0))
	return true
}

// servePull answers req with what the queue holds at its offset now
// (possibly nothing: then just the header, with the queue's offsets). A
// parked PULL is checked again here: a failover may have happened while it
// waited.
func servePull(store queueReader, rep replier, req protocol.PullRequest) (count int) {
	if diverged(store, rep, req) {
		return 0
	}
	count, _ = serveRead(store, rep, req, false)
	return count
}

// serveRead is servePull for a request already checked by diverged. The
// records are read into the answer's buffer and rewritten there in place
// (storage.ReadMatching): one copy of each body, from the file. The buffer
// goes to the connection's writer (ReplyGiven), which sends it without a
// copy and gives it back for later PULLs once written.
//
// A PULL with a filter gets the messages it takes: the index skips those
// whose tag cannot match without reading them, the filter judges the rest
// (MatchEncoded), and the answer's next offset passes the skipped ones.
// With holdEmpty, an answer that would hold no message is not sent: count
// is -1 and past the offset where the read stopped (the caller parks the
// PULL there).
func serveRead(store queueReader, rep replier, req protocol.PullRequest, holdEmpty bool) (count int, past int64) {
	var flt *protocol.Filter
	var want func(uint32) bool
	if req.Filter != "" {
		flt, _ = filters.get(req.Filter) // parsed by badFilter before
		if flt != nil && flt.SkipsByTag() {
			want = flt.Candidate
		}
	}
	first, next := store.QueueRange(req.Topic, req.Queue)
	offset := max(req.Offset, first)
	// A slave stops where every member of the sync set held the log at the
	// master's last report (acknowledgements are at record boundaries),
	// every broker where its transaction index stands and, for a reader of
	// committed messages, at the first record of an open transaction.
	limit := readLimit(store)
	if !req.ReadUncommitted {
		if stable := store.StableEnd(req.Topic, req.Queue, next); stable < next {
			at, err := store.LogOffsetOf(req.Topic, req.Queue, max(stable, offset))
			if err != nil {
				// Without the stable end's place nothing may be read.
				rep.ReplyError(&protocol.Error{Status: protocol.StatusStoreError, Message: "the first open transaction's record: " + err.Error()})
				return 0, 0
			}
			if limit < 0 || at < limit {
				limit = at
			}
		}
	}
	bp, _ := pullBufs.Get().(*[]byte)
	if bp == nil {
		bp = new([]byte)
	}
	giveBack := func() {
		if cap(*bp) <= maxPooledPull {
			pullBufs.Put(bp)
		}
	}
	out := append((*bp)[:0], make([]byte, pullHeaderSize)...) // ReadAppend grows it to what it reads
	// The runs of consecutive offsets answered, for the record of who read
	// what (a filter's skips end a run: those were not delivered).
	var runs [][2]int64
	out, readTo, err := store.ReadMatching(out, req.Topic, req.Queue, offset, pullBytes(req), limit, want, func(dst []byte, e storage.StoredEntry) []byte {
		if flt != nil && !flt.MatchEncoded(e.Payload) || store.Aborted(e.Payload) {
			return dst
		}
		if n := len(runs); n > 0 && runs[n-1][1] == e.QueueOffset {
			runs[n-1][1]++
		} else if req.Group != "" {
			runs = append(runs, [2]int64{e.QueueOffset, e.QueueOffset + 1})
		}
		count++
		return protocol.AppendStoredRaw(dst, e.QueueOffset, e.LogOffset, e.StoreTime, e.Payload)
	})
	if err != nil {
		st := protocol.StatusStoreError
		switch {
		case errors.Is(err, storage.ErrOutOfRange):
			st = protocol.StatusInvalid
		case errors.Is(err, storage.ErrReadTruncated):
			st = protocol.StatusBusy // the log was cut under the read: reading again is safe
		case errors.Is(err, storage.ErrClosed):
			st = protocol.StatusShuttingDown
		}
		*bp = out[:0]
		giveBack()
		rep.ReplyError(&protocol.Error{Status: st, Message: err.Error()})
		return 0, 0
	}
	// readTo is the answer's next offset (past what was skipped). A read
	// that raced with appends can see entries past the range read before
	// it: the header never claims less than was read. A slave's answer
	// claims no more than its readable end.
	if readTo > offset {
		offset = readTo
		next = max(next, offset)
	}
	if limit >= 0 {
		if at, err := store.QueueOffsetAt(req.Topic, req.Queue, limit); err == nil {
			next = min(next, max(at, offset))
		}
	}
	if holdEmpty && count == 0 {
		*bp = out[:0]
		giveBack()
		return -1, offset
	}
	for _, r := range runs {
		store.Delivered(req.Topic, req.Queue, req.Group, req.Member, r[0], r[1])
	}
	protocol.AppendPullResponseHeader(out[:0], offset, first, next, store.LogEpoch(), count)
	*bp = out[:0]
	_ = rep.ReplyGiven(out, giveBack)
	return count, offset
}

// pullBufs holds the buffers of PULL answers between PULLs (*[]byte): a
// fresh one per answer cost its zeroing and, in a drain, page faults, a
// tenth of the broker's CPU per message. One over maxPooledPull (an answer
// of one very large message) is left to the collector.
var pullBufs sync.Pool

const maxPooledPull = maxPullBytes + 1<<20

// pullHeaderSize is the size of a PULL answer's header
// (protocol.AppendPullResponseHeader).
const pullHeaderSize = 8 + 8 + 8 + 4 + 4

// maxCountScan bounds the index entries one QUEUE_COUNT looks at.
const maxCountScan = 1 << 22

// handleQueueCount answers QUEUE_COUNT from the index: how many of a
// queue's messages in a range a filter can take (protocol.QueueCount).
func (b *Broker) handleQueueCount(r *transport.Request, q protocol.QueueCountRequest) {
	var want func(uint32) bool
	if q.Filter != "" {
		f, err := filters.get(q.Filter)
		if err != nil {
			r.ReplyError(&protocol.Error{Status: protocol.StatusInvalid, Message: err.Error()})
			return
		}
		if f.SkipsByTag() {
			want = f.Candidate
		}
	}
	first, next := b.store.QueueRange(q.Topic, q.Queue)
	from, to := max(q.From, first), min(q.To, next)
	out := protocol.QueueCount{ScannedTo: max(from, to)}
	if from < to {
		n, scanned, err := b.store.CountMatching(q.Topic, q.Queue, from, to, want, maxCountScan)
		if err != nil {
			r.ReplyError(&protocol.Error{Status: protocol.StatusStoreError, Message: err.Error()})
			return
		}
		out.Count, out.ScannedTo = n, scanned
	}
	body, _ := json.Marshal(out)
	_ = r.Reply(body)
}

// decodeQueueCount decodes a QUEUE_COUNT body.
func decodeQueueCount(body []byte) (protocol.QueueCountRequest, error) {
	var q protocol.QueueCountRequest
	if err := json.Unmarshal(body, &q); err != nil {
		return q, &protocol.Error{Status: protocol.StatusInvalid, Message: fmt.Sprintf("queue count request: %v", err)}
	}
	if q.From < 0 || q.To < q.From {
		return q, &protocol.Error{Status: protocol.StatusInvalid, Message: fmt.Sprintf("queue count range [%d, %d) is not a range", q.From, q.To)}
	}
	return q, nil
}
