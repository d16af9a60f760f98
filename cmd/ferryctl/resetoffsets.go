package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/internal/ops"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/protocol"
)

type resetOptions struct {
	topic    string
	queues   []uint
	earliest bool
	latest   bool
	offset   int64
	at       string
	dryRun   bool
	create   bool
}

// resetTarget says where reset-offsets moves each queue.
type resetTarget struct {
	kind   string // earliest, latest, offset, time
	offset int64
	at     int64 // unix ms
}

// resetJSON is what reset-offsets prints.
type resetJSON struct {
	Group   string            `json:"group"`
	Topic   string            `json:"topic"`
	Applied bool              `json:"applied"` // false with --dry-run
	Offsets []resetOffsetJSON `json:"offsets"`
}

type resetOffsetJSON struct {
	Queue    uint32 `json:"queue"`
	Previous int64  `json:"previous"` // -1: nothing was committed
	Offset   int64  `json:"offset"`
	LogStart int64  `json:"log_start"`
	LogEnd   int64  `json:"log_end"`
	Note     string `json:"note,omitempty"`
}

func newGroupResetOffsetsCommand(g *globalOptions) *cobra.Command {
	o := &resetOptions{}
	cmd := &cobra.Command{
		Use:   "reset-offsets GROUP --topic T (--to-earliest | --to-latest | --to-offset N | --to-time T)",
		Short: "Set a stopped group's committed offsets for a topic's queues",
		Long: `Set a consumer group's committed offsets for the queues of a topic (all of
them, or those given with --queues), computed from the brokers:
  --to-earliest   the queue's oldest offset
  --to-latest     the queue's log end (the next offset to be written)
  --to-offset N   N, clamped to the queue's range
  --to-time T     the first message stored at or after T (RFC 3339, or unix ms)
The group must have no live members: stop its consumers first. A group that
does not exist is refused (a mistyped name makes no group) unless --create.`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			target, err := o.target(cmd)
			if err != nil {
				return usageError{err}
			}
			cl, ctx, done, err := g.metaClient(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			return resetOffsets(ctx, g, cl, args[0], o, target, cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.topic, "topic", "", "the topic whose offsets to set (required)")
	f.UintSliceVar(&o.queues, "queues", nil, "only these queues (default: every queue of the topic)")
	f.BoolVar(&o.earliest, "to-earliest", false, "each queue's oldest offset")
	f.BoolVar(&o.latest, "to-latest", false, "each queue's log end: skip everything stored so far")
	f.Int64Var(&o.offset, "to-offset", 0, "this offset, clamped to each queue's range")
	f.StringVar(&o.at, "to-time", "", "the first message stored at or after this time: RFC 3339 (2006-01-02T15:04:05Z) or unix milliseconds")
	f.BoolVar(&o.dryRun, "dry-run", false, "print the offsets without setting them")
	f.BoolVar(&o.create, "create", false, "make the group if it does not exist (so that its first members start at these offsets)")
	_ = cmd.MarkFlagRequired("topic")
	c := g.checker(f)
	c.name("topic", topicWant, checkTopic)
	c.intRange("to-offset", 0, math.MaxInt64)
	c.name("to-time", "RFC 3339 (2006-01-02T15:04:05Z07:00) or unix milliseconds", func(s string) error {
		_, err := parseTime(s)
		return err
	})
	c.name("queues", "queue ids, comma-separated", func(s string) error {
		for _, q := range strings.Split(s, ",") {
			if n, err := strconv.ParseUint(strings.TrimSpace(q), 10, 32); err != nil || n > math.MaxUint32 {
				return fmt.Errorf("%s is not a queue id (0 to %d)", shown(q), uint32(math.MaxUint32))
			}
		}
		return nil
	})
	c.bool("to-earliest")
	c.bool("to-latest")
	c.bool("dry-run")
	c.bool("create")
	return cmd
}

// target checks the flags, before any network call: exactly one --to-*.
func (o *resetOptions) target(cmd *cobra.Command) (resetTarget, error) {
	var set []string
	var t resetTarget
	if o.earliest {
		set, t = append(set, "--to-earliest"), resetTarget{kind: "earliest"}
	}
	if o.latest {
		set, t = append(set, "--to-latest"), resetTarget{kind: "latest"}
	}
	if cmd.Flags().Changed("to-offset") {
		set, t = append(set, "--to-offset"), resetTarget{kind: "offset", offset: o.offset}
	}
	if cmd.Flags().Changed("to-time") {
		at, _ := parseTime(o.at) // checked when parsed
		set, t = append(set, "--to-time"), resetTarget{kind: "time", at: at}
	}
	switch len(set) {
	case 0:
		return t, errors.New("say where to: one of --to-earliest, --to-latest, --to-offset N, --to-time T")
	case 1:
		return t, nil
	default:
		return t, fmt.Errorf("give only one of %s", strings.Join(set, ", "))
	}
}

// parseTime reads RFC 3339 or unix milliseconds and returns unix ms.
func parseTime(s string) (int64, error) {
	if ms, err := strconv.ParseInt(s, 10, 64); err == nil {
		if ms < 0 {
			return 0, errors.New("want a time: unix milliseconds must not be negative")
		}
		return ms, nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil || t.UnixMilli() < 0 {
		return 0, errors.New("want RFC 3339 (2006-01-02T15:04:05Z07:00) or unix milliseconds")
	}
	return t.UnixMilli(), nil
}

func resetOffsets(ctx context.Context, g *globalOptions, cl *client.Client, group string, o *resetOptions, target resetTarget, stderrW io.Writer) error {
	route, err := cl.RouteExisting(ctx, o.topic)
	if err != nil {
		return err
	}
	queues := route.Queues
	if len(o.queues) > 0 {
		queues = nil
		for _, id := range o.queues {
			if id >= uint(len(route.Queues)) {
				// A queue the topic does not have is bad usage (exit 2), as for read.
				return usageError{fmt.Errorf("topic %s has %d queues; no queue %d", o.topic, len(route.Queues), id)}
			}
			queues = append(queues, route.Queues[id])
		}
	}
	previous := map[uint32]int64{}
	info, err := consumerGroup(ctx, cl, group)
	switch {
	case err == nil:
		for _, off := range info.Offsets {
			if off.Topic == o.topic {
				previous[off.Queue] = off.Offset
			}
		}
	case errors.Is(err, protocol.ErrNotFound): // a group yet to run: its offsets are set before it starts
	default:
		return err
	}

	stderr := &lockedWriter{w: stderrW}
	res := resetJSON{Group: group, Topic: o.topic, Applied: !o.dryRun, Offsets: make([]resetOffsetJSON, len(queues))}
	errs := make([]error, len(queues))
	parallel(len(queues), func(i int) {
		qr := queues[i]
		r := &res.Offsets[i]
		r.Queue = qr.Queue
		r.Previous = -1
		if p, ok := previous[qr.Queue]; ok {
			r.Previous = p
		}
		errs[i] = onQueueBroker(ctx, qr, o.topic, stderr, func(ctx context.Context, tc *transport.Client) error {
			return resetTargetOffset(ctx, tc, o.topic, qr.Queue, target, r)
		})
		if errs[i] != nil {
			errs[i] = fmt.Errorf("queue %d: %w", qr.Queue, errs[i])
		} else if r.Note != "" {
			fmt.Fprintf(stderr, "ferryctl: queue %d: %s\n", r.Queue, r.Note)
		}
	})
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("reading the queues' offsets from the brokers: %w", err)
	}

	if !o.dryRun {
		req := api.ResetOffsetsRequest{Group: group, Create: o.create}
		for _, r := range res.Offsets {
			req.Offsets = append(req.Offsets, api.QueueOffset{Topic: o.topic, Queue: r.Queue, Offset: r.Offset})
		}
		if _, err := cl.ResetOffsets(ctx, req); err != nil {
			if errors.Is(err, protocol.ErrGroupActive) {
				return fmt.Errorf("group %s has live members%s and must be stopped first: %w",
					group, liveMembers(ctx, cl, group), err)
			}
			return err
		}
	}
	var rows [][]string
	for _, r := range res.Offsets {
		prev := "-"
		if r.Previous >= 0 {
			prev = fmt.Sprint(r.Previous)
		}
		rows = append(rows, []string{o.topic, fmt.Sprint(r.Queue), prev, fmt.Sprint(r.Offset), fmt.Sprint(r.LogStart), fmt.Sprint(r.LogEnd), orDash(r.Note)})
	}
	if !g.json && o.dryRun {
		fmt.Fprintln(g.out, "dry run: nothing was changed")
	}
	return g.printer().print(res, []string{"TOPIC", "QUEUE", "PREVIOUS", "NEW", "LOG-START", "LOG-END", "NOTE"}, rows)
}

// liveMembers names a group's members, for an error message.
func liveMembers(ctx context.Context, cl *client.Client, group string) string {
	info, err := consumerGroup(ctx, cl, group)
	if err != nil || len(info.Members) == 0 {
		return ""
	}
	ids := make([]string, len(info.Members))
	for i, m := range info.Members {
		ids[i] = m.ID
	}
	return " (" + strings.Join(ids, ", ") + ")"
}

// resetTargetOffset computes one queue's new offset on a broker.
func resetTargetOffset(ctx context.Context, tc *transport.Client, topic string, queue uint32, target resetTarget, r *resetOffsetJSON) error {
	probe := func(offset int64) (protocol.PullResponse, error) {
		return pullOnce(ctx, tc, &protocol.PullRequest{Topic: topic, Queue: queue, Offset: offset, MaxBytes: 1})
	}
	pr, err := probe(0)
	if err != nil {
		return err
	}
	r.LogStart, r.LogEnd = pr.MinOffset, pr.MaxOffset
	switch target.kind {
	case "earliest":
		r.Offset = pr.MinOffset
	case "latest":
		r.Offset = pr.MaxOffset
	case "offset":
		r.Offset = target.offset
		if r.Offset < pr.MinOffset {
			r.Offset = pr.MinOffset
			r.Note = fmt.Sprintf("offset %d is before the log start %d: set to %d", target.offset, pr.MinOffset, pr.MinOffset)
		} else if r.Offset > pr.MaxOffset {
			r.Offset = pr.MaxOffset
			r.Note = fmt.Sprintf("offset %d is past the log end %d: set to %d", target.offset, pr.MaxOffset, pr.MaxOffset)
		}
	case "time":
		off, err := offsetForTime(pr.MinOffset, pr.MaxOffset, target.at, probe)
		if err != nil {
			return err
		}
		r.Offset = off
	default:
		return fmt.Errorf("unknown target %q", target.kind)
	}
	return nil
}

// offsetForTime finds the first offset in [lo, hi) whose message was stored
// at or after at (unix ms), by binary search with probe (ops.OffsetForTime).
func offsetForTime(lo, hi, at int64, probe func(offset int64) (protocol.PullResponse, error)) (int64, error) {
	return ops.OffsetForTime(lo, hi, at, probe)
}
