package consumer

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/producer"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/sdk"
)

// Issue 28's retry scenario: a group of one member reads a topic of 4
// queues fed 2,000 msgs/s; 0.5% of the messages fail their first handler
// call, with the default retry backoff (1 s first). Holding the queue
// (the default), each failure stops its queue for a second, so a queue
// handles about 200 msgs/s and the group falls behind; with
// NonBlockingRetries the group keeps up and only the failed messages wait
// their second.
const (
	scenarioRate   = 2000 // msgs/s fed
	scenarioQueues = 4
	scenarioFailOf = 200 // every 200th message fails once: 0.5%
)

// scenarioSeconds is how long the feed runs: 5 s, or
// FERRYMQ_RETRY_SCENARIO_SECONDS.
func scenarioSeconds() int {
	if s, err := strconv.Atoi(os.Getenv("FERRYMQ_RETRY_SCENARIO_SECONDS")); err == nil && s > 0 {
		return s
	}
	return 5
}

// BenchmarkRetryScenario runs the scenario once per mode (b.N is not
// used: the scenario is a fixed feed) against fake brokers whose delayed
// messages are released by timers (fake), and against an in-process
// cluster (cluster; its brokers must hold delayed messages). It reports
// handled msgs/s over the run (from the first message fed to the last
// handled), the end-to-end latency (fed to handled with success) at p50,
// p99 and p99.9 (the failed messages are 0.5%), and the messages not handled within the bound (feed + 60 s).
func BenchmarkRetryScenario(b *testing.B) {
	for _, where := range []string{"fake", "cluster"} {
		for _, mode := range []string{"holding", "nonblocking"} {
			b.Run(where+"/"+mode, func(b *testing.B) {
				var opts []Opt
				if mode == "nonblocking" {
					opts = append(opts, NonBlockingRetries())
				}
				if where == "fake" {
					retryScenarioFake(b, opts...)
				} else {
					retryScenarioCluster(b, opts...)
				}
			})
		}
	}
}

// scenarioFails reports whether message i fails its first call: one in
// every scenarioFailOf, spread over the queues (message i goes to queue
// i mod 4 in the fake).
func scenarioFails(i int) bool { return i%scenarioFailOf == (i/scenarioFailOf)%scenarioQueues }

// scenarioBody is message i's body: the time it was fed (unix ns) and i.
func scenarioBody(i int, at time.Time) []byte {
	body := make([]byte, 16, 1024)
	binary.BigEndian.PutUint64(body, uint64(at.UnixNano()))
	binary.BigEndian.PutUint64(body[8:], uint64(i))
	return body[:1024]
}

// scenarioRun is one run's record.
type scenarioRun struct {
	mu      sync.Mutex
	lat     []time.Duration
	handled map[int]int // message -> successful handler calls
	calls   map[int]int // message -> handler calls
	done    chan struct{}
	n       int
	failed  atomic.Int64
}

func newScenarioRun(n int) *scenarioRun {
	return &scenarioRun{handled: map[int]int{}, calls: map[int]int{}, done: make(chan struct{}), n: n}
}

func (r *scenarioRun) handler(ctx context.Context, m *Message) error {
	fed := time.Unix(0, int64(binary.BigEndian.Uint64(m.Body)))
	i := int(binary.BigEndian.Uint64(m.Body[8:]))
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls[i]++
	if scenarioFails(i) && r.calls[i] == 1 {
		r.failed.Add(1)
		return fmt.Errorf("message %d fails its first call", i)
	}
	if r.handled[i]++; r.handled[i] == 1 {
		r.lat = append(r.lat, time.Since(fed))
		if len(r.lat) == r.n {
			close(r.done)
		}
	}
	return nil
}

// feed feeds n messages at scenarioRate, in steps of 10 ms.
func (r *scenarioRun) feed(send func(i int, body []byte)) {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	began := time.Now()
	for i := 0; i < r.n; {
		due := min(r.n, int(time.Since(began).Seconds()*scenarioRate)+1)
		for ; i < due; i++ {
			send(i, scenarioBody(i, time.Now()))
		}
		<-tick.C
	}
}

// report waits for the run's end (bounded) and reports its figures.
func (r *scenarioRun) report(b *testing.B, began time.Time, c *Consumer) {
	bound := time.Duration(scenarioSeconds())*time.Second + 60*time.Second
	select {
	case <-r.done:
	case <-time.After(bound - time.Since(began)):
	}
	took := time.Since(began)
	r.mu.Lock()
	defer r.mu.Unlock()
	lat := slices.Clone(r.lat)
	slices.Sort(lat)
	twice := 0
	for _, n := range r.handled {
		if n > 1 {
			twice++
		}
	}
	if len(lat) > 0 {
		b.ReportMetric(float64(len(lat))/took.Seconds(), "msgs/s")
		b.ReportMetric(float64(lat[len(lat)/2].Milliseconds()), "p50-ms")
		b.ReportMetric(float64(lat[len(lat)*99/100].Milliseconds()), "p99-ms")
		b.ReportMetric(float64(lat[len(lat)*999/1000].Milliseconds()), "p99.9-ms")
	}
	b.ReportMetric(float64(r.n-len(lat)), "unhandled")
	s := c.Stats()
	b.Logf("fed %d at %d/s; handled %d in %v (%d twice); %d first calls failed; stats: redeliveries %d, retries stored %d, dead letters %d",
		r.n, scenarioRate, len(lat), took.Round(time.Millisecond), twice, r.failed.Load(), s.Redeliveries, s.RetriesStored, s.DeadLetters)
}

// fakeDelayer stores messages in fake brokers the way the brokers store
// them: a delayed one is appended to its topic when due (round-robin over
// the topic's queues), any other at once.
type fakeDelayer struct {
	fb     *fakeBrokers
	queues int
	next   atomic.Uint32
	wg     sync.WaitGroup
}

func (d *fakeDelayer) DeadLetter(ctx context.Context, m *protocol.Message, key string) error {
	cp := *m
	cp.Queue = d.next.Add(1) % uint32(d.queues)
	if cp.Schedule.Kind != protocol.ScheduleDelayed {
		d.fb.addMsg(cp)
		return nil
	}
	cp.Schedule.Kind = protocol.ScheduleReleased
	d.wg.Add(1)
	time.AfterFunc(time.Until(time.UnixMilli(m.Schedule.At)), func() {
		defer d.wg.Done()
		d.fb.addMsg(cp)
	})
	return nil
}

func retryScenarioFake(b *testing.B, opts ...Opt) {
	fb := newFakeBrokers()
	co := newFakeCoord(map[string]int{"t": scenarioQueues, "%RETRY%grp": scenarioQueues})
	co.session = time.Minute
	d := &fakeDelayer{fb: fb, queues: scenarioQueues}
	defer d.wg.Wait()
	all := []Opt{withCoordinator(co), withRouter(fakeRouter{scenarioQueues}), withPuller(fb), withDeadLetterer(d),
		Session(time.Minute), AutoCommit(100 * time.Millisecond), PollWait(200 * time.Millisecond)}
	c, err := New("grp", []string{"t"}, append(all, opts...)...)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	r := newScenarioRun(scenarioSeconds() * scenarioRate)
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		_ = c.Run(ctx, r.handler)
	}()
	defer func() {
		cancel()
		<-ran
	}()
	began := time.Now()
	r.feed(func(i int, body []byte) {
		fb.addMsg(protocol.Message{ID: strconv.Itoa(i), Topic: "t", Queue: uint32(i % scenarioQueues), Timestamp: time.Now().UnixMilli(), Body: body})
	})
	r.report(b, began, c)
}

func retryScenarioCluster(b *testing.B, opts ...Opt) {
	e := startEnv(b, []string{"g1"}, false)
	e.cl.Meta.CreateTopic(b, "feed", "g1", "g1", "g1", "g1")
	p, err := producer.New(sdk.MetaAddrs(e.cl.MetaAddr()))
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	c := e.consumer(b, "grp", []string{"feed"}, append([]Opt{RetryBackoff(time.Second, 30*time.Second), Session(time.Minute),
		Heartbeat(time.Second)}, opts...)...)
	r := newScenarioRun(scenarioSeconds() * scenarioRate)
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		_ = c.Run(ctx, r.handler)
	}()
	defer func() {
		cancel()
		<-ran
	}()
	// Wait for the member to hold the topic's queues (and, with the
	// option, the retry topic's) before feeding.
	want := scenarioQueues
	if c.cfg.nonBlocking {
		want *= 2
	}
	waitFor(b, 20*time.Second, "the member to hold its queues", func() bool { return len(queuesOf(c)) == want })
	var sendErr atomic.Pointer[error]
	var sends sync.WaitGroup
	began := time.Now()
	r.feed(func(i int, body []byte) {
		sends.Add(1)
		p.SendAsync(context.Background(), &producer.Message{Topic: "feed", Body: body}, func(_ producer.Result, err error) {
			if err != nil {
				sendErr.CompareAndSwap(nil, &err)
			}
			sends.Done()
		})
	})
	sends.Wait()
	if err := sendErr.Load(); err != nil {
		b.Fatal(*err)
	}
	r.report(b, began, c)
}
