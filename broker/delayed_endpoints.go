package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/protocol"
)

// delayedCallTimeout bounds how long a cancel waits for the delayer (and,
// for a HIGH message, for the sync set to hold the cancel mark).
const delayedCallTimeout = 10 * time.Second

// decodeDelayedRef reads the pending record a DELAYED_CANCEL or
// DELAYED_STATE names, so that authorization checks its topic.
func (b *Broker) decodeDelayedRef(body []byte) (pendingRecord, error) {
	var ref protocol.DelayedRef
	if err := json.Unmarshal(body, &ref); err != nil {
		return pendingRecord{}, &protocol.Error{Status: protocol.StatusInvalid, Message: fmt.Sprintf("delayed message reference: %v", err)}
	}
	if ref.Offset >= 0 && ref.Offset < b.store.StartOffset() && ref.DueAt > 0 {
		// Deleted by retention: if the record was moved first, the index
		// knows where to (by its due time, which the handle carries).
		if to, ok, err := b.delays.idx.MovedTo(ref.Offset, ref.DueAt); err != nil {
			return pendingRecord{}, asProtocolError(err)
		} else if ok {
			ref.Offset = to
		}
	}
	if ref.Offset < 0 || ref.Offset >= b.store.EndOffset() || ref.Offset < b.store.StartOffset() {
		return pendingRecord{}, &protocol.Error{Status: protocol.StatusNotFound,
			Message: fmt.Sprintf("log offset %d is outside group %s's log [%d, %d)", ref.Offset, b.cfg.Group, b.store.StartOffset(), b.store.EndOffset())}
	}
	p, err := b.delays.readPending(ref.Offset)
	if err != nil {
		if _, ok := err.(*protocol.Error); ok {
			return pendingRecord{}, err
		}
		return pendingRecord{}, &protocol.Error{Status: protocol.StatusNotFound, Message: err.Error()}
	}
	return p, nil
}

// handleDelayedState answers what became of a delayed message.
func (b *Broker) handleDelayedState(r *transport.Request, p pendingRecord) {
	st, err := b.delays.describe(&p)
	if err != nil {
		r.ReplyError(err)
		return
	}
	replyJSON(r, st)
}

// handleDelayedCancel cancels a pending delayed message: the answer says
// cancelled (By "cancel") when this request did it, else what became of it
// (released, and where; cancelled before; moved). A HIGH message's cancel
// is answered once the sync set holds the cancel mark, as its SEND was.
func (b *Broker) handleDelayedCancel(r *transport.Request, p pendingRecord) {
	ctx, cancel := context.WithTimeout(b.ctx, delayedCallTimeout)
	defer cancel()
	a := b.delays.call(ctx, &delayReq{cancel: &p})
	if a.err != nil {
		r.ReplyError(asProtocolError(a.err))
		return
	}
	if a.high && a.end >= 0 {
		done := make(chan protocol.Status, 1)
		a.rep.await(a.end, func(st protocol.Status) { done <- st })
		select {
		case st := <-done:
			if st != protocol.StatusOK {
				r.ReplyError(&protocol.Error{Status: st, Message: "the cancel mark is stored on the master; its copies were not confirmed"})
				return
			}
		case <-ctx.Done():
			r.ReplyError(&protocol.Error{Status: protocol.StatusTimeout, Message: "the cancel mark is stored on the master; its copies were not confirmed in time"})
			return
		}
	}
	if a.rep != nil && !b.delays.writable(a.rep) {
		// Stepped down (or the lease ran out) before the answer: the mark may
		// be cut when this broker rejoins, as an unacknowledged SEND is.
		r.ReplyError(&protocol.Error{Status: protocol.StatusLeaseLost, Message: "the cancel mark is stored, but this broker stopped being the writable master before answering"})
		return
	}
	replyJSON(r, a.state)
}

// handleDelayedList answers the group's pending delayed messages.
func (b *Broker) handleDelayedList(r *transport.Request) {
	var q protocol.DelayedListRequest
	if len(r.Body) > 0 {
		if err := json.Unmarshal(r.Body, &q); err != nil {
			r.ReplyError(&protocol.Error{Status: protocol.StatusInvalid, Message: fmt.Sprintf("delayed list request: %v", err)})
			return
		}
	}
	width := time.Duration(q.BucketMillis) * time.Millisecond
	switch {
	case q.BucketMillis == 0:
		width = time.Minute
	case q.BucketMillis < 0 || width < time.Second:
		r.ReplyError(&protocol.Error{Status: protocol.StatusInvalid, Message: "bucket width must be at least 1000 ms"})
		return
	}
	limit := q.Limit
	if limit <= 0 || limit > 1000 {
		limit = 100
	}
	idx := b.delays.idx
	out := protocol.DelayedList{Group: b.cfg.Group, Pending: idx.Pending(q.Topic), Now: b.cfg.Clock.Now().UnixMilli(),
		Buckets: []protocol.DelayedBucket{}, Topics: []protocol.DelayedTopicCounts{}}
	if next, ok := idx.NextDue(); ok {
		out.NextDue = next
	}
	for _, bk := range idx.Buckets(q.Topic, width, limit) {
		out.Buckets = append(out.Buckets, protocol.DelayedBucket{Start: bk.Start, Pending: bk.Pending})
	}
	var topics []string
	b.store.Queues(func(topic string, _ uint32, _, _ int64) {
		if t, ok := protocol.IsDelayTopic(topic); ok && (q.Topic == "" || q.Topic == t) && !slices.Contains(topics, t) {
			topics = append(topics, t)
		}
	})
	slices.Sort(topics)
	for _, t := range topics {
		out.Topics = append(out.Topics, protocol.DelayedTopicCounts{Topic: t, Pending: idx.Pending(t), Quota: b.cfg.DelayQuota})
	}
	replyJSON(r, out)
}

func replyJSON(r *transport.Request, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		r.ReplyError(&protocol.Error{Status: protocol.StatusInternal, Message: err.Error()})
		return
	}
	_ = r.Reply(body)
}

// asProtocolError keeps a *protocol.Error and makes anything else one.
func asProtocolError(err error) error {
	if pe, ok := err.(*protocol.Error); ok {
		return pe
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return &protocol.Error{Status: protocol.StatusTimeout, Message: "the delayer did not answer in time"}
	case errors.Is(err, context.Canceled):
		return &protocol.Error{Status: protocol.StatusShuttingDown, Message: "the broker is shutting down"}
	}
	return &protocol.Error{Status: protocol.StatusInternal, Message: err.Error()}
}
