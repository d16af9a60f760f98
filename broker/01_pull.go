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

// handlePull answers PULL from the commit log, on a master or a slave.
func (b *Broker) handlePull(r *transport.Request) {
	req, err := protocol.DecodePullRequest(r.Body)
	if err != nil {
		r.ReplyError(err)
		return
	}
	maxBytes := int(req.MaxBytes)
	if maxBytes <= 0 {
		maxBytes = defaultPullBytes
	}
	maxBytes = min(maxBytes, maxPullBytes)
	first, next := b.store.QueueRange(req.Topic, req.Queue)
	offset := max(req.Offset, first)
	entries, err := b.store.Read(req.Topic, req.Queue, offset, maxBytes)
	if err != nil {
		st := protocol.StatusStoreError
		if errors.Is(err, storage.ErrOutOfRange) {
			st = protocol.StatusInvalid
		}
		r.ReplyError(&protocol.Error{Status: st, Message: err.Error()})
		return
	}
	nextOffset := offset
	size := 0
	for _, e := range entries {
		size += 16 + len(e.Payload)
	}
	if len(entries) > 0 {
		nextOffset = entries[len(entries)-1].QueueOffset + 1
	}
	body := protocol.AppendPullResponseHeader(make([]byte, 0, 28+size), nextOffset, first, next, len(entries))
	for _, e := range entries {
		body = protocol.AppendStoredRaw(body, e.QueueOffset, e.LogOffset, e.Payload)
	}
	_ = r.Reply(body)
}
