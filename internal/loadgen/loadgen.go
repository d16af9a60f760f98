package loadgen

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/ferrymq/ferrymq/consumer"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/producer"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/sdk"
)

// Result is what a run measured; ferryctl bench --json prints it as is.
type Result struct {
	Topic       string `json:"topic"`
	Mode        string `json:"mode"`
	Reliability string `json:"reliability"`
	Idempotence bool   `json:"idempotence"`
	Producers   int    `json:"producers"`
	Size        int    `json:"size"`
	// Count is the most messages the run would send (0: no limit, with a
	// duration alone); DurationSeconds the longest it would send (0: no
	// limit).
	Count           int64   `json:"count"`
	DurationSeconds float64 `json:"duration_seconds"`
	Sent            int64   `json:"sent"`
	Errors          int64   `json:"errors"`
	FirstError      string  `json:"first_error,omitempty"`
	// ErrorCauses groups the failed sends by cause, most frequent first.
	ErrorCauses []ErrorCause `json:"error_causes,omitempty"`
	Seconds     float64      `json:"seconds"`
	// CPUSeconds is the CPU time (user and system) this process used
	// while sending: producers, promises and the run's bookkeeping.
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
	// Consume is the consume side, with Config.Consumers.
	Consume *ConsumeResult `json:"consume,omitempty"`
}

// Run creates the topic if missing, sends until the count is sent, the
// duration has passed or ctx ends, and with consumers consumes what was
// sent. A Result without an error may still count failed sends (Errors,
// ErrorCauses). An error that is a *ConfigError means the run was refused
// for what it was asked.
func Run(ctx context.Context, c Config) (Result, error) {
	if err := c.Validate(); err != nil {
		return Result{}, &ConfigError{err}
	}
	o := &c
	cl, mctx, done, err := o.metaClient(ctx)
	if err != nil {
		return Result{}, err
	}
	route, err := cl.CreateTopic(mctx, api.CreateTopicRequest{Name: o.Topic, Queues: o.Queues, IfMissing: true})
	if err != nil {
		done()
		return Result{}, fmt.Errorf("create topic %s: %w", o.Topic, err)
	}
	var bc *consumers
	var backlogFrom []api.QueueOffset
	if o.Consumers > 0 {
		bc = newConsumers(o)
		defer bc.stop()
		if o.Backlog {
			// The group will start where the queues end now.
			if backlogFrom, err = o.QueueEnds(mctx, route); err != nil {
				done()
				return Result{}, fmt.Errorf("read the queues' ends: %w", err)
			}
		} else if err := bc.start(ctx, route, consumer.Latest); err != nil {
			done()
			return Result{}, err
		}
	}
	done()

	body := make([]byte, o.Size)
	for i := range body {
		body[i] = byte('a' + i%26)
	}
	var sent, errs, started atomic.Int64
	var firstErr atomic.Value
	var causes sendErrors
	hists := make([]*hdrhistogram.Histogram, o.Producers)
	var hmu = make([]sync.Mutex, o.Producers)
	var deadline time.Time // Duration: set when the sends start
	more := func() bool {
		if !deadline.IsZero() && !time.Now().Before(deadline) {
			return false
		}
		return o.Count <= 0 || started.Add(1) <= o.Count
	}
	// taken counts the messages sent that the consumers' filter takes.
	var taken atomic.Int64
	takes := func(string) bool { return true }
	if o.Filter != "" {
		f, _ := protocol.ParseFilter(o.Filter) // checked by Validate
		takes = func(tag string) bool { return f.Match(tag, func(string) (string, bool) { return "", false }) }
	}
	tagOf := func(n int64) string {
		if len(o.Tags) == 0 {
			return ""
		}
		return o.Tags[n%int64(len(o.Tags))]
	}
	record := func(i int, t0 time.Time, tag string, err error) {
		if err != nil {
			errs.Add(1)
			firstErr.CompareAndSwap(nil, err.Error())
			causes.add(err)
			return
		}
		sent.Add(1)
		if takes(tag) {
			taken.Add(1)
		}
		hmu[i].Lock()
		_ = hists[i].RecordValue(time.Since(t0).Microseconds())
		hmu[i].Unlock()
	}
	producers := make([]*producer.Client, o.Producers)
	for i := range producers {
		hists[i] = hdrhistogram.New(1, 60_000_000, 3)
		opts := []producer.Opt{sdk.MetaAddrs(o.MetaAddrs...), producer.Linger(o.Linger),
			producer.MaxBuffered(max(o.Window, 1), 1<<30), producer.DeliveryTimeout(o.DeliveryTimeout),
			producer.Idempotence(o.Idempotence), sdk.TLS(o.TLS), sdk.Token(o.Token)}
		if o.BatchBytes > 0 {
			opts = append(opts, producer.MaxBatchBytes(o.BatchBytes))
		}
		if o.MaxInflight > 0 {
			opts = append(opts, producer.MaxInflightPerGroup(o.MaxInflight))
		}
		p, err := producer.New(opts...)
		if err != nil {
			return Result{}, &ConfigError{err}
		}
		producers[i] = p
	}
	stopProgress := make(chan struct{})
	var pwg sync.WaitGroup
	if o.Progress != nil {
		pwg.Add(1)
		go func() {
			defer pwg.Done()
			progress(o.Progress, o.Count, &sent, &errs, stopProgress)
		}()
	}
	stopProfile, err := startProfiles(o)
	if err != nil {
		return Result{}, err
	}
	start, cpu0 := time.Now(), cpuTime()
	if o.Duration > 0 {
		deadline = start.Add(o.Duration)
	}
	// Rate: the n-th send of a producer waits for its turn, or for the
	// deadline if that comes first, or for ctx; more() is asked after the
	// wait, so that a turn past the deadline sends nothing. The turn is
	// computed in float seconds: a low rate makes turns far off, never a
	// Duration that overflows.
	pace := func(n int64) bool { return ctx.Err() == nil }
	if o.Rate > 0 {
		pace = func(n int64) bool {
			wait := float64(n)*float64(o.Producers)/o.Rate - time.Since(start).Seconds()
			if wait <= 0 {
				return ctx.Err() == nil
			}
			d := time.Duration(min(wait, MaxDuration.Seconds()) * float64(time.Second))
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
			rnd := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(i)))
			delay := func() time.Duration { return spreadDelay(o.DeliverAfter, o.DelaySpread, rnd) }
			var n int64
			if o.Mode == Sync {
				for pace(n) && more() {
					tag := tagOf(n)
					n++
					t0 := time.Now()
					_, err := p.Send(ctx, &producer.Message{Topic: o.Topic, Tag: tag, Body: stamped(), Reliability: o.Reliability,
						DeliverAfter: delay(), DeliverAt: o.DeliverAt})
					record(i, t0, tag, err)
				}
				return
			}
			// The producer's buffer (Window messages) bounds what is in flight:
			// SendAsync blocks until a promise frees room. A promise may still
			// be running when Flush returns (the SDK frees a message's room
			// before calling its promise), so the run ends when every promise
			// has returned. One Message serves every send: SendAsync copies
			// what it needs before it returns.
			var pending sync.WaitGroup
			m := &producer.Message{Topic: o.Topic, Reliability: o.Reliability, DeliverAfter: o.DeliverAfter, DeliverAt: o.DeliverAt}
			for pace(n) && more() {
				tag := tagOf(n)
				n++
				t0 := time.Now()
				m.Body = stamped()
				m.Tag = tag
				m.DeliverAfter = delay()
				pending.Add(1)
				p.SendAsync(ctx, m, func(_ producer.Result, err error) {
					record(i, t0, tag, err)
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
		return Result{}, err
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
	res := Result{Topic: o.Topic, Mode: string(o.Mode), Reliability: o.Reliability.String(), Idempotence: o.Idempotence, Producers: o.Producers, Size: o.Size,
		Count: o.Count, DurationSeconds: o.Duration.Seconds(),
		Sent: sent.Load(), Errors: errs.Load(), Seconds: elapsed.Seconds(), CPUSeconds: cpu.Seconds(), Retries: retries,
		P50Micros: h.ValueAtQuantile(50), P90Micros: h.ValueAtQuantile(90), P99Micros: h.ValueAtQuantile(99),
		P999Micros: h.ValueAtQuantile(99.9), MaxMicros: h.Max()}
	res.MsgsPerSec = float64(res.Sent) / elapsed.Seconds()
	res.MBPerSec = res.MsgsPerSec * float64(o.Size) / 1e6
	if v, ok := firstErr.Load().(string); ok {
		res.FirstError = v
	}
	res.ErrorCauses = causes.list()
	if bc != nil {
		if o.Backlog {
			// Every send was answered: the backlog is written, and the
			// members start now; the clock starts at their first delivery.
			cl, mctx, done, err := o.metaClient(ctx)
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
		}
		bc.wait(ctx, taken.Load())
		res.Consume = bc.result(taken.Load(), o.Backlog)
	}
	return res, nil
}

// metaClient returns a metaserver client and a context bounded by
// CallTimeout; done closes both.
func (c *Config) metaClient(ctx context.Context) (cl *client.Client, cctx context.Context, done func(), err error) {
	cl, err = client.New(client.Config{Addrs: c.MetaAddrs, CallTimeout: c.CallTimeout, Token: c.Token, Transport: transport.ClientConfig{TLS: c.TLS}})
	if err != nil {
		return nil, nil, nil, &ConfigError{err}
	}
	cctx, cancel := context.WithTimeout(ctx, c.CallTimeout)
	return cl, cctx, func() { cancel(); _ = cl.Close() }, nil
}

// startProfiles starts the CPU profile of CPUProfile; the returned stop
// ends it and writes the allocation profile of MemProfile. The errors
// name the flags of ferryctl bench, which sets these fields.
func startProfiles(o *Config) (stop func() error, err error) {
	var cpu *os.File
	if o.CPUProfile != "" {
		if cpu, err = os.Create(o.CPUProfile); err != nil {
			return nil, &ConfigError{fmt.Errorf("--cpuprofile: %w", err)}
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
		if o.MemProfile != "" {
			f, err := os.Create(o.MemProfile)
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

// progress redraws one line on w until stop: a bar toward count, or (count
// 0) what was sent so far.
func progress(w io.Writer, count int64, sent, errs *atomic.Int64, stop chan struct{}) {
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
		if count > 0 {
			width := 30
			done := int(float64(width) * float64(n) / float64(count))
			done = min(done, width)
			fmt.Fprintf(w, "\r[%s%s] %d/%d  %.0f msgs/s  %d errors", repeat('#', done), repeat('.', width-done), n, count, rate, errs.Load())
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

// spreadDelay is a message's delay: after, plus a uniformly random
// duration in [0, spread) drawn from rnd when spread is above 0.
func spreadDelay(after, spread time.Duration, rnd *rand.Rand) time.Duration {
	if spread <= 0 {
		return after
	}
	return after + time.Duration(rnd.Int64N(int64(spread)))
}
