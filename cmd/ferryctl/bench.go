package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/consumer"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/producer"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/sdk"
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
}

// benchResult is what bench prints.
type benchResult struct {
	Topic       string `json:"topic"`
	Mode        string `json:"mode"`
	Reliability string `json:"reliability"`
	Idempotence bool   `json:"idempotence"`
	Producers   int    `json:"producers"`
	Size        int    `json:"size"`
	// Count is the most messages the run would send (0: no limit, with
	// --duration alone); DurationSeconds the longest it would send (0: no
	// limit).
	Count           int64   `json:"count"`
	DurationSeconds float64 `json:"duration_seconds"`
	Sent            int64   `json:"sent"`
	Errors          int64   `json:"errors"`
	FirstError      string  `json:"first_error,omitempty"`
	// ErrorCauses groups the failed sends by cause, most frequent first.
	ErrorCauses []errorCause `json:"error_causes,omitempty"`
	Seconds     float64      `json:"seconds"`
	// CPUSeconds is the CPU time (user and system) this process used
	// while sending: producers, promises and the bench's bookkeeping.
	CPUSeconds float64 `json:"cpu_seconds"`
	// Retries counts messages the producers sent again after a failed
	// attempt (the SDK's Stats): a run with retries has their backoffs in
	// its latencies.
	Retries    int64   `json:"retries"`
	MsgsPerSec float64 `json:"msgs_per_sec"`
	MBPerSec   float64 `json:"mb_per_sec"`
	P50Micros  int64   `json:"p50_us"`
	P90Micros  int64   `json:"p90_us"`
	P99Micros  int64   `json:"p99_us"`
	P999Micros int64   `json:"p999_us"`
	MaxMicros  int64   `json:"max_us"`
	// Consume is the consume side, with --consumers.
	Consume *consumeResult `json:"consume,omitempty"`
}

func newBenchCommand(g *globalOptions) *cobra.Command {
	o := &benchOptions{}
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Send messages as fast as the cluster takes them (or at --rate) and report throughput and latency; with --consumers, consume them too",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Each flag was checked when parsed; here what they say together.
			if o.backlog && o.consumers == 0 {
				return usageError{fmt.Errorf("--backlog needs --consumers")}
			}
			if cmd.Flags().Changed("duration") && !cmd.Flags().Changed("count") {
				o.count = 0 // --duration alone: as many as fit in it
			}
			if o.linger >= o.deliveryTO {
				return usageError{fmt.Errorf("--linger %v must be shorter than --delivery-timeout %v", o.linger, o.deliveryTO)}
			}
			rel, err := protocol.ParseReliability(o.reliability)
			if err != nil {
				return usageError{err}
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
	f.BoolVar(&o.backlog, "backlog", false, "consume after sending everything, measuring how fast the group drains a backlog (default: consume while sending)")
	f.DurationVar(&o.consumeWait, "consume-wait", 10*time.Second, "stop consuming when no message came for this long")
	f.StringVar(&o.cpuProfile, "cpuprofile", "", "debug: write a CPU profile of this process while it sends to this file (go tool pprof FILE)")
	f.StringVar(&o.memProfile, "memprofile", "", "debug: write an allocation profile of this process, taken after the sends, to this file")
	c := g.checker(f)
	c.name("topic", topicWant, checkTopic)
	c.intRange("queues", 1, maxQueues)
	c.intRange("producers", 1, maxProducers)
	c.intRange("size", 0, protocol.MaxMessageSize)
	c.intRange("count", 1, maxCount)
	c.durationRange("duration", time.Millisecond, maxBenchTime)
	c.durationRange("delivery-timeout", time.Millisecond, time.Hour)
	c.oneOf("reliability", "normal", "high")
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
func printBench(g *globalOptions, res benchResult) error {
	if err := g.printer().print(res, []string{"MODE", "RELIABILITY", "SENT", "ERRORS", "SECONDS", "MSGS/S", "MB/S", "P50", "P90", "P99", "P99.9", "MAX"},
		[][]string{{res.Mode, res.Reliability, fmt.Sprint(res.Sent), fmt.Sprint(res.Errors), fmt.Sprintf("%.2f", res.Seconds),
			fmt.Sprintf("%.0f", res.MsgsPerSec), fmt.Sprintf("%.1f", res.MBPerSec), us(res.P50Micros), us(res.P90Micros),
			us(res.P99Micros), us(res.P999Micros), us(res.MaxMicros)}}); err != nil || g.json || res.Consume == nil {
		return err
	}
	c := res.Consume
	fmt.Fprintln(g.out)
	return tablePrinter{g.out}.print(nil, []string{"CONSUMERS", "CONSUMED", "MISSING", "SECONDS", "MSGS/S", "MB/S", "E2E-P50", "P90", "P99", "P99.9", "MAX"},
		[][]string{{fmt.Sprint(c.Consumers), fmt.Sprint(c.Consumed), fmt.Sprint(c.Missing), fmt.Sprintf("%.2f", c.Seconds),
			fmt.Sprintf("%.0f", c.MsgsPerSec), fmt.Sprintf("%.1f", c.MBPerSec), us(c.P50Micros), us(c.P90Micros),
			us(c.P99Micros), us(c.P999Micros), us(c.MaxMicros)}})
}

// errorCause is one cause of failed sends: what kind of failure the
// producer says it is (not delivered in time, metaserver unreachable...)
// and the status under it (READ_ONLY), or for an error that is neither,
// its text.
type errorCause struct {
	Cause   string `json:"cause"`
	Count   int64  `json:"count"`
	Example string `json:"example"` // the first error of this cause
}

// maxCausesShown is how many causes a failed run names.
const maxCausesShown = 5

// sendErrors groups failed sends by cause.
type sendErrors struct {
	mu     sync.Mutex
	causes map[string]*errorCause
	order  []string // first seen first
}

// producerKinds are the producer's kinds of failure, as a cause names
// them, outermost first: a delivery timeout wraps its last attempt's
// cause, such as an unreachable metaserver.
var producerKinds = []struct {
	err  error
	name string
}{
	{producer.ErrDeliveryTimeout, "not delivered in time"},
	{producer.ErrClosed, "producer closed"},
	{producer.ErrFenced, "producer fenced"},
	{producer.ErrBufferFull, "buffer full"},
	{producer.ErrUnreachable, "metaserver unreachable"},
	{producer.ErrConnLost, "connection to broker lost"},
	{context.DeadlineExceeded, "deadline exceeded"},
	{context.Canceled, "canceled"},
}

// causeOf is the cause err is counted under: the producer's kinds of
// failure it matches and the innermost status it carries, such as "not
// delivered in time: READ_ONLY"; the error's text only when it has
// neither. A message id, an attempt count or an address in the text does
// not make a cause of its own.
func causeOf(err error) string {
	var parts []string
	for _, k := range producerKinds {
		if errors.Is(err, k.err) {
			parts = append(parts, k.name)
		}
	}
	if pe := innermostStatus(err); pe != nil {
		parts = append(parts, pe.Status.String())
	}
	if len(parts) == 0 {
		return err.Error()
	}
	return strings.Join(parts, ": ")
}

// innermostStatus returns the deepest *protocol.Error in err's tree (the
// first found among equally deep ones), nil if there is none.
func innermostStatus(err error) *protocol.Error {
	var found *protocol.Error
	best := -1
	var walk func(e error, depth int)
	walk = func(e error, depth int) {
		if pe, ok := e.(*protocol.Error); ok && depth > best {
			found, best = pe, depth
		}
		switch u := e.(type) {
		case interface{ Unwrap() error }:
			if n := u.Unwrap(); n != nil {
				walk(n, depth+1)
			}
		case interface{ Unwrap() []error }:
			for _, n := range u.Unwrap() {
				if n != nil {
					walk(n, depth+1)
				}
			}
		}
	}
	walk(err, 0)
	return found
}

func (s *sendErrors) add(err error) {
	cause := causeOf(err)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.causes == nil {
		s.causes = map[string]*errorCause{}
	}
	c := s.causes[cause]
	if c == nil {
		c = &errorCause{Cause: cause, Example: err.Error()}
		s.causes[cause] = c
		s.order = append(s.order, cause)
	}
	c.Count++
}

// list returns the causes, most frequent first (first seen first among
// equals).
func (s *sendErrors) list() []errorCause {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]errorCause, 0, len(s.order))
	for _, k := range s.order {
		out = append(out, *s.causes[k])
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Count > out[j].Count })
	return out
}

// sendFailures is bench's error when sends failed: how many, and the first
// few causes with their counts, one a line.
func sendFailures(res benchResult) error {
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

// startProfiles starts the CPU profile of --cpuprofile; the returned stop
// ends it and writes the allocation profile of --memprofile.
func startProfiles(o *benchOptions) (stop func() error, err error) {
	var cpu *os.File
	if o.cpuProfile != "" {
		if cpu, err = os.Create(o.cpuProfile); err != nil {
			return nil, usageError{fmt.Errorf("--cpuprofile: %w", err)}
		}
		if err := pprof.StartCPUProfile(cpu); err != nil {
			_ = cpu.Close()
			return nil, fmt.Errorf("--cpuprofile: %w", err)
		}
	}
	return func() error {
		if cpu != nil {
			pprof.StopCPUProfile()
			if err := cpu.Close(); err != nil {
				return fmt.Errorf("--cpuprofile: %w", err)
			}
		}
		if o.memProfile != "" {
			f, err := os.Create(o.memProfile)
			if err != nil {
				return fmt.Errorf("--memprofile: %w", err)
			}
			if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
				_ = f.Close()
				return fmt.Errorf("--memprofile: %w", err)
			}
			if err := f.Close(); err != nil {
				return fmt.Errorf("--memprofile: %w", err)
			}
		}
		return nil
	}, nil
}

// cpuTime is the CPU time (user and system) this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
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

func runBench(ctx context.Context, g *globalOptions, o *benchOptions, rel protocol.Reliability) (benchResult, error) {
	cl, mctx, done, err := g.metaClient(ctx)
	if err != nil {
		return benchResult{}, err
	}
	route, err := cl.CreateTopic(mctx, api.CreateTopicRequest{Name: o.topic, Queues: o.queues, IfMissing: true})
	if err != nil {
		done()
		return benchResult{}, fmt.Errorf("create topic %s: %w", o.topic, err)
	}
	var bc *benchConsumers
	var backlogFrom []api.QueueOffset
	if o.consumers > 0 {
		bc = newBenchConsumers(o, g.addrs(), g.tls.config, g.token)
		defer bc.stop()
		if o.backlog {
			// The group will start where the queues end now.
			if backlogFrom, err = queueEnds(mctx, route); err != nil {
				done()
				return benchResult{}, fmt.Errorf("read the queues' ends: %w", err)
			}
		} else if err := bc.start(ctx, route, consumer.Latest); err != nil {
			done()
			return benchResult{}, err
		}
	}
	done()

	body := make([]byte, o.size)
	for i := range body {
		body[i] = byte('a' + i%26)
	}
	var sent, errs, started atomic.Int64
	var firstErr atomic.Value
	var causes sendErrors
	hists := make([]*hdrhistogram.Histogram, o.producers)
	var hmu = make([]sync.Mutex, o.producers)
	var deadline time.Time // --duration: set when the sends start
	more := func() bool {
		if !deadline.IsZero() && !time.Now().Before(deadline) {
			return false
		}
		return o.count <= 0 || started.Add(1) <= o.count
	}
	record := func(i int, t0 time.Time, err error) {
		if err != nil {
			errs.Add(1)
			firstErr.CompareAndSwap(nil, err.Error())
			causes.add(err)
			return
		}
		sent.Add(1)
		hmu[i].Lock()
		_ = hists[i].RecordValue(time.Since(t0).Microseconds())
		hmu[i].Unlock()
	}
	producers := make([]*producer.Client, o.producers)
	for i := range producers {
		hists[i] = hdrhistogram.New(1, 60_000_000, 3)
		opts := []producer.Opt{sdk.MetaAddrs(g.addrs()...), producer.Linger(o.linger),
			producer.MaxBuffered(max(o.window, 1), 1<<30), producer.DeliveryTimeout(o.deliveryTO),
			producer.Idempotence(o.idempotence), sdk.TLS(g.tls.config), sdk.Token(g.token)}
		if o.batchBytes > 0 {
			opts = append(opts, producer.MaxBatchBytes(o.batchBytes))
		}
		if o.inflight > 0 {
			opts = append(opts, producer.MaxInflightPerGroup(o.inflight))
		}
		p, err := producer.New(opts...)
		if err != nil {
			return benchResult{}, usageError{err}
		}
		producers[i] = p
	}
	stopProgress := make(chan struct{})
	var pwg sync.WaitGroup
	if o.progress && !g.json && isTerminal(g.out) {
		pwg.Add(1)
		go func() {
			defer pwg.Done()
			progress(g.out, o, &sent, &errs, stopProgress)
		}()
	}
	stopProfile, err := startProfiles(o)
	if err != nil {
		return benchResult{}, err
	}
	start, cpu0 := time.Now(), cpuTime()
	if o.duration > 0 {
		deadline = start.Add(o.duration)
	}
	// --rate: the n-th send of a producer waits for its turn, or for the
	// deadline if that comes first, or for ctx; more() is asked after the
	// wait, so that a turn past the deadline sends nothing. The turn is
	// computed in float seconds: a low rate makes turns far off, never a
	// Duration that overflows.
	pace := func(n int64) bool { return ctx.Err() == nil }
	if o.rate > 0 {
		pace = func(n int64) bool {
			wait := float64(n)*float64(o.producers)/o.rate - time.Since(start).Seconds()
			if wait <= 0 {
				return ctx.Err() == nil
			}
			d := time.Duration(min(wait, maxBenchTime.Seconds()) * float64(time.Second))
			if !deadline.IsZero() {
				d = min(d, time.Until(deadline))
			}
			timer := time.NewTimer(d)
			defer timer.Stop()
			select {
			case <-timer.C:
				return true
			case <-ctx.Done():
				return false
			}
		}
	}
	// With a consume side every message carries its send time in its first
	// 8 bytes, for the end-to-end latency.
	stamped := func() []byte {
		if bc == nil || len(body) < 8 {
			return body
		}
		b := make([]byte, len(body))
		copy(b, body)
		binary.BigEndian.PutUint64(b, uint64(time.Now().UnixNano()))
		return b
	}
	var wg sync.WaitGroup
	for i, p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var n int64
			if o.mode == "sync" {
				for pace(n) && more() {
					n++
					t0 := time.Now()
					_, err := p.Send(ctx, &producer.Message{Topic: o.topic, Body: stamped(), Reliability: rel})
					record(i, t0, err)
				}
				return
			}
			// The producer's buffer (--window messages) bounds what is in flight:
			// SendAsync blocks until a promise frees room. A promise may still
			// be running when Flush returns (the SDK frees a message's room
			// before calling its promise), so the run ends when every promise
			// has returned. One Message serves every send: SendAsync copies
			// what it needs before it returns.
			var pending sync.WaitGroup
			m := &producer.Message{Topic: o.topic, Reliability: rel}
			for pace(n) && more() {
				n++
				t0 := time.Now()
				m.Body = stamped()
				pending.Add(1)
				p.SendAsync(ctx, m, func(_ producer.Result, err error) {
					record(i, t0, err)
					pending.Done()
				})
			}
			_ = p.Flush(ctx)
			pending.Wait()
		}()
	}
	wg.Wait()
	elapsed, cpu := time.Since(start), cpuTime()-cpu0
	if err := stopProfile(); err != nil {
		return benchResult{}, err
	}
	close(stopProgress)
	pwg.Wait()
	var retries int64
	for _, p := range producers {
		retries += p.Stats().Retries
		_ = p.Close()
	}
	h := hdrhistogram.New(1, 60_000_000, 3)
	for _, x := range hists {
		h.Merge(x)
	}
	res := benchResult{Topic: o.topic, Mode: o.mode, Reliability: rel.String(), Idempotence: o.idempotence, Producers: o.producers, Size: o.size,
		Count: o.count, DurationSeconds: o.duration.Seconds(),
		Sent: sent.Load(), Errors: errs.Load(), Seconds: elapsed.Seconds(), CPUSeconds: cpu.Seconds(), Retries: retries,
		P50Micros: h.ValueAtQuantile(50), P90Micros: h.ValueAtQuantile(90), P99Micros: h.ValueAtQuantile(99),
		P999Micros: h.ValueAtQuantile(99.9), MaxMicros: h.Max()}
	res.MsgsPerSec = float64(res.Sent) / elapsed.Seconds()
	res.MBPerSec = res.MsgsPerSec * float64(o.size) / 1e6
	if v, ok := firstErr.Load().(string); ok {
		res.FirstError = v
	}
	res.ErrorCauses = causes.list()
	if bc != nil {
		from := start
		if o.backlog {
			cl, mctx, done, err := g.metaClient(ctx)
			if err != nil {
				return res, err
			}
			_, err = cl.ResetOffsets(mctx, api.ResetOffsetsRequest{Group: bc.group, Offsets: backlogFrom, Create: true})
			done()
			if err != nil {
				return res, fmt.Errorf("start the group %s at the queues' ends before the run: %w", bc.group, err)
			}
			if err := bc.start(ctx, route, consumer.Earliest); err != nil {
				return res, err
			}
			from = time.Now() // the group is settled: its members start handling
		}
		bc.wait(ctx, res.Sent)
		res.Consume = bc.result(from, res.Sent, o.backlog)
	}
	return res, nil
}

// progress redraws one line until stop.
func progress(w io.Writer, o *benchOptions, sent, errs *atomic.Int64, stop chan struct{}) {
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	start := time.Now()
	for {
		select {
		case <-stop:
			fmt.Fprint(w, "\r\033[K")
			return
		case <-tick.C:
		}
		n := sent.Load()
		rate := float64(n) / time.Since(start).Seconds()
		if o.count > 0 {
			width := 30
			done := int(float64(width) * float64(n) / float64(o.count))
			done = min(done, width)
			fmt.Fprintf(w, "\r[%s%s] %d/%d  %.0f msgs/s  %d errors", repeat('#', done), repeat('.', width-done), n, o.count, rate, errs.Load())
		} else {
			fmt.Fprintf(w, "\r%d sent  %.0f msgs/s  %d errors  %v", n, rate, errs.Load(), time.Since(start).Round(time.Second))
		}
	}
}

func repeat(c byte, n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = c
	}
	return string(b)
}
