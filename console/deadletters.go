package console

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sort"
	"strconv"
	"strings"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/consumer"
	"github.com/ferrymq/ferrymq/internal/ops"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/producer"
	"github.com/ferrymq/ferrymq/protocol"
)

// The Dead letters page: the dead-letter topics (protocol.DeadLetterPrefix
// followed by a consumer group), their messages a page at a time as on the
// Messages page with what each carries of its original (topic, queue,
// offset, the last error, the deliveries), and a form that resends chosen
// dead letters to their original topics.
//
// Who may do what: the list of dead-letter topics needs describe; a topic's
// dead letters need consume on it (the Messages page's rule); resending
// needs consume on the dead-letter topic (to read the message) and produce
// on each original topic (SEND's rule), checked before anything is read or
// sent, and sent by the producer SDK with the session's own credential (the
// broker checks it again).

// maxResend bounds the dead letters one form resends.
const maxResend = 100

// deadLettersData is what the page shows.
type deadLettersData struct {
	Topics  []deadLetterTopic // the list (without a topic chosen)
	Pager   pager
	Filter  string
	NoList  string // why the list is not shown
	Queue   *messagesData
	Letters []deadLetter
	Resent  []string // where the last form's resends were stored
}

type deadLetterTopic struct {
	Name, Group string
	Queues      int
}

// deadLetter is a message of a dead-letter topic, with what it says of its
// original.
type deadLetter struct {
	messageRow
	OriginTopic, OriginQueue, OriginOffset, Error, Deliveries string
	CanResend                                                 bool
}

func deadLetters(q *query) (any, error) {
	v := q.r.URL.Query()
	d := &deadLettersData{Filter: v.Get("q"), Resent: q.notesOf()}
	if v.Get("topic") == "" {
		return d, listDeadLetterTopics(q, d)
	}
	topic := v.Get("topic")
	if len(topic) > maxParamLen || !strings.HasPrefix(topic, protocol.DeadLetterPrefix) {
		return nil, bad("topic %q is not a dead-letter topic (%sGROUP)", protocol.Clip(topic), protocol.DeadLetterPrefix)
	}
	n, err := intParam(v, "n", defaultMessages, 1, maxMessages)
	if err != nil {
		return nil, err
	}
	md := &messagesData{Form: messagesForm{Topic: topic, Queue: v.Get("queue"), Offset: v.Get("offset"), Time: v.Get("time")}}
	ctx, cancel := context.WithTimeout(q.ctx, searchTime)
	defer cancel()
	if err := browseQueue(ctx, q, md, n); err != nil {
		return nil, err
	}
	d.Queue = md
	for _, r := range md.Rows {
		d.Letters = append(d.Letters, q.deadLetterOf(r))
	}
	return d, nil
}

// deadLetterOf is a row with what its properties say of its original.
func (q *query) deadLetterOf(r messageRow) deadLetter {
	l := deadLetter{messageRow: r}
	l.OriginTopic, l.OriginQueue, l.OriginOffset = r.props[consumer.PropOriginTopic], r.props[consumer.PropOriginQueue], r.props[consumer.PropOriginOffset]
	l.Deliveries = r.props[consumer.PropDeliveries]
	if r.Body != nil {
		// The last error often quotes the body: shown only with it.
		l.Error = r.props[consumer.PropError]
	}
	l.CanResend = l.OriginTopic != "" && q.allow(protocol.CodeSend, auth.Topic(l.OriginTopic)) == nil
	return l
}

// listDeadLetterTopics lists the dead-letter topics (describe).
func listDeadLetterTopics(q *query, d *deadLettersData) error {
	if err := q.allow(protocol.CodeAdminTopics, auth.Target{}); err != nil {
		d.NoList = "listing the dead-letter topics needs describe: open one by its name (" + protocol.DeadLetterPrefix + "GROUP)"
		return nil
	}
	release, err := q.slot()
	if err != nil {
		return err
	}
	defer release()
	topics, err := q.meta().Topics(q.ctx)
	if err != nil {
		return err
	}
	var all []deadLetterTopic
	for _, t := range topics {
		if g, ok := strings.CutPrefix(t.Name, protocol.DeadLetterPrefix); ok {
			all = append(all, deadLetterTopic{Name: t.Name, Group: g, Queues: len(t.Queues)})
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].Name < all[j].Name })
	d.Topics, d.Pager, err = pageOf(q, all, func(t deadLetterTopic) string { return t.Name })
	return err
}

// resendDeadLetters resends the dead letters the form names (topic, queue
// and offsets of a dead-letter topic) to their original topics, and goes
// back to the page, which says where each was stored.
func resendDeadLetters(q *query) (string, error) {
	topic := q.r.PostFormValue("topic")
	if len(topic) > maxParamLen || !strings.HasPrefix(topic, protocol.DeadLetterPrefix) {
		return "", bad("topic %q is not a dead-letter topic", protocol.Clip(topic))
	}
	if err := protocol.ValidateTopic(topic); err != nil {
		return "", bad("%v", err)
	}
	queue, err := intParam(q.r.PostForm, "queue", 0, 0, 1<<16)
	if err != nil {
		return "", err
	}
	raw := q.r.PostForm["offset"]
	if len(raw) == 0 {
		return "", bad("choose the dead letters to resend")
	}
	if len(raw) > maxResend {
		return "", bad("at most %d dead letters at once", maxResend)
	}
	offsets := make([]int64, 0, len(raw))
	for _, s := range raw {
		off, err := strconv.ParseInt(s, 10, 64)
		if err != nil || off < 0 {
			return "", bad("offset %q: want a whole number, 0 or more", protocol.Clip(s))
		}
		offsets = append(offsets, off)
	}
	if err := q.allow(protocol.CodePull, auth.Topic(topic)); err != nil {
		return "", err
	}
	letters, err := readDeadLetters(q, topic, uint32(queue), offsets)
	if err != nil {
		return "", err
	}
	// Every original topic is checked before the first is sent to.
	for _, m := range letters {
		origin := m.props[consumer.PropOriginTopic]
		if origin == "" {
			return "", bad("the message at offset %d of %s is not a dead letter (no %s)", m.offset, topic, consumer.PropOriginTopic)
		}
		if err := protocol.ValidateTopic(origin); err != nil {
			return "", bad("the dead letter at offset %d names an original topic that is not one: %v", m.offset, err)
		}
		if err := q.allow(protocol.CodeSend, auth.Topic(origin)); err != nil {
			return "", err
		}
	}
	p, err := q.producer()
	if err != nil {
		return "", err
	}
	defer p.Close()
	var resent []string
	for _, m := range letters {
		r, err := p.Send(q.ctx, m.original())
		if err != nil {
			return "", fmt.Errorf("resending the dead letter at offset %d: %w", m.offset, err)
		}
		resent = append(resent, fmt.Sprintf("offset %d → %s queue %d offset %d (%s)", m.offset, r.Topic, r.Queue, r.QueueOffset, r.Handle))
		q.c.cfg.Logger.Info("console resent a dead letter", "principal", q.s.principal.Name, "from", topic, "offset", m.offset,
			"to", r.Topic, "handle", r.Handle.String())
	}
	back := q.noted(resent...)
	back.Set("topic", topic)
	back.Set("queue", strconv.Itoa(queue))
	back.Set("offset", strconv.FormatInt(offsets[0], 10))
	return Prefix + "deadletters?" + back.Encode(), nil
}

// letter is a dead letter read for a resend.
type letter struct {
	offset int64
	key    string
	tag    string
	props  map[string]string
	body   []byte
}

// original is the message a resend sends: the dead letter's key, tag,
// body and properties, without those the dead-lettering added.
func (l letter) original() *producer.Message {
	props := maps.Clone(l.props)
	for _, k := range []string{consumer.PropOriginTopic, consumer.PropOriginQueue, consumer.PropOriginOffset, consumer.PropOriginID,
		consumer.PropError, consumer.PropDeliveries, protocol.KeyProperty} {
		delete(props, k)
	}
	return &producer.Message{Topic: l.props[consumer.PropOriginTopic], Key: l.key, Tag: l.tag, Properties: props, Body: l.body}
}

// readDeadLetters reads the messages at offsets of a dead-letter queue.
func readDeadLetters(q *query, topic string, queue uint32, offsets []int64) ([]letter, error) {
	qr, err := queueRoute(q.ctx, q, topic, queue)
	if err != nil {
		return nil, err
	}
	release, err := q.slot()
	if err != nil {
		return nil, err
	}
	defer release()
	var out []letter
	err = ops.OnQueueBroker(q.ctx, q.dial().With, qr, topic, nil, func(ctx context.Context, tc *transport.Client) error {
		out = out[:0]
		for _, off := range offsets {
			pr, err := ops.PullOnce(ctx, tc, &protocol.PullRequest{Topic: topic, Queue: queue, Offset: off, MaxBytes: 1})
			if err != nil {
				return err
			}
			if len(pr.Messages) == 0 || pr.Messages[0].QueueOffset != off {
				return bad("no dead letter at offset %d of %s queue %d (the queue holds %d to %d)", off, topic, queue, pr.MinOffset, pr.MaxOffset)
			}
			m := pr.Messages[0].Message
			l := letter{offset: off, tag: m.Tag, props: map[string]string{}, body: append([]byte(nil), m.Body...)}
			for _, p := range m.Properties {
				l.props[p.Key] = p.Value
			}
			l.key = l.props[protocol.KeyProperty]
			out = append(out, l)
		}
		return nil
	})
	var b badInput
	if errors.As(err, &b) {
		return nil, b
	}
	return out, err
}
