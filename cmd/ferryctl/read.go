package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/internal/ops"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

type readOptions struct {
	queue    uint32
	from     int64
	limit    int
	maxBytes uint32
	filter   string
}

// storedJSON is a read message as --json prints it.
type storedJSON struct {
	QueueOffset int64             `json:"queue_offset"`
	LogOffset   int64             `json:"log_offset"`
	ID          string            `json:"id"`
	Timestamp   int64             `json:"timestamp"`
	Reliability string            `json:"reliability"`
	Properties  map[string]string `json:"properties,omitempty"`
	Body        string            `json:"body"`
}

func newReadCommand(g *globalOptions) *cobra.Command {
	o := &readOptions{}
	cmd := &cobra.Command{
		Use:   "read TOPIC",
		Short: "Print stored messages of one queue, from an offset",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: g.metaRunCmd(func(ctx context.Context, cmd *cobra.Command, cl *client.Client, args []string) error {
			route, err := cl.RouteExisting(ctx, args[0])
			if err != nil {
				return err
			}
			if int(o.queue) >= len(route.Queues) {
				return usageError{fmt.Errorf("topic %s has %d queues; no queue %d", args[0], len(route.Queues), o.queue)}
			}
			req := protocol.PullRequest{Topic: args[0], Queue: o.queue, Offset: o.from, MaxBytes: o.maxBytes, Filter: o.filter}
			msgs, err := readQueue(ctx, route.Queues[o.queue], req, o.limit, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			out := make([]storedJSON, 0, len(msgs))
			var rows [][]string
			for _, m := range msgs {
				s := storedJSON{QueueOffset: m.QueueOffset, LogOffset: m.LogOffset, ID: m.Message.ID, Timestamp: m.Message.Timestamp,
					Reliability: m.Message.Reliability.String(), Body: string(m.Message.Body)}
				var props []string
				for _, p := range m.Message.Properties {
					if s.Properties == nil {
						s.Properties = map[string]string{}
					}
					s.Properties[p.Key] = p.Value
					props = append(props, p.Key+"="+p.Value)
				}
				out = append(out, s)
				body := s.Body
				if len(body) > 60 {
					body = body[:57] + "..."
				}
				rows = append(rows, []string{fmt.Sprint(s.QueueOffset), fmt.Sprint(s.LogOffset), s.ID, s.Reliability, orDash(strings.Join(props, ",")), fmt.Sprintf("%q", body)})
			}
			return g.printer().print(out, []string{"OFFSET", "LOG-OFFSET", "ID", "RELIABILITY", "PROPERTIES", "BODY"}, rows)
		}),
	}
	f := cmd.Flags()
	f.Uint32Var(&o.queue, "queue", 0, "queue id")
	f.Int64Var(&o.from, "from", 0, "first queue offset")
	f.IntVar(&o.limit, "limit", 20, "at most this many messages")
	f.Uint32Var(&o.maxBytes, "max-bytes", 1<<20, "bytes per PULL")
	f.StringVar(&o.filter, "filter", "", "only the messages this filter takes, e.g. \"A || B\"")
	c := g.checker(f)
	c.intRange("queue", 0, math.MaxUint32)
	c.intRange("from", 0, math.MaxInt64)
	c.intRange("limit", 1, maxReadLimit)
	c.intRange("max-bytes", 1, protocol.MaxFrameSize)
	c.name("filter", "a filter such as \"A || B\"", checkFilter)
	return cmd
}

// readQueue reads up to limit messages of a queue from its group's master
// or, when the master does not answer, from the slave (see onQueueBroker).
func readQueue(ctx context.Context, qr routing.QueueRoute, req protocol.PullRequest, limit int, stderr io.Writer) ([]protocol.StoredMessage, error) {
	return ops.ReadQueue(ctx, dialer(ctx), qr, req, limit, noteTo(stderr))
}

// onQueueBroker runs fn against a queue's group master or, when it does not
// answer, its slave, saying so on stderr (ops.OnQueueBroker).
func onQueueBroker(ctx context.Context, qr routing.QueueRoute, topic string, stderr io.Writer, fn func(context.Context, *transport.Client) error) error {
	return ops.OnQueueBroker(ctx, dialer(ctx).With, qr, topic, noteTo(stderr), fn)
}

// noteTo writes ops' notes to stderr as ferryctl's.
func noteTo(stderr io.Writer) ops.Note {
	return func(format string, args ...any) { fmt.Fprintf(stderr, "ferryctl: "+format+"\n", args...) }
}

// dialer connects to brokers with the token and TLS config ctx carries
// (withToken, withBrokerTLS: ferryctl's --token and --tls-* flags).
func dialer(ctx context.Context) ops.Dial {
	cfg := transport.ClientConfig{TLS: brokerTLS(ctx), Login: auth.TokenLogin(ctxToken(ctx))}
	return func(addr string) *transport.Client { return transport.NewClient(addr, cfg) }
}

// callBroker runs fn on a connection to the broker at addr, with the
// settings ctx carries (dialer).
func callBroker(ctx context.Context, addr string, fn func(context.Context, *transport.Client) error) error {
	return ops.Call(ctx, dialer(ctx), addr, fn)
}

// pullOnce sends one PULL (ops.PullOnce).
func pullOnce(ctx context.Context, tc *transport.Client, req *protocol.PullRequest) (protocol.PullResponse, error) {
	return ops.PullOnce(ctx, tc, req)
}
