package broker

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/storage"
)

// defaultLookupLimit is a LOOKUP page when the request names none.
const defaultLookupLimit = 20

// handleLookup answers LOOKUP (protocol.LookupRequest): the record at a
// handle's log offset, or a page of the records of a message id or key
// within a window of store times. Each message found is shown only to a
// principal that may consume its topic; the others are counted (Hidden).
// A slave shows nothing past what every member of the sync set holds.
func (b *Broker) handleLookup(r *transport.Request) {
	var q protocol.LookupRequest
	if err := json.Unmarshal(r.Body, &q); err != nil {
		r.ReplyError(&protocol.Error{Status: protocol.StatusInvalid, Message: fmt.Sprintf("lookup request: %v", err)})
		return
	}
	if err := checkLookup(&q); err != nil {
		r.ReplyError(err)
		return
	}
	out := protocol.LookupReply{Group: b.cfg.Group, Messages: []protocol.FoundMessage{}}
	limit := b.pulls.store.ReadableEnd()
	show := func(ri storage.RecordInfo) {
		m, err := protocol.DecodeMessage(ri.Payload)
		if err != nil || limit >= 0 && ri.Offset+int64(ri.Size) > limit {
			return // not a message (never stored so), or not readable here yet
		}
		if b.acl != nil && b.acl.check(r, protocol.CodeLookup, auth.Topic(m.Topic)) != nil {
			out.Hidden++
			return
		}
		f := foundMessage(b.cfg.Group, ri, &m)
		f.HeldBy = b.heldBy(ri.Offset + int64(ri.Size))
		f.Deliveries = b.reads.of(ri.Topic, ri.Queue, ri.QueueOffset)
		out.Messages = append(out.Messages, f)
	}
	if q.Offset != nil {
		ri, err := b.store.ReadRecordAt(*q.Offset)
		if err != nil {
			r.ReplyError(b.lookupReadError(*q.Offset, err))
			return
		}
		show(ri)
		replyJSON(r, out)
		return
	}
	r.ReplyError(&protocol.Error{Status: protocol.StatusInvalid, Message: "lookup by id or key: not served by this broker"})
}

// heldBy lists the group's brokers known to hold the log up to end: this
// one and, on a master, each slave that acknowledged it.
func (b *Broker) heldBy(end int64) []string {
	out := []string{b.cfg.ID}
	if rep := b.roles.replication(); rep != nil {
		for _, s := range rep.replicas() {
			if s.AckOffset >= end {
				out = append(out, s.ID)
			}
		}
	}
	return out
}

// checkLookup checks a LOOKUP request and fills its defaults.
func checkLookup(q *protocol.LookupRequest) error {
	n := 0
	for _, set := range []bool{q.Offset != nil, q.ID != "", q.Key != ""} {
		if set {
			n++
		}
	}
	bad := func(format string, args ...any) error {
		return &protocol.Error{Status: protocol.StatusInvalid, Message: fmt.Sprintf(format, args...)}
	}
	switch {
	case n != 1:
		return bad("a lookup names one of a log offset (a handle), a message id or a key; this one names %d", n)
	case q.Offset != nil && *q.Offset < 0:
		return bad("log offset %d: want 0 or more", *q.Offset)
	case q.Limit < 0 || q.Limit > protocol.MaxLookupLimit:
		return bad("limit %d: want 0 (the default, %d) to %d", q.Limit, defaultLookupLimit, protocol.MaxLookupLimit)
	case q.Since < 0 || q.Until < 0 || q.Until > 0 && q.Until < q.Since || q.Before < 0:
		return bad("window [%d, %d] and cursor %d: want times and a cursor of 0 or more, since before until", q.Since, q.Until, q.Before)
	}
	if q.Limit == 0 {
		q.Limit = defaultLookupLimit
	}
	return nil
}

// lookupReadError says why no record could be read at a handle's offset.
func (b *Broker) lookupReadError(at int64, err error) error {
	var ce *storage.CorruptError
	switch {
	case errors.Is(err, storage.ErrOutOfRange):
		return &protocol.Error{Status: protocol.StatusNotFound, Message: fmt.Sprintf("log offset %d is outside group %s's log [%d, %d) (retention deletes the oldest)",
			at, b.cfg.Group, b.store.StartOffset(), b.store.EndOffset())}
	case errors.As(err, &ce):
		return &protocol.Error{Status: protocol.StatusNotFound, Message: fmt.Sprintf("no message starts at log offset %d of group %s", at, b.cfg.Group)}
	}
	return &protocol.Error{Status: protocol.StatusStoreError, Message: err.Error()}
}

// foundMessage is what LOOKUP shows of a record and its message.
func foundMessage(group string, ri storage.RecordInfo, m *protocol.Message) protocol.FoundMessage {
	f := protocol.FoundMessage{Handle: protocol.Handle{Group: group, Offset: ri.Offset}.String(), Topic: m.Topic,
		Queue: ri.Queue, QueueOffset: ri.QueueOffset, LogOffset: ri.Offset, StoreTime: ri.StoreTime, ID: m.ID, Tag: m.Tag,
		Timestamp: m.Timestamp, Reliability: m.Reliability.String(), Recovered: ri.Recovered, Body: m.Body}
	if ri.Topic != m.Topic {
		f.InternalTopic = ri.Topic
	}
	if !m.Producer.IsZero() {
		f.Producer = &m.Producer
	}
	if m.Schedule.Kind != protocol.ScheduleNone {
		f.Schedule = &m.Schedule
	}
	for _, p := range m.Properties {
		if p.Key == protocol.KeyProperty {
			f.Key = p.Value
			continue
		}
		if f.Properties == nil {
			f.Properties = map[string]string{}
		}
		f.Properties[p.Key] = p.Value
	}
	return f
}
