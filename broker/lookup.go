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

const (
	// defaultLookupLimit is a LOOKUP page when the request names none.
	defaultLookupLimit = 20
	// lookupBytes bounds what one LOOKUP by id or key reads of key tables
	// and records before it answers with a cursor.
	lookupBytes = 64 << 20
)

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
		if err != nil || limit >= 0 && ri.Offset+int64(ri.Size) > limit || !lookedFor(&q, ri, &m) {
			return // not a message (never stored so), not readable here yet, or another's key
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
	key := q.ID + q.Key // one of them
	until := int64(0)
	if q.Until > 0 {
		until = q.Until + 1 // the request's window includes Until
	}
	res, err := b.store.Lookup(storage.LookupQuery{Key: []byte(key), Since: q.Since, Until: until, Before: q.Before, Limit: q.Limit, MaxBytes: lookupBytes})
	if err != nil {
		r.ReplyError(&protocol.Error{Status: protocol.StatusStoreError, Message: err.Error()})
		return
	}
	out.Next, out.ScannedBytes = res.Next, res.ScannedBytes
	for _, at := range res.Offsets {
		ri, err := b.store.ReadRecordAt(at)
		if err != nil {
			continue // deleted by retention or cut since: not there any more
		}
		out.ScannedBytes += int64(ri.Size)
		show(ri)
	}
	replyJSON(r, out)
}

// lookedFor says whether a record is one the request looks for: any at a
// handle's offset; by id, the message of that id or a dead letter or retry
// copy of it; by key, a message of that key; in the window of store times.
func lookedFor(q *protocol.LookupRequest, ri storage.RecordInfo, m *protocol.Message) bool {
	if q.Offset != nil {
		return true
	}
	if ri.StoreTime < q.Since || q.Until > 0 && ri.StoreTime > q.Until {
		return false
	}
	if q.ID != "" && m.ID == q.ID {
		return true
	}
	for _, p := range m.Properties {
		switch {
		case q.Key != "" && p.Key == protocol.KeyProperty && p.Value == q.Key,
			q.ID != "" && (p.Key == protocol.DeadLetterOriginID || p.Key == protocol.RetryOriginID) && p.Value == q.ID:
			return true
		}
	}
	return false
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
