package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

func newMessageCommand(g *globalOptions) *cobra.Command {
	cmd := &cobra.Command{Use: "message", Short: "Find stored messages: by handle, message id or key"}
	cmd.AddCommand(newMessageGetCommand(g))
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
