package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/consumer"
	"github.com/ferrymq/ferrymq/internal/clientcore"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

func newMessageCommand(g *globalOptions) *cobra.Command {
	cmd := &cobra.Command{Use: "message", Short: "Find stored messages: by handle, message id or key"}
	cmd.AddCommand(newMessageGetCommand(g), newMessageFindCommand(g), newMessageJourneyCommand(g))
	return cmd
}

func newMessageGetCommand(g *globalOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "get HANDLE",
		Short: "Print the message a send's handle (GROUP@OFFSET) names, with where and when it was stored",
		Long: `Print the message stored at HANDLE (GROUP@OFFSET, as send prints it; a delayed
message's GROUP@OFFSET/DUE names its pending record) with its queue, offsets,
store time, id, key, tag, properties and body, read from the group's master (or a
slave when the master does not answer). Its body is shown only to a principal that
may consume its topic.`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: g.metaRun(func(ctx context.Context, cl *client.Client, args []string) error {
			h, err := protocol.ParseHandle(args[0])
			if err != nil {
				return usageError{err}
			}
			gi, err := groupNamed(ctx, cl, h.Group)
			if err != nil {
				return err
			}
			reply, err := lookupIn(ctx, gi, protocol.LookupRequest{Offset: &h.Offset})
			if err != nil {
				return err
			}
			if len(reply.Messages) == 0 {
				why := "no message"
				if reply.Hidden > 0 {
					why = "a message of a topic you may not consume"
				}
				return &protocol.Error{Status: protocol.StatusNotFound, Message: fmt.Sprintf("%s: %s", args[0], why)}
			}
			return printFound(g, reply.Messages)
		}),
	}
}

// lookupIn asks a broker group's master (or, when it does not answer, its
// slaves in turn) a LOOKUP.
func lookupIn(ctx context.Context, gi routing.Group, q protocol.LookupRequest) (protocol.LookupReply, error) {
	return clientcore.LookupIn(ctx, callerOf(ctx), gi, q)
}

// callerOf makes broker calls with the connection settings ctx carries.
func callerOf(ctx context.Context) clientcore.Caller {
	return func(ctx context.Context, addr string, code protocol.Code, body []byte) (out []byte, err error) {
		err = callBroker(ctx, addr, func(ctx context.Context, tc *transport.Client) error {
			resp, err := tc.Call(ctx, code, body)
			out = resp.Body
			return err
		})
		return out, err
	}
}

// foundJSON is a found message as --json prints it: the body as text.
type foundJSON struct {
	protocol.FoundMessage
	Body string `json:"body"`
}

func printFound(g *globalOptions, msgs []protocol.FoundMessage) error {
	out := make([]foundJSON, len(msgs))
	rows := make([][]string, len(msgs))
	for i, m := range msgs {
		out[i] = foundJSON{FoundMessage: m, Body: string(m.Body)}
		var props []string
		for k, v := range m.Properties {
			props = append(props, k+"="+v)
		}
		body := string(m.Body)
		if len(body) > 60 {
			body = body[:57] + "..."
		}
		rows[i] = []string{m.Handle, m.Topic, fmt.Sprint(m.Queue), fmt.Sprint(m.QueueOffset), formatMillis(m.StoreTime), m.ID,
			orDash(m.Key), orDash(m.Tag), orDash(strings.Join(props, ",")), fmt.Sprintf("%q", body)}
	}
	return g.printer().print(out, []string{"HANDLE", "TOPIC", "QUEUE", "OFFSET", "STORED", "ID", "KEY", "TAG", "PROPERTIES", "BODY"}, rows)
}

func newMessageJourneyCommand(g *globalOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "journey HANDLE|ID",
		Short: "A message's journey: sent by whom, stored where and when, delayed and released, delivered to whom, committed",
		Long: `Print what is known of the message at HANDLE (GROUP@OFFSET, as send prints it), or
of the message id ID (found in every group's key tables, with its retry copies and
dead letters):
sent by which producer (id, epoch, sequence) and when; stored in which group, at
which offsets and when, and which of the group's brokers hold it; for a delayed
message its due time and its pending record or release; the reads of it the
broker remembers (which member of which consumer group, when: a bounded record
in the broker's memory); and, for every consumer group with offsets on its
queue, whether it committed past it; by id, its retries and dead letters too. A
step that cannot be known says so.`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: g.metaRun(func(ctx context.Context, cl *client.Client, args []string) error {
			m, copies, err := journeyMessage(ctx, cl, args[0])
			if err != nil {
				return err
			}
			groups, err := cl.ConsumerGroups(ctx, "")
			if err != nil {
				return err
			}
			j := journeyOf(m, copies, groups)
			if g.json {
				return g.printer().print(j, nil, nil)
			}
			rows := make([][]string, len(j.Steps))
			for i, s := range j.Steps {
				rows[i] = []string{s.Step, s.What}
			}
			fmt.Fprintf(g.out, "message %s  topic %s  queue %d  offset %d  handle %s\n\n", j.Message.ID, j.Message.Topic, j.Message.Queue,
				j.Message.QueueOffset, j.Message.Handle)
			return g.printer().print(nil, []string{"STEP", "WHAT"}, rows)
		}),
	}
}

// journeyJSON is a message's journey as --json prints it.
type journeyJSON struct {
	Message foundJSON     `json:"message"`
	Steps   []journeyStep `json:"steps"`
}

// journeyStep is one step of a journey; Known false: what is not known.
type journeyStep struct {
	Step  string `json:"step"`
	What  string `json:"what"`
	Known bool   `json:"known"`
}

// journeyMessage finds the message a journey is of: at a handle
// (GROUP@OFFSET of a group that exists), else by its id, with the retry
// copies and dead letters of it.
func journeyMessage(ctx context.Context, cl *client.Client, arg string) (protocol.FoundMessage, []protocol.FoundMessage, error) {
	notFound := &protocol.Error{Status: protocol.StatusNotFound, Message: fmt.Sprintf("%s: no message you may read", arg)}
	if h, err := protocol.ParseHandle(arg); err == nil {
		if gi, err := groupNamed(ctx, cl, h.Group); err == nil {
			reply, err := lookupIn(ctx, gi, protocol.LookupRequest{Offset: &h.Offset})
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
	for range journeyPages {
		page, err := findAll(ctx, cl, protocol.LookupRequest{ID: arg, Limit: 100}, cursor)
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

// journeyPages bounds the pages of a search by id a journey reads.
const journeyPages = 20

// journeyOf puts together what is known of a found message's journey, with
// its retry copies and dead letters (oldest first) and the consumer groups'
// committed offsets.
func journeyOf(m protocol.FoundMessage, copies []protocol.FoundMessage, groups []api.ConsumerGroupInfo) journeyJSON {
	j := journeyJSON{Message: foundJSON{FoundMessage: m, Body: string(m.Body)}}
	step := func(name string, known bool, format string, args ...any) {
		j.Steps = append(j.Steps, journeyStep{Step: name, What: fmt.Sprintf(format, args...), Known: known})
	}
	if p := m.Producer; p != nil {
		step("sent", true, "by producer %d (epoch %d), its sequence %d, at %s by its clock", p.ID, p.Epoch, p.Seq, formatMillis(m.Timestamp))
	} else {
		step("sent", false, "at %s by its producer's clock; the producer is not known (its message carries no stamp)", formatMillis(m.Timestamp))
	}
	step("stored", true, "%s, in broker group %s at log offset %d, %s; held by %s", m.Reliability, strings.SplitN(m.Handle, "@", 2)[0],
		m.LogOffset, formatMillis(m.StoreTime), strings.Join(m.HeldBy, ", "))
	if m.Reliability == protocol.High.String() {
		step("acknowledged", false, "once the group's sync set held it (how long that took is not recorded)")
	}
	if s := m.Schedule; s != nil {
		switch s.Kind {
		case protocol.ScheduleDelayed:
			step("delayed", true, "pending, due at %s (ferryctl delayed get %s says whether it was released)", formatMillis(s.At),
				protocol.Handle{Group: strings.SplitN(m.Handle, "@", 2)[0], Offset: m.LogOffset, DueAt: s.At})
		case protocol.ScheduleReleased:
			step("delayed", true, "due at %s, released into its queue at %s (%s late) from the pending record at log offset %d",
				formatMillis(s.At), formatMillis(m.StoreTime), time.Duration(max(m.StoreTime-s.At, 0))*time.Millisecond, s.Ref)
		}
	}
	if m.InternalTopic != "" { // a pending delayed message: not in its queue yet
		step("delivered", false, "not yet: it is pending in %s until it is due", m.InternalTopic)
		return j
	}
	if len(m.Deliveries) == 0 {
		step("delivered", false, "no read of it that names a consumer group is remembered by the broker (a bounded record in its memory)")
	}
	for _, d := range m.Deliveries {
		step("delivered", true, "to member %s of consumer group %s at %s", d.Member, d.Group, formatMillis(d.At))
	}
	for _, cg := range groups {
		for _, r := range cg.Redelivered {
			if r.Topic == m.Topic && r.Queue == m.Queue && r.Offset == m.QueueOffset {
				step("delivered", true, "%d times to member %s of consumer group %s (its handler failed before), handled at %s",
					r.Deliveries, r.Member, cg.Name, formatMillis(r.At))
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
	for _, c := range copies {
		if c.Properties[protocol.DeadLetterOriginID] != "" {
			step("dead-lettered", true, "to %s at %s (handle %s) after %s deliveries: %s", c.Topic, formatMillis(c.StoreTime), c.Handle,
				orDash(c.Properties[consumer.PropDeliveries]), orDash(c.Properties[consumer.PropError]))
		} else {
			step("retried", true, "stored for a retry in %s at %s (handle %s): %s", c.Topic, formatMillis(c.StoreTime), c.Handle, orDash(c.Properties[consumer.PropRetry]))
		}
	}
	return j
}

type findOptions struct {
	id, key      string
	since, until string
	limit        int
	cursor       string
}

func newMessageFindCommand(g *globalOptions) *cobra.Command {
	o := &findOptions{}
	cmd := &cobra.Command{
		Use:   "find (--id ID | --key K) [--since T] [--until T]",
		Short: "Find messages by id or key in every broker group, newest first, a page at a time",
		Long: `Find the messages of a message id (and the dead letters and retry copies of it)
or of a key, stored between --since and --until (RFC 3339 or unix ms; default:
the whole retention), in every broker group, newest first. Each group reads the
key tables of the log ranges in the window (at most 64 MiB a page) and answers
at most --limit messages; when a group has more, the output ends with the
--cursor that continues. Bodies are shown only for topics you may consume.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: g.metaRunCmd(func(ctx context.Context, cmd *cobra.Command, cl *client.Client, _ []string) error {
			q, err := o.request()
			if err != nil {
				return usageError{err}
			}
			page, err := findAll(ctx, cl, q, o.cursor)
			if err != nil {
				return err
			}
			if g.json {
				return g.printer().print(findJSON{Messages: toFoundJSON(page.Messages), Hidden: page.Hidden, Cursor: page.Cursor}, nil, nil)
			}
			if err := printFound(g, page.Messages); err != nil {
				return err
			}
			if page.Hidden > 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "ferryctl: %d more of topics you may not consume\n", page.Hidden)
			}
			if page.Cursor != "" {
				fmt.Fprintf(cmd.ErrOrStderr(), "ferryctl: more: --cursor %s\n", page.Cursor)
			}
			return nil
		}),
	}
	f := cmd.Flags()
	f.StringVar(&o.id, "id", "", "the message id")
	f.StringVar(&o.key, "key", "", "the message key")
	f.StringVar(&o.since, "since", "", "stored at or after this time (RFC 3339 or unix ms)")
	f.StringVar(&o.until, "until", "", "stored at or before this time (RFC 3339 or unix ms)")
	f.IntVar(&o.limit, "limit", 20, "at most this many messages from each group")
	f.StringVar(&o.cursor, "cursor", "", "continue where a find ended (it prints the cursor)")
	c := g.checker(f)
	c.name("since", "a time: RFC 3339 or unix ms", func(s string) error { _, err := parseTime(s); return err })
	c.name("until", "a time: RFC 3339 or unix ms", func(s string) error { _, err := parseTime(s); return err })
	c.intRange("limit", 1, protocol.MaxLookupLimit)
	c.name("cursor", "a cursor a find printed (GROUP:OFFSET,...)", func(s string) error { _, err := clientcore.ParseLookupCursor(s); return err })
	return cmd
}

// findJSON is what find prints with --json.
type findJSON struct {
	Messages []foundJSON `json:"messages"`
	Hidden   int         `json:"hidden"`
	Cursor   string      `json:"cursor,omitempty"`
}

func toFoundJSON(msgs []protocol.FoundMessage) []foundJSON {
	out := make([]foundJSON, len(msgs))
	for i, m := range msgs {
		out[i] = foundJSON{FoundMessage: m, Body: string(m.Body)}
	}
	return out
}

// request is the LOOKUP the options ask for.
func (o *findOptions) request() (protocol.LookupRequest, error) {
	q := protocol.LookupRequest{ID: o.id, Key: o.key, Limit: o.limit}
	if (o.id == "") == (o.key == "") {
		return q, fmt.Errorf("give one of --id and --key")
	}
	var err error
	if o.since != "" {
		if q.Since, err = parseTime(o.since); err != nil {
			return q, err
		}
	}
	if o.until != "" {
		if q.Until, err = parseTime(o.until); err != nil {
			return q, err
		}
		if q.Until < q.Since {
			return q, fmt.Errorf("--until is before --since")
		}
	}
	return q, nil
}

// findAll asks every broker group that is not retired a LOOKUP by id or
// key from where cursor says, and returns what they found newest first.
func findAll(ctx context.Context, cl *client.Client, q protocol.LookupRequest, cursor string) (clientcore.LookupPage, error) {
	groups, err := cl.Groups(ctx)
	if err != nil {
		return clientcore.LookupPage{}, err
	}
	var gs []routing.Group
	for _, gi := range groups {
		if gi.Admission != routing.Retired {
			gs = append(gs, gi.Group)
		}
	}
	return clientcore.LookupAll(ctx, callerOf(ctx), gs, q, cursor)
}
