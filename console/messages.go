package console

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/internal/ops"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// The Messages page: a queue's messages from an offset or a time, the
// message at a handle, the messages of an id or a key (newest first), and
// a message's journey. Every search is bounded by searchTime and
// searchBytes: past either it shows what it found and a link that goes on
// from where it stopped.
//
// Who sees what: the page is open to a principal that may describe the
// cluster or consume some topic (its forms; QUEUE_COUNT's rule). Reading a
// queue needs consume on its topic (PULL's rule, checked here before any
// call and by the broker again); a lookup by handle, id or key needs
// consume on some topic (LOOKUP's) and describe (to list the broker
// groups to ask), and the broker leaves out the messages
// of topics the principal may not consume (the page counts them). The
// console reads only with the session's own credential, so it shows no
// more than the wire would: a principal that may describe but consume
// nothing sees the forms and no message. HideBodies hides every body and
// property, whoever asks.

// Budgets of one search (variables: tests shrink them).
var (
	searchTime  = 2 * time.Second
	searchBytes = int64(64 << 20)
)

const (
	defaultMessages = 20
	maxMessages     = 200     // messages a page at most
	bodyPreview     = 4 << 10 // a body's preview on a list
	wholeBody       = 1 << 20 // a body shown whole, at most
	maxParamLen     = 255
	pullBytes       = 1 << 20 // bytes a PULL asks for at most
)

// messagesData is what the Messages page shows.
type messagesData struct {
	Form      messagesForm
	Mode      string // "queue", "handle", "find", "journey" or "" (just the forms)
	Topic     string
	Queue     uint32
	From      int64 // the first offset read (queue)
	LogStart  int64
	LogEnd    int64
	Rows      []messageRow
	Hidden    int    // messages found of topics the principal may not see
	BodyNote  string // why some bodies are not shown
	Next      string // the link that goes on ("": nothing more)
	Stopped   string // why the search stopped before a full page (a budget)
	ReadBytes int64
	Notes     []string // what the read did besides (a fallback to a slave)
	Journey   []ops.JourneyStep
}

// messagesForm is the page's query, as given (to fill the forms again).
type messagesForm struct {
	Topic, Queue, Offset, Time, N, Handle, ID, Key, Cursor, Journey string
}

// messageRow is one message as a page shows it.
type messageRow struct {
	Topic     string
	Queue     uint32
	Offset    int64
	LogOffset int64
	Handle    string
	ID        string
	Key       string
	Tag       string
	Stored    int64 // unix ms
	Size      int
	Props     [][2]string       // nil when the body is not shown
	Body      *shownBody        // nil: not shown
	props     map[string]string // every property, for the page's code (not shown)
}

// shownBody is a body as a page shows it: its text in a kind.
type shownBody struct {
	Kind  string // "text", "json" or "hex"
	Text  string
	Cut   bool   // only the first part is shown
	Whole string // the link to the whole body (when cut and it can be shown)
}

func messages(q *query) (any, error) {
	v := q.r.URL.Query()
	f := messagesForm{Topic: v.Get("topic"), Queue: v.Get("queue"), Offset: v.Get("offset"), Time: v.Get("time"), N: v.Get("n"),
		Handle: v.Get("handle"), ID: v.Get("id"), Key: v.Get("key"), Cursor: v.Get("cursor"), Journey: v.Get("journey")}
	for name, s := range map[string]string{"topic": f.Topic, "queue": f.Queue, "offset": f.Offset, "time": f.Time, "n": f.N,
		"handle": f.Handle, "id": f.ID, "key": f.Key, "journey": f.Journey} {
		if len(s) > maxParamLen {
			return nil, bad("%s is longer than %d characters", name, maxParamLen)
		}
	}
	if len(f.Cursor) > 64<<10 {
		return nil, bad("the cursor is too long")
	}
	d := &messagesData{Form: f}
	n, err := intParam(v, "n", defaultMessages, 1, maxMessages)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(q.ctx, searchTime)
	defer cancel()
	switch {
	case f.Topic != "":
		err = browseQueue(ctx, q, d, n)
	case f.Handle != "":
		err = messageAt(ctx, q, d, v.Get("whole") == "1")
	case f.ID != "" || f.Key != "":
		err = findMessages(ctx, q, d, n)
	case f.Journey != "":
		err = journey(ctx, q, d)
	}
	if err != nil {
		return nil, err
	}
	return d, nil
}

// mayConsume reports whether the session may see topic's bodies.
func (q *query) mayConsume(topic string) bool {
	return !q.c.cfg.HideBodies && q.allow(protocol.CodePull, auth.Topic(topic)) == nil
}

// queueParams reads topic and queue, checked.
func queueParams(v url.Values) (string, uint32, error) {
	topic := v.Get("topic")
	if err := protocol.ValidateTopic(topic); err != nil {
		return "", 0, bad("%v", err)
	}
	queue, err := intParam(v, "queue", 0, 0, 1<<16)
	if err != nil {
		return "", 0, err
	}
	return topic, uint32(queue), nil
}

// browseQueue reads a page of a queue from an offset (or the first offset
// stored at or after a time).
func browseQueue(ctx context.Context, q *query, d *messagesData, n int) error {
	v := q.r.URL.Query()
	topic, queue, err := queueParams(v)
	if err != nil {
		return err
	}
	var from int64
	if s := v.Get("offset"); s != "" {
		if from, err = strconv.ParseInt(s, 10, 64); err != nil || from < 0 {
			return bad("offset must be a whole number, 0 or more")
		}
	}
	var at int64 = -1
	if s := v.Get("time"); s != "" {
		if at, err = parseTime(s); err != nil {
			return err
		}
	}
	if err := q.allow(protocol.CodePull, auth.Topic(topic)); err != nil {
		return err
	}
	bodies, dial := q.mayConsume(topic), q.dial()
	d.Mode, d.Topic, d.Queue = "queue", topic, queue
	qr, err := queueRoute(q.ctx, q, topic, queue) // not the search's time
	if err != nil {
		return err
	}
	release, err := q.slot()
	if err != nil {
		return err
	}
	defer release()
	var msgs []protocol.StoredMessage
	next := int64(-1)
	note := func(format string, args ...any) { d.Notes = append(d.Notes, fmt.Sprintf(format, args...)) }
	err = ops.OnQueueBroker(ctx, dial.With, qr, topic, note, func(ctx context.Context, tc *transport.Client) error {
		msgs, next, d.ReadBytes, d.Stopped = nil, -1, 0, ""
		start := from
		if at >= 0 {
			off, lo, hi, err := ops.QueueOffsetForTime(ctx, tc, topic, queue, at)
			if err != nil {
				return err
			}
			start, d.LogStart, d.LogEnd = off, lo, hi
		}
		d.From = start
		msgs, next, err = pullBudget(ctx, tc, &protocol.PullRequest{Topic: topic, Queue: queue, Offset: start}, n, d)
		return err
	})
	if err != nil {
		return err
	}
	for _, m := range msgs {
		d.Rows = append(d.Rows, storedRow(topic, queue, qr.Group, m, bodies))
	}
	if !bodies && len(msgs) > 0 {
		d.BodyNote = bodyNote(q, topic)
	}
	if next >= 0 {
		u := *q.r.URL
		vals := u.Query()
		vals.Del("time")
		vals.Set("offset", strconv.FormatInt(next, 10))
		u.RawQuery = vals.Encode()
		d.Next = u.Path + "?" + u.RawQuery
	}
	return nil
}

// pullBudget reads up to n messages from req.Offset within the search's
// budgets: the bytes read and ctx's time. next is the offset to go on
// from (-1: the queue's end was reached).
func pullBudget(ctx context.Context, tc *transport.Client, req *protocol.PullRequest, n int, d *messagesData) (msgs []protocol.StoredMessage, next int64, err error) {
	for len(msgs) < n {
		left := searchBytes - d.ReadBytes
		if left <= 0 {
			d.Stopped = fmt.Sprintf("read %s, this search's budget: go on from offset %d", fmtBytes(d.ReadBytes), req.Offset)
			return msgs, req.Offset, nil
		}
		req.MaxBytes = uint32(min(left, pullBytes))
		pr, err := ops.PullOnce(ctx, tc, req)
		if err != nil {
			if ctx.Err() != nil {
				d.Stopped = fmt.Sprintf("this search's %s ran out: go on from offset %d", searchTime, req.Offset)
				return msgs, req.Offset, nil
			}
			return nil, 0, err
		}
		d.LogStart, d.LogEnd = pr.MinOffset, pr.MaxOffset
		for _, m := range pr.Messages {
			if len(msgs) == n {
				return msgs, m.QueueOffset, nil
			}
			d.ReadBytes += int64(storedSize(m))
			msgs = append(msgs, m)
		}
		if len(pr.Messages) > 0 {
			req.Offset = pr.Messages[len(pr.Messages)-1].QueueOffset + 1
		}
		if pr.NextOffset > req.Offset {
			req.Offset = pr.NextOffset
		}
		if req.Offset < pr.MinOffset {
			req.Offset = pr.MinOffset
		}
		if req.Offset >= pr.MaxOffset || len(pr.Messages) == 0 && pr.NextOffset <= req.Offset {
			return msgs, -1, nil
		}
	}
	return msgs, req.Offset, nil
}

// storedSize is what a stored message weighs on the wire, about.
func storedSize(m protocol.StoredMessage) int {
	n := len(m.Message.Body) + len(m.Message.ID) + 32
	for _, p := range m.Message.Properties {
		n += len(p.Key) + len(p.Value) + 4
	}
	return n
}

// queueRoute is the route of a topic's queue.
func queueRoute(ctx context.Context, q *query, topic string, queue uint32) (routing.QueueRoute, error) {
	release, err := q.slot()
	if err != nil {
		return routing.QueueRoute{}, err
	}
	defer release()
	route, err := q.routes().RouteExisting(ctx, topic)
	if errors.Is(err, protocol.ErrUnknownTopic) {
		return routing.QueueRoute{}, bad("no topic %s", protocol.Clip(topic))
	}
	if err != nil {
		return routing.QueueRoute{}, err
	}
	if int(queue) >= len(route.Queues) {
		return routing.QueueRoute{}, bad("topic %s has %d queues: no queue %d", topic, len(route.Queues), queue)
	}
	return route.Queues[queue], nil
}

// storedRow is a read message as a page shows it (its body when bodies).
func storedRow(topic string, queue uint32, group string, m protocol.StoredMessage, bodies bool) messageRow {
	r := messageRow{Topic: topic, Queue: queue, Offset: m.QueueOffset, LogOffset: m.LogOffset, ID: m.Message.ID,
		Stored: m.StoreTime, Size: len(m.Message.Body), Tag: m.Message.Tag, Handle: protocol.Handle{Group: group, Offset: m.LogOffset}.String()}
	r.props = map[string]string{}
	for _, p := range m.Message.Properties {
		r.props[p.Key] = p.Value
		if p.Key == protocol.KeyProperty {
			r.Key = p.Value
		}
		if bodies {
			r.Props = append(r.Props, [2]string{p.Key, p.Value})
		}
	}
	if bodies {
		r.Body = showBody(m.Message.Body, bodyPreview, link("messages", "handle", r.Handle, "whole", "1"))
	}
	return r
}

// foundRow is a looked-up message as a page shows it: its body (its first
// max bytes) when the session may consume its topic.
func foundRow(q *query, m protocol.FoundMessage, max int) messageRow {
	r := messageRow{Topic: m.Topic, Queue: m.Queue, Offset: m.QueueOffset, LogOffset: m.LogOffset, Handle: m.Handle, ID: m.ID,
		Key: m.Key, Tag: m.Tag, Stored: m.StoreTime, Size: len(m.Body)}
	if q.mayConsume(m.Topic) {
		for k, v := range m.Properties {
			r.Props = append(r.Props, [2]string{k, v})
		}
		sort.Slice(r.Props, func(i, j int) bool { return r.Props[i][0] < r.Props[j][0] })
		r.Body = showBody(m.Body, max, link("messages", "handle", m.Handle, "whole", "1"))
	}
	return r
}

// bodyNote says why a topic's bodies are not shown.
func bodyNote(q *query, topic string) string {
	if q.c.cfg.HideBodies {
		return "this console shows no message bodies (-console-bodies=false)"
	}
	return fmt.Sprintf("bodies and properties are shown to who may consume %s", protocol.Clip(topic))
}

// showBody is body as text (valid UTF-8), JSON (pretty, when it parses)
// or hex, its first max bytes.
func showBody(body []byte, max int, whole string) *shownBody {
	b := &shownBody{}
	if len(body) > max {
		body, b.Cut = body[:max], true
		if max < wholeBody {
			b.Whole = whole
		}
		for i := 0; i < utf8.UTFMax && len(body) > 0 && !utf8.Valid(body); i++ {
			body = body[:len(body)-1] // a rune cut in two
		}
	}
	var pretty bytes.Buffer
	switch {
	case !b.Cut && json.Valid(body) && json.Indent(&pretty, body, "", "  ") == nil:
		b.Kind, b.Text = "json", pretty.String()
	case utf8.Valid(body) && !hasControl(body):
		b.Kind, b.Text = "text", string(body)
	default:
		b.Kind, b.Text = "hex", hex.Dump(body)
	}
	return b
}

// hasControl reports whether text holds control characters other than
// tab, newline and carriage return (shown as hex instead).
func hasControl(b []byte) bool {
	return bytes.IndexFunc(b, func(r rune) bool { return r < 0x20 && r != '\t' && r != '\n' && r != '\r' || r == 0x7f }) >= 0
}

// lookupDial is how a lookup asks the brokers: with the session's own
// credential (the brokers leave out what it may not consume), for a
// principal that may consume some topic (LOOKUP's rule) and describe the
// cluster (listing the broker groups to ask, as ferryctl message find),
// holding one of the console's call slots until release.
func lookupDial(q *query) (dial ops.Dial, release func(), err error) {
	if err := q.allow(protocol.CodeLookup, auth.Target{}); err != nil {
		return nil, nil, err
	}
	if err := q.allow(protocol.CodeAdminGroups, auth.Target{}); err != nil {
		return nil, nil, err
	}
	if release, err = q.slot(); err != nil {
		return nil, nil, err
	}
	return q.dial(), release, nil
}

// messageAt shows the message at a handle (GROUP@OFFSET).
func messageAt(ctx context.Context, q *query, d *messagesData, whole bool) error {
	h, err := protocol.ParseHandle(d.Form.Handle)
	if err != nil || h.Offset < 0 || protocol.ValidateName("group", h.Group, 255, protocol.TopicNameChars) != nil {
		return bad("handle %q: want GROUP@OFFSET, as a send printed it", protocol.Clip(d.Form.Handle))
	}
	dial, release, err := lookupDial(q)
	if err != nil {
		return err
	}
	defer release()
	d.Mode = "handle"
	gi, err := ops.GroupNamed(q.ctx, q.meta(), h.Group)
	if errors.Is(err, protocol.ErrNotFound) {
		return bad("no broker group %s", protocol.Clip(h.Group))
	}
	if err != nil {
		return err
	}
	reply, err := ops.LookupIn(ctx, dial, gi, protocol.LookupRequest{Offset: &h.Offset})
	if err != nil {
		return err
	}
	max := bodyPreview
	if whole {
		max = wholeBody
	}
	d.Hidden = reply.Hidden
	for _, m := range reply.Messages {
		d.addFound(q, m, max)
	}
	return nil
}

func (d *messagesData) addFound(q *query, m protocol.FoundMessage, max int) {
	r := foundRow(q, m, max)
	if r.Body == nil && d.BodyNote == "" {
		d.BodyNote = bodyNote(q, m.Topic)
	}
	d.Rows = append(d.Rows, r)
}

// findMessages shows the messages of an id or a key, newest first, a
// page at a time: each group is asked in turn while the search's budgets
// last; the cursor says where each group goes on (GROUP:BEFORE, 0 its
// newest; a group not named is done).
func findMessages(ctx context.Context, q *query, d *messagesData, n int) error {
	f := d.Form
	if f.ID != "" && f.Key != "" {
		return bad("give an id or a key, not both")
	}
	at, err := parseFindCursor(f.Cursor)
	if err != nil {
		return err
	}
	dial, release, err := lookupDial(q)
	if err != nil {
		return err
	}
	defer release()
	d.Mode = "find"
	groups, err := ops.LiveGroups(q.ctx, q.meta()) // not the search's time
	if err != nil {
		return err
	}
	sort.Slice(groups, func(i, j int) bool { return groups[i].Name < groups[j].Name })
	var found []protocol.FoundMessage
	var rest []string
	for _, g := range groups {
		before, todo := at[g.Name]
		if at != nil && !todo {
			continue // searched to its start
		}
		if len(found) >= n || d.ReadBytes >= searchBytes || ctx.Err() != nil {
			rest = append(rest, g.Name+":"+strconv.FormatInt(before, 10))
			continue
		}
		reply, err := ops.LookupIn(ctx, dial, g, protocol.LookupRequest{ID: f.ID, Key: f.Key, Before: before, Limit: n - len(found)})
		if err != nil {
			if ctx.Err() != nil {
				rest = append(rest, g.Name+":"+strconv.FormatInt(before, 10))
				continue
			}
			return fmt.Errorf("broker group %s: %w", g.Name, err)
		}
		d.ReadBytes += reply.ScannedBytes
		d.Hidden += reply.Hidden
		found = append(found, reply.Messages...)
		if reply.Next > 0 {
			rest = append(rest, g.Name+":"+strconv.FormatInt(reply.Next, 10))
		}
	}
	slices.SortStableFunc(found, func(a, b protocol.FoundMessage) int { return int(b.StoreTime - a.StoreTime) })
	for _, m := range found {
		d.addFound(q, m, bodyPreview)
	}
	if len(rest) > 0 {
		d.Next = withParam(q.r.URL, "cursor", strings.Join(rest, ","))
		if d.ReadBytes >= searchBytes {
			d.Stopped = fmt.Sprintf("read %s, this search's budget", fmtBytes(d.ReadBytes))
		} else if ctx.Err() != nil {
			d.Stopped = fmt.Sprintf("this search's %s ran out", searchTime)
		}
	}
	return nil
}

// parseFindCursor reads a find's cursor (nil: every group from its newest).
func parseFindCursor(s string) (map[string]int64, error) {
	if s == "" {
		return nil, nil
	}
	out := map[string]int64{}
	for _, part := range strings.Split(s, ",") {
		i := strings.LastIndexByte(part, ':')
		if i <= 0 {
			return nil, bad("the cursor is not one this page made")
		}
		at, err := strconv.ParseInt(part[i+1:], 10, 64)
		if err != nil || at < 0 {
			return nil, bad("the cursor is not one this page made")
		}
		out[part[:i]] = at
	}
	return out, nil
}

// journey shows what is known of a message's journey (as ferryctl message
// journey prints it).
func journey(ctx context.Context, q *query, d *messagesData) error {
	dial, release, err := lookupDial(q)
	if err != nil {
		return err
	}
	defer release()
	d.Mode = "journey"
	m, copies, err := ops.JourneyMessage(ctx, q.meta(), dial, d.Form.Journey)
	if errors.Is(err, protocol.ErrNotFound) {
		return bad("%s: no message you may read", protocol.Clip(d.Form.Journey))
	}
	if err != nil {
		return err
	}
	// Without describe the consumer groups are those the principal may
	// consume as: a journey shows what it may see.
	groups, err := q.meta().ConsumerGroups(ctx, "")
	if err != nil && !errors.Is(err, protocol.ErrNotAuthorized) {
		return err
	}
	d.addFound(q, m, bodyPreview)
	d.Journey = ops.JourneyOf(m, copies, groups, !q.mayConsume(m.Topic))
	return nil
}
