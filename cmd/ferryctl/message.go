package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

func newMessageCommand(g *globalOptions) *cobra.Command {
	cmd := &cobra.Command{Use: "message", Short: "Find stored messages: by handle, message id or key"}
	cmd.AddCommand(newMessageGetCommand(g), newMessageJourneyCommand(g))
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
			gi, err := brokerGroup(ctx, cl, h.Group)
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

// brokerGroup returns the broker group named name.
func brokerGroup(ctx context.Context, cl *client.Client, name string) (routing.Group, error) {
	groups, err := cl.Groups(ctx)
	if err != nil {
		return routing.Group{}, err
	}
	for _, gi := range groups {
		if gi.Name == name {
			return gi.Group, nil
		}
	}
	return routing.Group{}, &protocol.Error{Status: protocol.StatusNotFound, Message: fmt.Sprintf("no broker group %s", shown(name))}
}

// lookupIn asks a broker group's master (or, when it does not answer, its
// slaves in turn) a LOOKUP.
func lookupIn(ctx context.Context, gi routing.Group, q protocol.LookupRequest) (protocol.LookupReply, error) {
	body, _ := json.Marshal(q)
	var reply protocol.LookupReply
	addrs := []string{gi.Master.Addr}
	for _, s := range gi.Slaves {
		addrs = append(addrs, s.Addr)
	}
	err := fmt.Errorf("broker group %s has no broker", gi.Name)
	for _, addr := range addrs {
		if addr == "" {
			continue
		}
		err = callBroker(ctx, addr, func(ctx context.Context, tc *transport.Client) error {
			resp, err := tc.Call(ctx, protocol.CodeLookup, body)
			if err != nil {
				return err
			}
			return json.Unmarshal(resp.Body, &reply)
		})
		if err == nil || !masterDown(err) {
			return reply, err
		}
	}
	return reply, err
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
		Use:   "journey HANDLE",
		Short: "A message's journey: sent by whom, stored where and when, delayed and released, delivered to whom, committed",
		Long: `Print what is known of the message at HANDLE (GROUP@OFFSET, as send prints it):
sent by which producer (id, epoch, sequence) and when; stored in which group, at
which offsets and when, and which of the group's brokers hold it; for a delayed
message its due time and its pending record or release; the reads of it the
broker remembers (which member of which consumer group, when: a bounded record
in the broker's memory); and, for every consumer group with offsets on its
queue, whether it committed past it. A step that cannot be known says so.`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: g.metaRun(func(ctx context.Context, cl *client.Client, args []string) error {
			h, err := protocol.ParseHandle(args[0])
			if err != nil {
				return usageError{err}
			}
			gi, err := brokerGroup(ctx, cl, h.Group)
			if err != nil {
				return err
			}
			reply, err := lookupIn(ctx, gi, protocol.LookupRequest{Offset: &h.Offset})
			if err != nil {
				return err
			}
			if len(reply.Messages) == 0 {
				return &protocol.Error{Status: protocol.StatusNotFound, Message: fmt.Sprintf("%s: no message you may read", args[0])}
			}
			groups, err := cl.ConsumerGroups(ctx, "")
			if err != nil {
				return err
			}
			j := journeyOf(reply.Messages[0], groups)
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

// journeyOf puts together what is known of a found message's journey, with
// the consumer groups' committed offsets.
func journeyOf(m protocol.FoundMessage, groups []api.ConsumerGroupInfo) journeyJSON {
	j := journeyJSON{Message: foundJSON{FoundMessage: m, Body: string(m.Body)}}
	step := func(name string, known bool, format string, args ...any) {
		j.Steps = append(j.Steps, journeyStep{Step: name, What: fmt.Sprintf(format, args...), Known: known})
	}
	if p := m.Producer; p != nil {
		step("sent", true, "by producer %d (epoch %d), its sequence %d, at %s by its clock", p.ID, p.Epoch, p.Seq, formatMillis(m.Timestamp))
	} else {
		step("sent", false, "at %s by its producer's clock; the producer is not known (its message carries no stamp)", formatMillis(m.Timestamp))
	}
	step("stored", true, "in broker group %s at log offset %d, %s; held by %s", strings.SplitN(m.Handle, "@", 2)[0], m.LogOffset,
		formatMillis(m.StoreTime), strings.Join(m.HeldBy, ", "))
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
	if len(m.Deliveries) == 0 {
		step("delivered", false, "no read of it that names a consumer group is remembered by the broker (a bounded record in its memory)")
	}
	for _, d := range m.Deliveries {
		step("delivered", true, "to member %s of consumer group %s at %s", d.Member, d.Group, formatMillis(d.At))
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
	return j
}
