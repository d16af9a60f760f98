package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/internal/ops"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/producer"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/sdk"
)

// Limits of delayed ls's flags.
const (
	maxDelayBucket = 366 * 24 * time.Hour
	maxDelayLimit  = 1000 // buckets per group (the broker's cap)
)

type delayedLsOptions struct {
	group  string
	topic  string
	bucket time.Duration
	limit  int
}

// delayedJSON is what delayed get and delayed cancel print with --json:
// the broker's answer, the handle asked about, and for a cancel its
// outcome.
type delayedJSON struct {
	Handle string `json:"handle"`
	protocol.DelayedState
	// Outcome, for a cancel: "cancelled" (by this call), "cancelled-before"
	// or "released" (too late: it was released before).
	Outcome string `json:"outcome,omitempty"`
}

func newDelayedCommand(g *globalOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "delayed",
		Short: "List, look up and cancel delayed messages",
		Long: `List, look up and cancel delayed messages (send --at or --after). A delayed
message is named by its handle, GROUP@OFFSET/DUE: the broker group that holds
its pending record, that record's log offset and the due time (unix
milliseconds, which finds the message after retention moved it), as send
prints it.`,
	}
	cmd.AddCommand(newDelayedLsCommand(g), newDelayedGetCommand(g), newDelayedCancelCommand(g))
	return cmd
}

func newDelayedLsCommand(g *globalOptions) *cobra.Command {
	o := &delayedLsOptions{}
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "Print the pending delayed messages of every broker group, or one",
		Long: `Print the pending delayed messages of every broker group (or --group's), as
each group's master counts them: how many are pending and when the next is due;
how many are due per bucket of due time (--bucket wide, the earliest --limit
buckets); and per topic, with the topic's quota of pending messages in the
group. A group that cannot be asked is reported after the others (exit 1, or
3 when it cannot be reached).`,
		Args: usageArgs(cobra.NoArgs),
		RunE: g.metaRun(func(ctx context.Context, cl *client.Client, _ []string) error {
			return o.run(ctx, g, cl)
		}),
	}
	f := cmd.Flags()
	f.StringVar(&o.group, "group", "", "only this broker group")
	f.StringVar(&o.topic, "topic", "", "only this topic's delayed messages")
	f.DurationVar(&o.bucket, "bucket", time.Minute, "the width of a bucket of due time")
	f.IntVar(&o.limit, "limit", 100, "at most this many buckets per group, the earliest")
	c := g.checker(f)
	c.name("group", "a broker group name", checkBrokerGroup)
	c.name("topic", topicWant, checkTopic)
	c.durationRange("bucket", time.Second, maxDelayBucket)
	c.intRange("limit", 1, maxDelayLimit)
	return cmd
}

// run lists each group's pending delayed messages, then reports the groups
// that could not be asked.
func (o *delayedLsOptions) run(ctx context.Context, g *globalOptions, cl *client.Client) error {
	lists, unasked, err := ops.DelayedLists(ctx, cl, dialer(ctx), o.group,
		protocol.DelayedListRequest{Topic: o.topic, BucketMillis: o.bucket.Milliseconds(), Limit: o.limit})
	if err != nil {
		return err
	}
	if err := o.print(g, lists); err != nil {
		return err
	}
	return unasked
}

// print writes the lists: JSON, or three tables (the groups, their
// buckets, their topics).
func (o *delayedLsOptions) print(g *globalOptions, lists []protocol.DelayedList) error {
	if g.json {
		return g.printer().print(lists, nil, nil)
	}
	var groups, buckets, topics [][]string
	for _, l := range lists {
		groups = append(groups, []string{l.Group, fmt.Sprint(l.Pending), formatMillis(l.NextDue), dueIn(l.NextDue, l.Now)})
		for _, b := range l.Buckets {
			buckets = append(buckets, []string{l.Group, formatMillis(b.Start), o.bucket.String(), fmt.Sprint(b.Pending)})
		}
		for _, t := range l.Topics {
			quota := "-"
			if t.Quota > 0 {
				quota = fmt.Sprint(t.Quota)
			}
			topics = append(topics, []string{l.Group, t.Topic, fmt.Sprint(t.Pending), quota})
		}
	}
	p := tablePrinter{g.out}
	if err := p.print(nil, []string{"GROUP", "PENDING", "NEXT-DUE", "IN"}, groups); err != nil {
		return err
	}
	if len(buckets) > 0 {
		fmt.Fprintln(g.out)
		if err := p.print(nil, []string{"GROUP", "DUE-FROM", "WIDTH", "PENDING"}, buckets); err != nil {
			return err
		}
	}
	if len(topics) > 0 {
		fmt.Fprintln(g.out)
		return p.print(nil, []string{"GROUP", "TOPIC", "PENDING", "QUOTA"}, topics)
	}
	return nil
}

func newDelayedGetCommand(g *globalOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "get HANDLE",
		Short: "Print what became of a delayed message: pending, released (where), cancelled",
		Long: `Print what became of the delayed message HANDLE (GROUP@OFFSET/DUE, as send --at
or --after prints it): pending (and when it is due), released (at which queue
offset, when, and how late), or cancelled. It asks the group's master.`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.onDelayed(cmd, args[0], false)
		},
	}
}

func newDelayedCancelCommand(g *globalOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "cancel HANDLE",
		Short: "Cancel a pending delayed message",
		Long: `Cancel the pending delayed message HANDLE (GROUP@OFFSET/DUE, as send --at or
--after prints it) at its group's master, and print what happened: cancelled by this
call, cancelled before, or released before it could be (at which queue offset
and when). A message released before is not cancelled: that exits 1.`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.onDelayed(cmd, args[0], true)
		},
	}
}

// errNotCancelled is delayed cancel's error for a message released before.
var errNotCancelled = errors.New("not cancelled")

// onDelayed runs delayed get (cancel false) or delayed cancel of the
// handle arg (checked when the arguments were) through the producer SDK,
// which finds the group's master.
func (g *globalOptions) onDelayed(cmd *cobra.Command, arg string, cancel bool) error {
	h, err := protocol.ParseHandle(arg)
	if err != nil {
		return usageError{err}
	}
	p, err := producer.New(sdk.MetaAddrs(g.addrs()...), producer.DeliveryTimeout(g.timeout), producer.RequestTimeout(g.timeout),
		sdk.TLS(g.tls.config), sdk.Token(g.token))
	if err != nil {
		return usageError{err}
	}
	defer p.Close()
	ctx, stop := context.WithTimeout(cmd.Context(), g.timeout)
	defer stop()
	call := p.DelayedState
	if cancel {
		call = p.Cancel
	}
	st, err := call(ctx, h)
	if err != nil {
		return err
	}
	out := delayedJSON{Handle: protocol.Handle{Group: h.Group, Offset: st.Offset, DueAt: st.DueAt}.String(), DelayedState: st}
	header := []string{"HANDLE", "TOPIC", "QUEUE", "ID", "DUE", "STATE", "WHERE"}
	row := []string{out.Handle, st.Topic, fmt.Sprint(st.Queue), st.ID, formatMillis(st.DueAt), st.State, where(st, time.Now())}
	var result error
	if cancel {
		switch {
		case st.State == protocol.DelayCancelled && st.By == "cancel":
			out.Outcome = "cancelled"
		case st.State == protocol.DelayCancelled:
			out.Outcome = "cancelled-before"
		case st.State == protocol.DelayReleased:
			out.Outcome = "released"
			result = fmt.Errorf("%w: %s was released before: %s", errNotCancelled, out.Handle, where(st, time.Now()))
		default:
			result = fmt.Errorf("%w: the broker answered %s is %s", errNotCancelled, out.Handle, st.State)
		}
		header = append(header, "RESULT")
		row = append(row, outcomeText(out.Outcome))
	}
	if err := g.printer().print(out, header, [][]string{row}); err != nil {
		return err
	}
	return result
}

// outcomeText is a cancel's outcome as the table says it.
func outcomeText(outcome string) string {
	switch outcome {
	case "cancelled":
		return "cancelled by this call"
	case "cancelled-before":
		return "cancelled before"
	case "released":
		return "released before: not cancelled"
	}
	return "not cancelled"
}

// where says where a delayed message is (ops.DelayedWhere).
func where(st protocol.DelayedState, now time.Time) string { return ops.DelayedWhere(st, now) }

// dueIn says how far a due time is from now (ops.DueIn).
func dueIn(due, now int64) string { return ops.DueIn(due, now) }

// formatMillis is a unix-millisecond time in UTC, to the millisecond, or
// "-" for 0.
func formatMillis(ms int64) string { return ops.FormatMillis(ms) }

// checkHandle checks a handle argument: GROUP@OFFSET[/DUE] with a broker
// group name, a log offset and a due time.
func checkHandle(s string) error {
	h, err := protocol.ParseHandle(s)
	if err != nil {
		return err
	}
	if err := checkBrokerGroup(h.Group); err != nil {
		return fmt.Errorf("handle %s: %w", shown(s), err)
	}
	return nil
}
