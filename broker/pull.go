package broker

import (
	"errors"

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
	Read(topic string, queue uint32, offset int64, maxBytes int) ([]storage.StoredEntry, error)
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

// handlePull answers PULL from the commit log, on a master or a slave (a
// slave serves what it holds). fence takes the epoch the reader's route
// names: a master that sees a newer one stops taking writes. A PULL with a
// wait that finds nothing at its offset is handed to pulls (nil: answered
// at once), which answers it later; the worker never waits.
func handlePull(store queueReader, fence func(uint32), pulls *longPoll, rep replier, body []byte) {
	req, err := protocol.DecodePullRequest(body)
	if err != nil {
		rep.ReplyError(err)
		return
	}
	fence(req.Epoch)
	if req.WaitMillis > 0 && pulls != nil {
		if _, next := store.QueueRange(req.Topic, req.Queue); req.Offset >= next && pulls.park(rep, req, next) {
			return
		}
	}
	servePull(store, rep, req)
}

// servePull answers req with what the queue holds at its offset now
// (possibly nothing: then just the header, with the queue's offsets).
func servePull(store queueReader, rep replier, req protocol.PullRequest) (count int) {
	first, next := store.QueueRange(req.Topic, req.Queue)
	offset := max(req.Offset, first)
	entries, err := store.Read(req.Topic, req.Queue, offset, pullBytes(req))
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
		rep.ReplyError(&protocol.Error{Status: st, Message: err.Error()})
		return 0
	}
	nextOffset := offset
	size := 0
	for _, e := range entries {
		size += 24 + len(e.Payload)
	}
	if len(entries) > 0 {
		nextOffset = entries[len(entries)-1].QueueOffset + 1
		// A read that raced with appends can see entries past the range
		// read before it: the header never claims less than was returned.
		next = max(next, nextOffset)
	}
	out := protocol.AppendPullResponseHeader(make([]byte, 0, 28+size), nextOffset, first, next, len(entries))
	for _, e := range entries {
		out = protocol.AppendStoredRaw(out, e.QueueOffset, e.LogOffset, e.StoreTime, e.Payload)
	}
	_ = rep.Reply(out)
	return len(entries)
}
