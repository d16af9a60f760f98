package ops

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/ferrymq/ferrymq/consumer"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/protocol"
)

// JourneyStep is one step of a journey; Known false: what is not known.
type JourneyStep struct {
	Step  string `json:"step"`
	What  string `json:"what"`
	Known bool   `json:"known"`
}

// JourneyMessage finds the message a journey is of: at a handle
// (GROUP@OFFSET of a group that exists), else by its id, with the retry
// copies and dead letters of it.
func JourneyMessage(ctx context.Context, cl *client.Client, dial Dial, arg string) (protocol.FoundMessage, []protocol.FoundMessage, error) {
	notFound := &protocol.Error{Status: protocol.StatusNotFound, Message: fmt.Sprintf("%s: no message you may read", arg)}
	if h, err := protocol.ParseHandle(arg); err == nil {
		if gi, err := GroupNamed(ctx, cl, h.Group); err == nil {
			reply, err := LookupIn(ctx, dial, gi, protocol.LookupRequest{Offset: &h.Offset})
			if err != nil {
				return protocol.FoundMessage{}, nil, err
			}
			if len(reply.Messages) == 0 {
				return protocol.FoundMessage{}, nil, notFound
			}
			return reply.Messages[0], nil, nil
		}
	}
	var found []protocol.FoundMessage
	cursor := ""
	for range JourneyPages {
		page, err := FindAll(ctx, cl, dial, protocol.LookupRequest{ID: arg, Limit: 100}, cursor)
		if err != nil {
			return protocol.FoundMessage{}, nil, err
		}
		found = append(found, page.Messages...)
		if cursor = page.Cursor; cursor == "" {
			break
		}
	}
	// Newest first: the message is the oldest record of the id in its own
	// queue (a released delayed message: its released copy), else its
	// pending record; the others are its retry copies and dead letters.
	var m, pending *protocol.FoundMessage
	var copies []protocol.FoundMessage
	for i := range found {
		switch f := &found[i]; {
		case f.Properties[protocol.DeadLetterOriginID] == arg || f.Properties[protocol.RetryOriginID] == arg:
			copies = append(copies, *f)
		case f.ID == arg && f.InternalTopic == "":
			m = f
		case f.ID == arg:
			pending = f
		}
	}
	if m == nil {
		m = pending
	}
	if m == nil {
		return protocol.FoundMessage{}, nil, notFound
	}
	slices.Reverse(copies)
	return *m, copies, nil
}

// JourneyPages bounds the pages of a search by id a journey reads.
const JourneyPages = 20

// JourneyOf puts together what is known of a found message's journey, with
// its retry copies and dead letters (oldest first) and the consumer groups'
// committed offsets.
//
// With hideErrors its steps leave out the handler errors a dead letter or
// a retry carries (they often quote the body).
func JourneyOf(m protocol.FoundMessage, copies []protocol.FoundMessage, groups []api.ConsumerGroupInfo, hideErrors bool) []JourneyStep {
	var steps []JourneyStep
	step := func(name string, known bool, format string, args ...any) {
		steps = append(steps, JourneyStep{Step: name, What: fmt.Sprintf(format, args...), Known: known})
	}
	if p := m.Producer; p != nil {
		step("sent", true, "by producer %d (epoch %d), its sequence %d, at %s by its clock", p.ID, p.Epoch, p.Seq, FormatMillis(m.Timestamp))
	} else {
		step("sent", false, "at %s by its producer's clock; the producer is not known (its message carries no stamp)", FormatMillis(m.Timestamp))
	}
	step("stored", true, "%s, in broker group %s at log offset %d, %s; held by %s", m.Reliability, strings.SplitN(m.Handle, "@", 2)[0],
		m.LogOffset, FormatMillis(m.StoreTime), strings.Join(m.HeldBy, ", "))
	if m.Reliability == protocol.High.String() {
		step("acknowledged", false, "once the group's sync set held it (how long that took is not recorded)")
	}
	if s := m.Schedule; s != nil {
		switch s.Kind {
		case protocol.ScheduleDelayed:
			step("delayed", true, "pending, due at %s (ferryctl delayed get %s says whether it was released)", FormatMillis(s.At),
				protocol.Handle{Group: strings.SplitN(m.Handle, "@", 2)[0], Offset: m.LogOffset, DueAt: s.At})
		case protocol.ScheduleReleased:
			step("delayed", true, "due at %s, released into its queue at %s (%s late) from the pending record at log offset %d",
				FormatMillis(s.At), FormatMillis(m.StoreTime), time.Duration(max(m.StoreTime-s.At, 0))*time.Millisecond, s.Ref)
		}
	}
	if m.InternalTopic != "" { // a pending delayed message: not in its queue yet
		step("delivered", false, "not yet: it is pending in %s until it is due", m.InternalTopic)
		return steps
	}
	if len(m.Deliveries) == 0 {
		step("delivered", false, "no read of it that names a consumer group is remembered by the broker (a bounded record in its memory)")
	}
	for _, d := range m.Deliveries {
		step("delivered", true, "to member %s of consumer group %s at %s", d.Member, d.Group, FormatMillis(d.At))
	}
	for _, cg := range groups {
		for _, r := range cg.Redelivered {
			if r.Topic == m.Topic && r.Queue == m.Queue && r.Offset == m.QueueOffset {
				step("delivered", true, "%d times to member %s of consumer group %s (its handler failed before), handled at %s",
					r.Deliveries, r.Member, cg.Name, FormatMillis(r.At))
			}
		}
	}
	committed := false
	for _, cg := range groups {
		for _, o := range cg.Offsets {
			if o.Topic != m.Topic || o.Queue != m.Queue {
				continue
			}
			committed = true
			if o.Offset > m.QueueOffset {
				step("committed", true, "by consumer group %s (its offset %d is past it)", cg.Name, o.Offset)
			} else {
				step("committed", true, "not yet by consumer group %s (its offset %d)", cg.Name, o.Offset)
			}
		}
	}
	if !committed {
		step("committed", false, "no consumer group has an offset of its queue")
	}
	errOf := func(c protocol.FoundMessage, prop string) string {
		if hideErrors {
			return "(the error is not shown)"
		}
		return orDash(c.Properties[prop])
	}
	for _, c := range copies {
		if c.Properties[protocol.DeadLetterOriginID] != "" {
			step("dead-lettered", true, "to %s at %s (handle %s) after %s deliveries: %s", c.Topic, FormatMillis(c.StoreTime), c.Handle,
				orDash(c.Properties[consumer.PropDeliveries]), errOf(c, consumer.PropError))
		} else {
			step("retried", true, "stored for a retry in %s at %s (handle %s): %s", c.Topic, FormatMillis(c.StoreTime), c.Handle, errOf(c, consumer.PropRetry))
		}
	}
	return steps
}

// FormatMillis is a unix-millisecond time in UTC, to the millisecond, or
// "-" for 0.
func FormatMillis(ms int64) string {
	if ms == 0 {
		return "-"
	}
	return time.UnixMilli(ms).UTC().Format("2006-01-02T15:04:05.000Z")
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
