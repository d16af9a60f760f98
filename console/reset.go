package console

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/internal/ops"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// Resetting a consumer group's offsets, as 'ferryctl group reset-offsets'
// does, in three steps: the form (GET /consumer?group=G&reset=TOPIC),
// prefilled with the group's committed offsets; its preview (the same GET
// with preview=1: each queue's committed offset, the new one, and how many
// messages that skips or reads again), which changes nothing; and the
// confirm (POST, with the CSRF token, carrying the same choice and the
// offsets previewed), which alone resets. The registry refuses it while the
// group has live members.

// resetChoice is where the reset moves a topic's queues.
type resetChoice struct {
	To      string // earliest, latest, offset, time
	At      string // the time as given (to=time)
	atMilli int64
	// Offsets (to=offset) are the offsets asked, by queue; a queue
	// without one keeps its committed offset.
	Offsets map[uint32]int64
}

// resetView is the reset form, or its preview.
type resetView struct {
	Topic   string
	Choice  resetChoice
	Preview bool
	Rows    []resetRow
	// Live names the group's live members: the registry refuses a reset
	// until they stop.
	Live []string
}

type resetRow struct {
	Queue      uint32
	Committed  int64 // -1: nothing committed
	Start, End int64
	New        int64
	Skips      int64 // messages the new offset skips (past the committed one)
	Rereads    int64 // messages it reads again
	Note       string
	// OField and NField name the queue's fields: the offset asked and
	// the offset previewed.
	OField, NField string
	Asked          string // the offset asked (to=offset), as the form shows it
}

// parseResetChoice reads the choice from the values (a GET's query or the
// confirm's form), with bounds: every offset a whole number from 0, at
// most one per queue of the topic.
func parseResetChoice(v url.Values, queues int) (resetChoice, error) {
	c := resetChoice{To: v.Get("to"), At: v.Get("at"), Offsets: map[uint32]int64{}}
	switch c.To {
	case "", "earliest", "latest":
	case "offset":
		for i := range queues {
			s := v.Get("o" + strconv.Itoa(i))
			if s == "" {
				continue
			}
			n, err := strconv.ParseInt(s, 10, 64)
			if err != nil || n < 0 {
				return c, bad("the offset of queue %d must be a whole number from 0", i)
			}
			c.Offsets[uint32(i)] = n
		}
	case "time":
		if len(c.At) > 64 {
			return c, bad("the time is longer than 64 characters")
		}
		ms, err := parseTime(c.At)
		if err != nil {
			return c, err
		}
		c.atMilli = ms
	default:
		return c, bad("to must be earliest, latest, offset or time")
	}
	return c, nil
}

// parseTime reads RFC 3339 or unix milliseconds and returns unix ms.
func parseTime(s string) (int64, error) {
	if s == "" {
		return 0, bad("give the time: RFC 3339 (2006-01-02T15:04:05Z) or unix milliseconds")
	}
	if ms, err := strconv.ParseInt(s, 10, 64); err == nil {
		if ms < 0 {
			return 0, bad("the time in unix milliseconds must not be negative")
		}
		return ms, nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil || t.UnixMilli() < 0 {
		return 0, bad("the time must be RFC 3339 (2006-01-02T15:04:05Z) or unix milliseconds")
	}
	return t.UnixMilli(), nil
}

// resetView builds the form (prefilled) or, with preview=1 and a choice,
// the preview, reading the queues' ranges from the brokers.
func (q *query) resetView(bs *brokers, info api.ConsumerGroupInfo, topic string, v url.Values) (*resetView, error) {
	rt, ok, err := newRoutes(q).get(topic)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, bad("no topic %q", topic)
	}
	c, err := parseResetChoice(v, len(rt.Queues))
	if err != nil {
		return nil, err
	}
	rv := &resetView{Topic: topic, Choice: c, Preview: v.Get("preview") == "1" && c.To != ""}
	for _, m := range info.Members {
		rv.Live = append(rv.Live, m.ID)
	}
	committed := map[uint32]int64{}
	for _, o := range info.Offsets {
		if o.Topic == topic {
			committed[o.Queue] = o.Offset
		}
	}
	rv.Rows = make([]resetRow, len(rt.Queues))
	for i, qr := range rt.Queues {
		r := &rv.Rows[i]
		r.Queue, r.Committed, r.Start, r.End, r.New = qr.Queue, -1, -1, -1, -1
		r.OField, r.NField = queueField("o", qr.Queue), queueField("n", qr.Queue)
		if off, ok := committed[qr.Queue]; ok {
			r.Committed = off
			r.Asked = strconv.FormatInt(off, 10) // the form is prefilled with it
		}
		if off, ok := c.Offsets[qr.Queue]; ok {
			r.Asked = strconv.FormatInt(off, 10)
		}
	}
	if !rv.Preview {
		return rv, nil
	}
	if err := q.newOffsets(bs, topic, rt.Queues, c, rv.Rows); err != nil {
		return nil, err
	}
	return rv, nil
}

// newOffsets computes each queue's new offset for the choice from its
// broker, and what it skips or reads again.
func (q *query) newOffsets(bs *brokers, topic string, queues []routing.QueueRoute, c resetChoice, rows []resetRow) error {
	errs := make([]error, len(rows))
	var wg sync.WaitGroup
	for i := range rows {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := q.newOffset(bs, topic, queues[i], c, &rows[i]); err != nil {
				errs[i] = fmt.Errorf("queue %d: %w", rows[i].Queue, err)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("reading the queues' offsets from the brokers: %w", err)
	}
	return nil
}

func (q *query) newOffset(bs *brokers, topic string, qr routing.QueueRoute, c resetChoice, r *resetRow) error {
	lo, hi, err := bs.queueRange(topic, qr)
	if err != nil {
		return err
	}
	r.Start, r.End = lo, hi
	switch c.To {
	case "earliest":
		r.New = lo
	case "latest":
		r.New = hi
	case "offset":
		want, ok := c.Offsets[qr.Queue]
		if !ok {
			want = r.Committed
			if want < 0 {
				want = lo
			}
		}
		r.New = clampOffset(want, lo, hi, &r.Note)
	case "time":
		if q.s.byCert {
			// Finding the offset reads messages' store times (PULL), which
			// the brokers allow only with the principal's own credential.
			return &protocol.Error{Status: protocol.StatusNotAuthorized,
				Message: "a reset by time reads messages from the brokers with your own credential: log in with your token, or reset by offset"}
		}
		release, err := q.slot()
		if err != nil {
			return err
		}
		defer release()
		err = bs.onQueueBroker(q.ctx, topic, qr, func(ctx context.Context, tc *transport.Client) error {
			var perr error
			r.New, perr = ops.OffsetForTime(lo, hi, c.atMilli, func(offset int64) (protocol.PullResponse, error) {
				return ops.PullOnce(ctx, tc, &protocol.PullRequest{Topic: topic, Queue: qr.Queue, Offset: offset, MaxBytes: 1})
			})
			return perr
		})
		if err != nil {
			return err
		}
	}
	from := r.Committed
	if from < 0 {
		from = lo // a group without an offset starts at the log start
	}
	if r.New > from {
		r.Skips = r.New - max(from, lo)
	} else {
		r.Rereads = from - r.New
	}
	return nil
}

// clampOffset is want within [lo, hi], noting when it was moved.
func clampOffset(want, lo, hi int64, note *string) int64 {
	switch {
	case want < lo:
		*note = fmt.Sprintf("offset %d is before the log start %d: set to %d", want, lo, lo)
		return lo
	case want > hi:
		*note = fmt.Sprintf("offset %d is past the log end %d: set to %d", want, hi, hi)
		return hi
	}
	return want
}

// confirmReset is the consumer group page's form: the confirm of a
// previewed reset. It sets the offsets the preview showed (each moved into
// its queue's log range again, which may have moved since), with the same
// request ferryctl makes; a group with live members is refused by the
// registry, whose word the page shows.
func confirmReset(q *query) (string, error) {
	f := q.r.PostForm
	name, err := consumerGroupParam(q.r.URL.Query(), "group")
	if err != nil {
		return "", err
	}
	if err := q.allow(protocol.CodeResetOffsets, auth.Target{Group: name}); err != nil {
		return "", err
	}
	topic, err := topicParam(f, "topic")
	if err != nil {
		return "", err
	}
	rt, ok, err := newRoutes(q).get(topic)
	if err != nil {
		return "", err
	}
	if !ok {
		return "", bad("no topic %q", topic)
	}
	c, err := parseResetChoice(f, len(rt.Queues))
	if err != nil {
		return "", err
	}
	if c.To == "" {
		return "", bad("to must be earliest, latest, offset or time")
	}
	// The offsets previewed: n<queue>, one per queue of the topic.
	previewed := resetChoice{To: "offset", Offsets: map[uint32]int64{}}
	for i := range rt.Queues {
		s := f.Get("n" + strconv.Itoa(i))
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 {
			return "", bad("the previewed offset of queue %d is missing or not a whole number from 0: preview the reset again", i)
		}
		previewed.Offsets[uint32(i)] = n
	}
	rows := make([]resetRow, len(rt.Queues))
	for i, qr := range rt.Queues {
		rows[i] = resetRow{Queue: qr.Queue, Committed: -1}
	}
	bs := q.brokers()
	defer bs.close()
	if err := q.newOffsets(bs, topic, rt.Queues, previewed, rows); err != nil {
		return "", err
	}
	req := api.ResetOffsetsRequest{Group: name}
	for _, r := range rows {
		req.Offsets = append(req.Offsets, api.QueueOffset{Topic: topic, Queue: r.Queue, Offset: r.New})
	}
	release, err := q.slot()
	if err != nil {
		return "", err
	}
	defer release()
	if _, err := q.meta().ResetOffsets(q.ctx, req); err != nil {
		if errors.Is(err, protocol.ErrGroupActive) {
			return "", bad("group %s has live members and must be stopped first: %v", name, err)
		}
		return "", unknownIsBad(err)
	}
	return link("consumer", "group", name, "reset-done", topic), nil
}

// queueField is the name of a queue's field in the reset forms.
func queueField(prefix string, queue uint32) string {
	return prefix + strconv.FormatUint(uint64(queue), 10)
}
