package broker

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/storage"
)

const (
	// defaultLookupLimit is a LOOKUP page when the request names none.
	defaultLookupLimit = 20
	// lookupBytes bounds what one LOOKUP by id or key reads of key tables
	// before it answers with a cursor, lookupReply the bodies it answers.
	lookupBytes = 64 << 20
	lookupReply = 8 << 20
)

// handleLookup answers LOOKUP (protocol.LookupRequest): the record at a
// handle's log offset, or a page of the records of a message id or key
// within a window of store times. Each message found is shown only to a
// principal that may consume its topic (a pending delayed message, only to
// one that may look it up with DELAYED_STATE); the others are counted
// (Hidden). A page holds at most lookupReply bytes of bodies (and at least
// one message). A slave searches nothing past what every member of the
// sync set holds: it refuses BUSY a cursor past that, so that the reader
// asks another broker rather than miss what lies between.
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
	readable := b.pulls.store.ReadableEnd()
	if q.Offset != nil {
		ri, err := b.store.ReadRecordAt(*q.Offset)
		if err != nil {
			r.ReplyError(b.lookupReadError(*q.Offset, err))
			return
		}
		if readable < 0 || ri.Offset+int64(ri.Size) <= readable {
			b.showFound(r, &q, ri, &out)
		}
		replyJSON(r, out)
		return
	}
	if readable >= 0 {
		if q.Before > readable {
			r.ReplyError(&protocol.Error{Status: protocol.StatusBusy,
				Message: fmt.Sprintf("this slave holds what every copy has up to log offset %d, below the cursor %d: ask the master", readable, q.Before)})
			return
		}
		if q.Before == 0 {
			q.Before = readable
		}
	}
	until := int64(0)
	if q.Until > 0 && q.Until < math.MaxInt64 {
		until = q.Until + 1 // the request's window includes Until
	}
	res, err := b.store.Lookup(storage.LookupQuery{Key: []byte(q.ID + q.Key), Since: q.Since, Until: until, Before: q.Before, Limit: q.Limit,
		MaxBytes: lookupBytes})
	if err != nil {
		r.ReplyError(&protocol.Error{Status: protocol.StatusStoreError, Message: err.Error()})
		return
	}
	out.Next, out.ScannedBytes = res.Next, res.ScannedBytes
	body := 0
	for i, at := range res.Offsets {
		if body >= lookupReply && len(out.Messages) > 0 {
			out.Next = res.Offsets[i-1] // the next page starts below the last read
			break
		}
		ri, err := b.store.ReadRecordAt(at)
		if err != nil {
			continue // deleted by retention or cut since: not there any more
		}
		out.ScannedBytes += int64(ri.Size)
		body += ri.Size * 4 / 3 // base64 in the JSON answer
		b.showFound(r, &q, ri, &out)
	}
	replyJSON(r, out)
}

// showFound adds a record LOOKUP read to its answer: a message the request
// looks for (lookedFor), shown if the principal may see it, else counted.
func (b *Broker) showFound(r *transport.Request, q *protocol.LookupRequest, ri storage.RecordInfo, out *protocol.LookupReply) {
	m, err := protocol.DecodeMessage(ri.Payload)
	if err != nil || !lookedFor(q, ri, &m) {
		return // not a message (never stored so), another's key, or a delayed message's mark
	}
	// A pending delayed message is not yet its topic's to read: it is
	// shown to who may look it up (DELAYED_STATE: its producers, describe).
	code := protocol.CodeLookup
	if m.Schedule.Kind == protocol.ScheduleDelayed {
		code = protocol.CodeDelayedState
	}
	if b.acl != nil && b.acl.check(r, code, auth.Topic(m.Topic)) != nil {
		out.Hidden++
		return
	}
	f := foundMessage(b.cfg.Group, ri, &m)
	f.HeldBy = b.heldBy(ri.Offset + int64(ri.Size))
	f.Deliveries = b.reads.of(ri.Topic, ri.Queue, ri.QueueOffset)
	out.Messages = append(out.Messages, f)
}

// lookedFor says whether a record is one the request looks for: any at a
// handle's offset; by id, the message of that id or a dead letter or retry
// copy of it; by key, a message of that key; in the window of store times.
func lookedFor(q *protocol.LookupRequest, ri storage.RecordInfo, m *protocol.Message) bool {
	if k := m.Schedule.Kind; k == protocol.ScheduleReleaseMark || k == protocol.ScheduleCancelMark {
		return false // a delayed message's bookkeeping, not a message
	}
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
