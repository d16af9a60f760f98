package broker

import (
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
	// ReadAppend is storage.Log.ReadAppend.
	ReadAppend(dst []byte, topic string, queue uint32, offset int64, maxBytes int, emit func([]byte, storage.StoredEntry) []byte) ([]byte, error)
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
	if unplaced(store, rep, req) || diverged(store, rep, req) {
		return
	}
	if req.WaitMillis > 0 && pulls != nil {
		if next := readableNext(store, req.Topic, req.Queue); req.Offset >= next && pulls.park(rep, req, next) {
			return
		}
	}
	serveRead(store, rep, req)
}

// readableNext is the queue's next offset, or where its readable part ends
// when reads stop short of the log's end (ReadableEnd): a PULL there waits
// as at the end of the queue.
func readableNext(store queueReader, topic string, queue uint32) int64 {
	_, next := store.QueueRange(topic, queue)
	if limit := store.ReadableEnd(); limit >= 0 {
		if at, err := store.QueueOffsetAt(topic, queue, limit); err == nil {
			next = min(next, at)
		}
	}
	return next
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
	return serveRead(store, rep, req)
}

// serveRead is servePull for a request already checked by diverged. The
// records are read into the answer's buffer and rewritten there in place
// (storage.ReadAppend): one copy of each body, from the file. The buffer
// goes to the connection's writer (ReplyGiven), which sends it without a
// copy and gives it back for later PULLs once written.
func serveRead(store queueReader, rep replier, req protocol.PullRequest) (count int) {
	first, next := store.QueueRange(req.Topic, req.Queue)
	offset := max(req.Offset, first)
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
	// A slave stops where every member of the sync set held the log at the
	// master's last report (acknowledgements are at record boundaries).
	limit, held := store.ReadableEnd(), int64(-1)
	out, err := store.ReadAppend(out, req.Topic, req.Queue, offset, pullBytes(req), func(dst []byte, e storage.StoredEntry) []byte {
		if limit >= 0 && e.LogOffset >= limit {
			if held < 0 {
				held = e.QueueOffset
			}
			return dst
		}
		count++
		offset = e.QueueOffset + 1
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
		return 0
	}
	// offset is now the answer's next offset. A read that raced with
	// appends can see entries past the range read before it: the header
	// never claims less than was returned.
	if count > 0 {
		next = max(next, offset)
	}
	if held >= 0 {
		next = min(next, held)
	}
	protocol.AppendPullResponseHeader(out[:0], offset, first, next, store.LogEpoch(), count)
	*bp = out[:0]
	_ = rep.ReplyGiven(out, giveBack)
	return count
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
