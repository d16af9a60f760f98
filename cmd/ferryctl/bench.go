package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/internal/loadgen"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

type benchOptions struct {
	topic       string
	queues      int
	producers   int
	size        int
	count       int64 // 0: no limit (only --duration was given)
	duration    time.Duration
	deliveryTO  time.Duration
	reliability string
	delay       time.Duration
	delaySpread time.Duration
	tag         string
	filter      string
	deliverAt   string
	mode        string
	window      int
	linger      time.Duration
	batchBytes  int
	inflight    int
	idempotence bool
	progress    bool
	rate        float64
	consumers   int
	group       string
	backlog     bool
	consumeWait time.Duration
	cpuProfile  string
	memProfile  string
	at          time.Time // --deliver-at, parsed
}

func newBenchCommand(g *globalOptions) *cobra.Command {
	o := &benchOptions{}
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Send messages as fast as the cluster takes them (or at --rate) and report throughput and latency; with --consumers, consume them too",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Each flag was checked when parsed; here what they say together.
			if (o.backlog || o.filter != "") && o.consumers == 0 {
				return usageError{fmt.Errorf("--backlog and --filter need --consumers")}
			}
			if cmd.Flags().Changed("duration") && !cmd.Flags().Changed("count") {
				o.count = 0 // --duration alone: as many as fit in it
			}
			if o.linger >= o.deliveryTO {
				return usageError{fmt.Errorf("--linger %v must be shorter than --delivery-timeout %v", o.linger, o.deliveryTO)}
			}
			if o.delaySpread > 0 && o.delay == 0 && !cmd.Flags().Changed("deliver-at") {
				return usageError{fmt.Errorf("--delay-spread needs --delay")}
			}
			if o.delay+o.delaySpread > maxBenchDelay {
				return usageError{fmt.Errorf("--delay %v plus --delay-spread %v: want at most %v in all", o.delay, o.delaySpread, maxBenchDelay)}
			}
			rel, err := protocol.ParseReliability(o.reliability)
			if err != nil {
				return usageError{err}
			}
			if cmd.Flags().Changed("deliver-at") {
				if o.delay > 0 {
					return usageError{fmt.Errorf("--delay and --deliver-at: give one")}
				}
				if o.delaySpread > 0 {
					return usageError{fmt.Errorf("--delay-spread and --deliver-at: the spread is added to --delay")}
				}
				if o.at, err = time.Parse(time.RFC3339Nano, o.deliverAt); err != nil {
					return usageError{fmt.Errorf("--deliver-at %q: want an RFC 3339 time such as 2026-12-06T09:00:00Z", o.deliverAt)}
				}
			}
			res, err := runBench(cmd.Context(), g, o, rel)
			if err != nil {
				return err
			}
			if err := printBench(g, res); err != nil {
				return err
			}
			if res.Errors > 0 {
				return sendFailures(res)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.topic, "topic", "bench", "topic to send to (created if missing)")
	f.IntVar(&o.queues, "queues", 8, "queues of the topic if bench creates it")
	f.IntVar(&o.producers, "producers", 4, "producer clients, each in its own goroutine")
	f.IntVar(&o.size, "size", 1024, "message body size in bytes")
	f.Int64Var(&o.count, "count", 100000, "messages to send in all (with --duration alone: no limit; with both: whichever ends first)")
	f.DurationVar(&o.duration, "duration", 0, "stop after this long (default: when --count messages are sent)")
	f.DurationVar(&o.deliveryTO, "delivery-timeout", 30*time.Second, "a message not acknowledged this long after its send fails (the producer's DeliveryTimeout)")
	f.StringVar(&o.reliability, "reliability", "normal", "normal or high")
	f.DurationVar(&o.delay, "delay", 0, "send delayed messages, each due this long after its send (0: ordinary messages)")
	f.StringVar(&o.tag, "tag", "", "tag every message with this tag, or with each of a comma-separated list in turn")
	f.DurationVar(&o.delaySpread, "delay-spread", 0, "with --delay, add to each message's delay a uniformly random duration below this (messages due over a span)")
	f.StringVar(&o.deliverAt, "deliver-at", "", "send delayed messages all due at this time (RFC 3339)")
	f.StringVar(&o.mode, "mode", "async", "sync (one message at a time per producer) or async (--window in flight per producer)")
	f.IntVar(&o.window, "window", 1000, "async: messages in flight per producer")
	f.DurationVar(&o.linger, "linger", 2*time.Millisecond, "producer linger")
	f.IntVar(&o.batchBytes, "batch-bytes", 0, "producer MaxBatchBytes (0: the SDK's default)")
	f.IntVar(&o.inflight, "max-inflight", 0, "producer MaxInflightPerGroup (0: the SDK's default)")
	f.BoolVar(&o.idempotence, "idempotence", true, "idempotent, ordered sends (producer ids and sequences); false to measure without")
	f.BoolVar(&o.progress, "progress", true, "show a progress line when the output is a terminal")
	f.Float64Var(&o.rate, "rate", 0, "send at most this many messages/s in all (0: as fast as the cluster takes them)")
	f.IntVar(&o.consumers, "consumers", 0, "consume what is sent with a consumer group of this many members, measuring consumer throughput and end-to-end latency (0: no consume side)")
	f.StringVar(&o.group, "group", "", "the consumer group (default: a new one per run)")
	f.StringVar(&o.filter, "filter", "", "the consumer group's filter, e.g. \"A || B\" (with --consumers; the run waits for what it takes)")
	f.BoolVar(&o.backlog, "backlog", false, "consume after sending everything, measuring how fast the group drains a backlog (default: consume while sending)")
	f.DurationVar(&o.consumeWait, "consume-wait", 10*time.Second, "stop consuming when no message came for this long")
	f.StringVar(&o.cpuProfile, "cpuprofile", "", "debug: write a CPU profile of this process while it sends to this file (go tool pprof FILE)")
	f.StringVar(&o.memProfile, "memprofile", "", "debug: write an allocation profile of this process, taken after the sends, to this file")
	c := g.checker(f)
	c.name("topic", topicWant, checkTopic) // a topic to create is the metaserver's to check
	c.intRange("queues", 1, maxQueues)
	c.intRange("producers", 1, maxProducers)
	c.intRange("size", 0, protocol.MaxMessageSize)
	c.intRange("count", 1, maxCount)
	c.durationRange("duration", time.Millisecond, maxBenchTime)
	c.durationRange("delivery-timeout", time.Millisecond, time.Hour)
	c.oneOf("reliability", "normal", "high")
	c.durationRange("delay", 0, maxBenchDelay)
	c.durationRange("delay-spread", 0, maxBenchDelay)
	c.name("tag", fmt.Sprintf("tags of 1 to %d letters, digits or %q, separated by commas", protocol.MaxTagLen, protocol.TagChars), checkTags)
	c.name("filter", "a filter such as \"A || B\"", checkFilter)
	c.oneOf("mode", "sync", "async")
	c.intRange("window", 1, maxWindow)
	c.durationRange("linger", 0, maxLinger)
	c.intRange("batch-bytes", 0, protocol.MaxFrameSize-protocol.FixedHeaderSize-protocol.SendRequestHeaderSize)
	c.intRange("max-inflight", 0, maxInflight)
	c.bool("idempotence")
	c.bool("progress")
	c.wrap("rate", fmt.Sprintf("0 (as fast as the cluster takes them) or a number from %g to %g", minRate, maxRate), checkRate)
	c.intRange("consumers", 0, maxConsumers)
	c.name("group", groupWant, checkConsumerGroup)
	c.bool("backlog")
	c.durationRange("consume-wait", time.Millisecond, maxConsumeIdl)
	notEmpty := func(s string) error {
		if s == "" {
			return errors.New("want a file name")
		}
		return nil
	}
	c.name("cpuprofile", "a file name", notEmpty)
	c.name("memprofile", "a file name", notEmpty)
	return cmd
}

// maxBenchDelay is the longest --delay, and --delay plus --delay-spread:
// the broker's default -max-delay.
const maxBenchDelay = 90 * 24 * time.Hour

// minRate is the lowest --rate other than 0 (unpaced): one message in
// about 17 minutes.
const minRate = 0.001

// checkRate checks a --rate: 0, or from minRate to maxRate.
func checkRate(s string) error {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) || f != 0 && (f < minRate || f > maxRate) {
		return errWant
	}
	return nil
}

// printBench prints a run's result: one JSON object, or the send table
// and, with --consumers, the consume table.
func printBench(g *globalOptions, res loadgen.Result) error {
	if err := g.printer().print(res, []string{"MODE", "RELIABILITY", "SENT", "ERRORS", "SECONDS", "MSGS/S", "MB/S", "P50", "P90", "P99", "P99.9", "MAX"},
		[][]string{{res.Mode, res.Reliability, fmt.Sprint(res.Sent), fmt.Sprint(res.Errors), fmt.Sprintf("%.2f", res.Seconds),
			fmt.Sprintf("%.0f", res.MsgsPerSec), fmt.Sprintf("%.1f", res.MBPerSec), us(res.P50Micros), us(res.P90Micros),
			us(res.P99Micros), us(res.P999Micros), us(res.MaxMicros)}}); err != nil || g.json || res.Consume == nil {
		return err
	}
	c := res.Consume
	fmt.Fprintln(g.out)
	return tablePrinter{g.out}.print(nil, []string{"CONSUMERS", "CONSUMED", "MISSING", "SECONDS", "SETTLE", "MSGS/S", "MB/S", "E2E-P50", "P90", "P99", "P99.9", "MAX"},
		[][]string{{fmt.Sprint(c.Consumers), fmt.Sprint(c.Consumed), fmt.Sprint(c.Missing), fmt.Sprintf("%.3f", c.Seconds), fmt.Sprintf("%.3f", c.SettleSeconds),
			fmt.Sprintf("%.0f", c.MsgsPerSec), fmt.Sprintf("%.1f", c.MBPerSec), us(c.P50Micros), us(c.P90Micros),
			us(c.P99Micros), us(c.P999Micros), us(c.MaxMicros)}})
}

// maxCausesShown is how many causes a failed run names.
const maxCausesShown = 5

// sendFailures is bench's error when sends failed: how many, and the first
// few causes with their counts, one a line.
func sendFailures(res loadgen.Result) error {
	var b strings.Builder
	fmt.Fprintf(&b, "bench: %d of %d sends failed", res.Errors, res.Errors+res.Sent)
	for i, c := range res.ErrorCauses {
		if i == maxCausesShown {
			fmt.Fprintf(&b, "\n... and %d more causes (--json lists them all)", len(res.ErrorCauses)-maxCausesShown)
			break
		}
		fmt.Fprintf(&b, "\n%d x %s", c.Count, c.Cause)
		if c.Example != c.Cause {
			fmt.Fprintf(&b, ": %s", c.Example)
		}
	}
	return errors.New(b.String())
}

func us(v int64) string { return (time.Duration(v) * time.Microsecond).String() }

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// runBench runs the load generator with what the flags say; a run the load
// generator refuses for its configuration is a usage error.
func runBench(ctx context.Context, g *globalOptions, o *benchOptions, rel protocol.Reliability) (loadgen.Result, error) {
	cfg := loadgen.Config{
		MetaAddrs: g.addrs(), TLS: g.tls.config, Token: g.token, CallTimeout: g.timeout,
		Topic: o.topic, Queues: o.queues, Producers: o.producers, Size: o.size,
		Count: o.count, Duration: o.duration, Rate: o.rate, Mode: loadgen.Mode(o.mode), Window: o.window,
		Reliability: rel, DeliverAfter: o.delay, DelaySpread: o.delaySpread, DeliverAt: o.at, Tags: splitTags(o.tag), Filter: o.filter, DeliveryTimeout: o.deliveryTO, Linger: o.linger, BatchBytes: o.batchBytes,
		MaxInflight: o.inflight, Idempotence: o.idempotence,
		Consumers: o.consumers, Group: o.group, Backlog: o.backlog, ConsumeWait: o.consumeWait, QueueEnds: queueEnds,
		CPUProfile: o.cpuProfile, MemProfile: o.memProfile,
	}
	if o.progress && !g.json && isTerminal(g.out) {
		cfg.Progress = g.out
	}
	res, err := loadgen.Run(ctx, cfg)
	if ce := (*loadgen.ConfigError)(nil); errors.As(err, &ce) {
		return res, usageError{err}
	}
	return res, err
}

// queueEnds returns each queue's log end, where a --backlog group starts.
func queueEnds(ctx context.Context, route routing.Route) ([]api.QueueOffset, error) {
	out := make([]api.QueueOffset, len(route.Queues))
	errs := make([]error, len(route.Queues))
	parallel(len(route.Queues), func(i int) {
		qr := route.Queues[i]
		_, end, err := queueRange(ctx, qr, route.Topic, 0, discard{})
		out[i], errs[i] = api.QueueOffset{Topic: route.Topic, Queue: qr.Queue, Offset: end}, err
	})
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// splitTags is --tag's list ("": none).
func splitTags(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

func checkTags(s string) error {
	for _, t := range strings.Split(s, ",") {
		if err := protocol.ValidateTag(t); err != nil {
			return err
		}
	}
	return nil
}
