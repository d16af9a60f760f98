package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/internal/clientcore"
	"github.com/ferrymq/ferrymq/internal/ops"
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
	return ops.LookupIn(ctx, dialer(ctx), gi, q)
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
	Message foundJSON         `json:"message"`
	Steps   []ops.JourneyStep `json:"steps"`
}

// journeyMessage finds the message a journey is of (ops.JourneyMessage).
func journeyMessage(ctx context.Context, cl *client.Client, arg string) (protocol.FoundMessage, []protocol.FoundMessage, error) {
	return ops.JourneyMessage(ctx, cl, dialer(ctx), arg)
}

// journeyOf puts together what is known of a found message's journey
// (ops.JourneyOf).
func journeyOf(m protocol.FoundMessage, copies []protocol.FoundMessage, groups []api.ConsumerGroupInfo) journeyJSON {
	return journeyJSON{Message: foundJSON{FoundMessage: m, Body: string(m.Body)}, Steps: ops.JourneyOf(m, copies, groups, false)}
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
	return ops.FindAll(ctx, cl, dialer(ctx), q, cursor)
}

// journeyStep is one step of a journey.
type journeyStep = ops.JourneyStep
