package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/consumer"
	"github.com/ferrymq/ferrymq/metaserver/fsm"
	"github.com/ferrymq/ferrymq/sdk"
)

type consumeOptions struct {
	group  string
	from   string
	count  int
	member string
	filter string
}

// consumedJSON is one consumed message as --json prints it (one object a
// line).
type consumedJSON struct {
	Topic      string            `json:"topic"`
	Queue      uint32            `json:"queue"`
	Offset     int64             `json:"offset"`
	ID         string            `json:"id"`
	Key        string            `json:"key,omitempty"`
	Tag        string            `json:"tag,omitempty"`
	Properties map[string]string `json:"properties,omitempty"`
	StoreTime  time.Time         `json:"store_time"`
	Timestamp  time.Time         `json:"timestamp"`
	ProducerID uint64            `json:"producer_id,omitempty"`
	Seq        int64             `json:"seq,omitempty"`
	Deliveries int               `json:"deliveries"`
	Body       string            `json:"body"`
}

func newConsumeCommand(g *globalOptions) *cobra.Command {
	o := &consumeOptions{}
	cmd := &cobra.Command{
		Use:   "consume TOPIC --group G",
		Short: "Consume a topic as a member of a consumer group, printing messages and committing as it goes",
		Long: `Join the consumer group G as a member, print the messages of the queues it
is given and commit them as they are printed; on --count messages, on
--timeout without a new message, or on an interrupt, commit, leave the group
and stop. Without --timeout it waits for messages until interrupted.`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			// The flags were checked when parsed.
			start := consumer.Earliest
			if o.from == "latest" {
				start = consumer.Latest
			}
			idle := time.Duration(0)
			if cmd.Flags().Changed("timeout") { // or FERRY_TIMEOUT
				idle = g.timeout
			}
			opts := []consumer.Opt{sdk.MetaAddrs(g.addrs()...), consumer.StartFrom(start), consumer.ManualCommit(), sdk.TLS(g.tls.config), sdk.Token(g.token)}
			if o.member != "" {
				opts = append(opts, consumer.MemberID(o.member))
			}
			if o.filter != "" {
				opts = append(opts, consumer.Filter(o.filter))
			}
			if o.count > 0 {
				opts = append(opts, consumer.MaxPollRecords(min(o.count, 500)))
			}
			c, err := consumer.New(o.group, []string{args[0]}, opts...)
			if err != nil {
				return usageError{err}
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			n, err := consume(ctx, c, g, o.count, idle)
			closeErr := c.Close()
			if err == nil || n > 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "ferryctl: consumed %d messages as %s of group %s\n", n, c.MemberID(), o.group)
			}
			if err != nil {
				return err
			}
			if closeErr != nil {
				return fmt.Errorf("commit and leave the group: %w", closeErr)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.group, "group", "", "the consumer group to join (required)")
	f.StringVar(&o.from, "from", "earliest", "where a queue the group never committed starts: earliest or latest")
	f.IntVar(&o.count, "count", 0, "stop after this many messages (0: no limit)")
	f.StringVar(&o.member, "member", "", "this member's id in the group (default: hostname-pid-random)")
	f.StringVar(&o.filter, "filter", "", "the group's filter of tags and properties, e.g. \"A || B\" (refused if the group has another; see group set-filter)")
	_ = cmd.MarkFlagRequired("group")
	c := g.checker(f)
	c.name("group", groupWant, checkConsumerGroup)
	c.oneOf("from", "earliest", "latest")
	c.intRange("count", 0, maxCount)
	c.name("filter", "a filter such as \"A || B\" or \"region = 'eu'\"", checkFilter)
	c.name("member", "a member name: 1 to 255 letters, digits, '.', '_', '-'", func(s string) error {
		return fsm.ValidateConsumerName("member", s)
	})
	return cmd
}

// consume polls, prints and marks messages until count, idle without a
// message, or ctx ends; it commits after every batch printed.
func consume(ctx context.Context, c *consumer.Consumer, g *globalOptions, count int, idle time.Duration) (int, error) {
	n := 0
	header := false
	for count == 0 || n < count {
		pctx, cancel := ctx, context.CancelFunc(func() {})
		if idle > 0 {
			pctx, cancel = context.WithTimeout(ctx, idle)
		}
		msgs, err := c.Poll(pctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return n, nil // interrupted
			}
			if idle > 0 && errors.Is(err, context.DeadlineExceeded) {
				if c.Stats().Generation == 0 {
					return n, fmt.Errorf("join the group %s: %w", c.Group(), err)
				}
				return n, nil // nothing new for --timeout
			}
			return n, err
		}
		if count > 0 && n+len(msgs) > count {
			msgs = msgs[:count-n] // the rest are not marked: the group gets them again
		}
		if !g.json && !header {
			fmt.Fprintf(g.out, "%-5s %-10s %-24s %-12s %-12s %-23s %s\n", "QUEUE", "OFFSET", "ID", "KEY", "TAG", "STORED", "BODY")
			header = true
		}
		for _, m := range msgs {
			if err := printConsumed(g.out, g.json, m); err != nil {
				return n, err
			}
			c.MarkProcessed(m)
			n++
		}
		if err := c.Commit(ctx); err != nil && ctx.Err() == nil && !errors.Is(err, consumer.ErrRebalanced) {
			return n, fmt.Errorf("commit: %w", err)
		}
	}
	return n, nil
}

func printConsumed(w io.Writer, asJSON bool, m *consumer.Message) error {
	if asJSON {
		return json.NewEncoder(w).Encode(consumedJSON{Topic: m.Topic, Queue: m.Queue, Offset: m.Offset, ID: m.ID, Key: m.Key, Tag: m.Tag,
			Properties: m.Properties, StoreTime: m.StoreTime, Timestamp: m.Timestamp, ProducerID: m.ProducerID, Seq: m.Seq,
			Deliveries: m.Deliveries, Body: string(m.Body)})
	}
	body := string(m.Body)
	if len(body) > 60 {
		body = body[:57] + "..."
	}
	_, err := fmt.Fprintf(w, "%-5d %-10d %-24s %-12s %-12s %-23s %q\n", m.Queue, m.Offset, m.ID, orDash(m.Key), orDash(m.Tag),
		m.StoreTime.Local().Format("2006-01-02 15:04:05.000"), body)
	return err
}
