package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/internal/clientcore"
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
	var msgs []protocol.StoredMessage
	err := onQueueBroker(ctx, qr, req.Topic, stderr, func(ctx context.Context, tc *transport.Client) error {
		r := req
		var err error
		msgs, err = pull(ctx, tc, &r, limit)
		return err
	})
	return msgs, err
}

// onQueueBroker runs fn against a queue's group master or, when the master
// does not answer (it cannot be reached, times out, or says it is not the
// master or is shutting down) and the group has a slave, against the slave,
// saying so on stderr. With a slave to fall back on, the master gets half
// of the time left. fn may make several calls; on a fallback it starts
// again on the slave.
func onQueueBroker(ctx context.Context, qr routing.QueueRoute, topic string, stderr io.Writer, fn func(context.Context, *transport.Client) error) error {
	if qr.Master == "" && qr.Slave == "" {
		return fmt.Errorf("queue %d of %s: its group %s has no broker", qr.Queue, topic, qr.Group)
	}
	var masterErr error
	if qr.Master != "" {
		mctx, cancel := ctx, context.CancelFunc(func() {})
		if deadline, ok := ctx.Deadline(); ok && qr.Slave != "" {
			mctx, cancel = context.WithTimeout(ctx, time.Until(deadline)/2)
		}
		err := callBroker(mctx, qr.Master, fn)
		cancel()
		if err == nil {
			return nil
		}
		masterErr = fmt.Errorf("read from the master %s: %w", qr.Master, err)
		if qr.Slave == "" || !clientcore.NotServing(err) || ctx.Err() != nil {
			return masterErr
		}
		fmt.Fprintf(stderr, "ferryctl: the master %s did not answer (%v); reading from the slave %s\n", qr.Master, err, qr.Slave)
	} else {
		fmt.Fprintf(stderr, "ferryctl: group %s has no master; reading from the slave %s\n", qr.Group, qr.Slave)
	}
	if err := callBroker(ctx, qr.Slave, fn); err != nil {
		return errors.Join(masterErr, fmt.Errorf("read from the slave %s: %w", qr.Slave, err))
	}
	fmt.Fprintf(stderr, "ferryctl: read from the slave %s\n", qr.Slave)
	return nil
}

// callBroker runs fn on a connection to the broker at addr, over TLS when
// ctx carries a config (withBrokerTLS: ferryctl's --tls-* flags).
func callBroker(ctx context.Context, addr string, fn func(context.Context, *transport.Client) error) error {
	tc := transport.NewClient(addr, transport.ClientConfig{TLS: brokerTLS(ctx), Login: auth.TokenLogin(ctxToken(ctx))})
	defer tc.Close()
	return fn(ctx, tc)
}

// pullOnce sends one PULL. NO_ROUTE, which a broker answers while it
// looks up the route of a queue its log holds nothing of (a queue moved to
// its group), is asked again every 50 ms until ctx ends.
func pullOnce(ctx context.Context, tc *transport.Client, req *protocol.PullRequest) (protocol.PullResponse, error) {
	for {
		resp, err := tc.Call(ctx, protocol.CodePull, protocol.AppendPullRequest(nil, req))
		if errors.Is(err, protocol.ErrNoRoute) {
			select {
			case <-ctx.Done():
				return protocol.PullResponse{}, err
			case <-time.After(50 * time.Millisecond):
				continue
			}
		}
		if err != nil {
			return protocol.PullResponse{}, err
		}
		return protocol.DecodePullResponse(resp.Body) // bodies alias the response buffer, which is not reused
	}
}

// pull reads up to limit messages from a broker.
func pull(ctx context.Context, tc *transport.Client, req *protocol.PullRequest, limit int) ([]protocol.StoredMessage, error) {
	var out []protocol.StoredMessage
	if limit <= 0 {
		return nil, nil
	}
	for len(out) < limit {
		pr, err := pullOnce(ctx, tc, req)
		if err != nil {
			return nil, err
		}
		out = append(out, pr.Messages...)
		// An answer with a filter may hold nothing and still move on.
		if pr.NextOffset <= req.Offset || pr.NextOffset >= pr.MaxOffset {
			break
		}
		req.Offset = pr.NextOffset
	}
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}
