package loadgen

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/ferrymq/ferrymq/consumer"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/routing"
	"github.com/ferrymq/ferrymq/sdk"
)

// ConsumeResult is the consume side of a run.
type ConsumeResult struct {
	Group     string `json:"group"`
	Consumers int    `json:"consumers"`
	Backlog   bool   `json:"backlog"`
	Consumed  int64  `json:"consumed"`
	// Missing counts messages sent and not consumed when the run stopped
	// waiting (ConsumeWait without progress).
	Missing int64 `json:"missing"`
	// Seconds runs from the first message the SDK delivered to a member's
	// handler to the last one handled, over every member; MsgsPerSec is
	// Consumed/Seconds. With Backlog the members start after every send
	// was answered, so the clock starts at the backlog's first delivery.
	Seconds    float64 `json:"seconds"`
	MsgsPerSec float64 `json:"msgs_per_sec"`
	MBPerSec   float64 `json:"mb_per_sec"`
	// FirstDelivery and LastDelivery bound Seconds.
	FirstDelivery time.Time `json:"first_delivery"`
	LastDelivery  time.Time `json:"last_delivery"`
	// SettleSeconds is the part of Seconds the handlers waited, after the
	// first delivery, for the group to settle (every member in one
	// generation with its queues; see consumers.start): the SDK goes on
	// fetching meanwhile, and what it fetched is handled when it settles.
	SettleSeconds float64 `json:"settle_seconds"`
	// Members is each member's share, from its first delivery to its last.
	Members []MemberResult `json:"members"`
	// End-to-end latency: from just before the producer's send (a time in
	// the body's first 8 bytes; the producer's millisecond timestamp for
	// bodies under 8 bytes) to the handler. With Backlog it includes the
	// time spent in the backlog.
	P50Micros  int64 `json:"e2e_p50_us"`
	P90Micros  int64 `json:"e2e_p90_us"`
	P99Micros  int64 `json:"e2e_p99_us"`
	P999Micros int64 `json:"e2e_p999_us"`
	MaxMicros  int64 `json:"e2e_max_us"`
}

// MemberResult is one member's part of a ConsumeResult.
type MemberResult struct {
	Member     string  `json:"member"`
	Consumed   int64   `json:"consumed"`
	Seconds    float64 `json:"seconds"`
	MsgsPerSec float64 `json:"msgs_per_sec"`
}

// delivery is one member's count and the times (unix ns, 0: none yet) of
// its first delivery and of the end of its last handled batch.
type delivery struct {
	consumed, first, last atomic.Int64
}

// consumers is the consumer group of a run.
type consumers struct {
	o        *Config
	group    string
	cs       []*consumer.Consumer
	hists    []*hdrhistogram.Histogram
	hmu      []sync.Mutex
	consumed atomic.Int64
	members  []delivery
	gated    atomic.Int64  // unix ns when gate closed
	gate     chan struct{} // closed once the group is settled: handlers wait for it
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	errs     chan error
}

func newConsumers(o *Config) *consumers {
	group := o.Group
	if group == "" {
		group = fmt.Sprintf("ferryctl-bench-%d", time.Now().UnixNano())
	}
	return &consumers{o: o, group: group, errs: make(chan error, o.Consumers)}
}

// start starts the members and waits until every queue of route has a
// member that knows where it starts.
func (b *consumers) start(ctx context.Context, route routing.Route, start consumer.Start) error {
	rctx, cancel := context.WithCancel(context.Background())
	b.cancel = cancel
	b.cs = make([]*consumer.Consumer, b.o.Consumers)
	b.hists = make([]*hdrhistogram.Histogram, b.o.Consumers)
	b.hmu = make([]sync.Mutex, b.o.Consumers)
	b.members = make([]delivery, b.o.Consumers)
	b.gate = make(chan struct{})
	for i := range b.cs {
		c, err := consumer.New(b.group, []string{b.o.Topic}, sdk.MetaAddrs(b.o.MetaAddrs...), consumer.StartFrom(start),
			consumer.MemberID(fmt.Sprintf("bench-%d", i)), consumer.Heartbeat(500*time.Millisecond), consumer.Session(5*time.Second), sdk.TLS(b.o.TLS), sdk.Token(b.o.Token),
			consumer.Filter(b.o.Filter))
		if err != nil {
			return &ConfigError{err}
		}
		b.cs[i] = c
		b.hists[i] = hdrhistogram.New(1, 60_000_000, 3)
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			d := &b.members[i]
			err := c.RunBatch(rctx, func(hctx context.Context, msgs []*consumer.Message) error {
				// The SDK delivered: the member's clock starts here, before
				// the gate, so that what the SDK fetched while the group
				// settled is not counted as handled in no time.
				d.first.CompareAndSwap(0, time.Now().UnixNano())
				// Until every member has joined, a rebalance may move a queue
				// and deliver its messages again: nothing is handled before.
				select {
				case <-b.gate:
				case <-hctx.Done():
					return hctx.Err()
				}
				now := time.Now()
				b.hmu[i].Lock()
				for _, m := range msgs {
					var lat time.Duration
					if len(m.Body) >= 8 {
						lat = now.Sub(time.Unix(0, int64(binary.BigEndian.Uint64(m.Body))))
					} else {
						lat = now.Sub(m.Timestamp)
					}
					_ = b.hists[i].RecordValue(max(lat.Microseconds(), 1))
				}
				b.hmu[i].Unlock()
				d.consumed.Add(int64(len(msgs)))
				b.consumed.Add(int64(len(msgs)))
				d.last.Store(time.Now().UnixNano())
				return nil
			})
			if err != nil && rctx.Err() == nil {
				b.errs <- err
			}
		}()
	}
	// Wait until every member is in the same generation, the group holds
	// every queue and knows each one's start (so a live run consumes every
	// message sent), and every member has a queue when there are enough.
	deadline := time.Now().Add(30 * time.Second)
	for {
		ready, settled := 0, true
		var gen uint64
		for i, c := range b.cs {
			st := c.Stats()
			if i == 0 {
				gen = st.Generation
			}
			held := 0
			for _, q := range st.Queues {
				if q.Topic == b.o.Topic && q.Processed >= 0 {
					held++
				}
			}
			ready += held
			settled = settled && st.Generation == gen && gen > 0 && (held > 0 || len(b.cs) > len(route.Queues))
		}
		if settled && ready == len(route.Queues) {
			b.gated.Store(time.Now().UnixNano())
			close(b.gate)
			return nil
		}
		select {
		case err := <-b.errs:
			return fmt.Errorf("consumer: %w", err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Millisecond): // part of SettleSeconds
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the consumer group %s holds %d of the %d queues of %s after 30s", b.group, ready, len(route.Queues), b.o.Topic)
		}
	}
}

// wait waits until want messages were consumed, or no message came for
// ConsumeWait, and stops the members.
func (b *consumers) wait(ctx context.Context, want int64) {
	lastN, lastAt := int64(-1), time.Now()
	for b.consumed.Load() < want && ctx.Err() == nil {
		if n := b.consumed.Load(); n != lastN {
			lastN, lastAt = n, time.Now()
		} else if time.Since(lastAt) > b.o.ConsumeWait {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	b.stop()
}

func (b *consumers) stop() {
	if b.cancel == nil {
		return
	}
	b.cancel()
	for _, c := range b.cs {
		if c != nil {
			_ = c.Close()
		}
	}
	b.wg.Wait()
	b.cancel = nil
	if b.o.Group == "" {
		// The run's own group: its members left as they closed.
		if mc, err := client.New(client.Config{Addrs: b.o.MetaAddrs, Token: b.o.Token, Transport: transport.ClientConfig{TLS: b.o.TLS}}); err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = mc.DeleteConsumerGroup(ctx, b.group)
			cancel()
			_ = mc.Close()
		}
	}
}

func (b *consumers) result(sent int64, backlog bool) *ConsumeResult {
	h := hdrhistogram.New(1, 60_000_000, 3)
	for i, x := range b.hists {
		b.hmu[i].Lock()
		h.Merge(x)
		b.hmu[i].Unlock()
	}
	r := &ConsumeResult{Group: b.group, Consumers: b.o.Consumers, Backlog: backlog, Consumed: b.consumed.Load(),
		P50Micros: h.ValueAtQuantile(50), P90Micros: h.ValueAtQuantile(90), P99Micros: h.ValueAtQuantile(99),
		P999Micros: h.ValueAtQuantile(99.9), MaxMicros: h.Max()}
	r.Missing = max(sent-r.Consumed, 0)
	var first, last int64
	for i := range b.members {
		d := &b.members[i]
		m := MemberResult{Member: b.cs[i].MemberID(), Consumed: d.consumed.Load()}
		f, l := d.first.Load(), d.last.Load()
		if f > 0 && l > f {
			m.Seconds = time.Duration(l - f).Seconds()
			m.MsgsPerSec = float64(m.Consumed) / m.Seconds
			if first == 0 || f < first {
				first = f
			}
			last = max(last, l)
		}
		r.Members = append(r.Members, m)
	}
	if first > 0 {
		r.FirstDelivery, r.LastDelivery = time.Unix(0, first), time.Unix(0, last)
		r.Seconds = r.LastDelivery.Sub(r.FirstDelivery).Seconds()
		r.SettleSeconds = max(time.Duration(b.gated.Load()-first).Seconds(), 0)
		r.MsgsPerSec = float64(r.Consumed) / r.Seconds
		r.MBPerSec = r.MsgsPerSec * float64(b.o.Size) / 1e6
	}
	return r
}
