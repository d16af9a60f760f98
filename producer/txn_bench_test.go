package producer

import (
	"cmp"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/ferrymq/ferrymq/broker"
	"github.com/ferrymq/ferrymq/internal/clientcore"
	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/protocol"
)

// BenchmarkTxn measures transactions end to end, producer SDK to broker
// groups of a master and a slave on loopback, 1 KiB messages:
//
//	go test -run '^$' -bench BenchmarkTxn -benchtime 300x -count 3 ./producer
//
// batch-100xN/plain: N producers at once, each 100 SendAsync then Flush,
// b.N times (msgs/s); batch-100xN/txn: the same 100 in a transaction, then
// Commit (msgs/s: the cost of a transaction of 100 against 100 plain
// sends; a commit waits for the slave, as HIGH, so one producer alone pays
// that round trip per transaction, and four overlap them);
// batch-100xN/plain-high: the plain sends at HIGH, which wait for the
// slave as a commit does. commit/one-group: a transaction of one message,
// Commit's latency (one TXN_END: the decision mark and the slave's copy
// of it); commit/two-groups: one message keyed to each of two groups,
// Commit's latency (two prepares, the registry's Raft write, two TXN_ENDs)
// and transactions per second, one at a time.
func BenchmarkTxn(b *testing.B) {
	c := testcluster.Start(b, testcluster.Opts{Groups: []string{"g1", "g2"}, Slaves: true, MetaEdit: testcluster.SteadyMeta,
		BrokerEdit: func(cfg *broker.Config) {
			testcluster.SteadyBroker(cfg)
			cfg.SegmentSize, cfg.HAFetchWait = 256<<20, 20*time.Millisecond
		}})
	c.Meta.CreateTopic(b, "one", "g1", "g1", "g1", "g1")
	c.Meta.CreateTopic(b, "two", "g1", "g2")
	body := make([]byte, 1024)
	ctx := context.Background()
	// batch runs b.N rounds on each of n producers at once: 100 messages,
	// then a Flush or, in a transaction, the Commit.
	batch := func(b *testing.B, n int, txn bool, rel protocol.Reliability) {
		ps := make([]*Client, n)
		for i := range ps {
			ps[i] = newProducer(b, c, Identity(fmt.Sprint("bench-", txn, "-", i)))
		}
		round := func(p *Client) error {
			send := p.SendAsync
			var t *Txn
			if txn {
				var err error
				if t, err = p.BeginTxn(ctx); err != nil {
					return err
				}
				send = t.SendAsync
			}
			var wg sync.WaitGroup
			var failed error
			var mu sync.Mutex
			wg.Add(100)
			for range 100 {
				send(ctx, &Message{Topic: "one", Body: body, Reliability: rel}, func(_ Result, err error) {
					if err != nil {
						mu.Lock()
						failed = err
						mu.Unlock()
					}
					wg.Done()
				})
			}
			var err error
			if txn {
				err = t.Commit(ctx)
			} else {
				err = p.Flush(ctx)
			}
			wg.Wait()
			return cmp.Or(err, failed)
		}
		for _, p := range ps { // warm: routes, identities, connections
			if err := round(p); err != nil {
				b.Fatal(err)
			}
		}
		b.ResetTimer()
		start := time.Now()
		var wg sync.WaitGroup
		for _, p := range ps {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range b.N {
					if err := round(p); err != nil {
						b.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		b.ReportMetric(float64(100*n*b.N)/time.Since(start).Seconds(), "msgs/s")
	}
	for _, n := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("batch-100x%d/plain", n), func(b *testing.B) { batch(b, n, false, protocol.Normal) })
		b.Run(fmt.Sprintf("batch-100x%d/plain-high", n), func(b *testing.B) { batch(b, n, false, protocol.High) })
		b.Run(fmt.Sprintf("batch-100x%d/txn", n), func(b *testing.B) { batch(b, n, true, protocol.Normal) })
	}

	commits := func(b *testing.B, keys []string) {
		p := newProducer(b, c, Identity(fmt.Sprint("commit-", len(keys))), Linger(0))
		h := hdrhistogram.New(1, int64(time.Minute/time.Microsecond), 3)
		b.ResetTimer()
		start := time.Now()
		for range b.N {
			t, err := p.BeginTxn(ctx)
			if err != nil {
				b.Fatal(err)
			}
			for _, k := range keys {
				if _, err := t.Send(ctx, &Message{Topic: "two", Key: k, Body: body}); err != nil {
					b.Fatal(err)
				}
			}
			at := time.Now()
			if err := t.Commit(ctx); err != nil {
				b.Fatal(err)
			}
			_ = h.RecordValue(time.Since(at).Microseconds())
		}
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "txn/s")
		b.ReportMetric(float64(h.ValueAtQuantile(50)), "commit-p50-µs")
		b.ReportMetric(float64(h.ValueAtQuantile(99)), "commit-p99-µs")
	}
	b.Run("commit/one-group", func(b *testing.B) { commits(b, []string{"a"}) })
	b.Run("commit/two-groups", func(b *testing.B) { commits(b, twoGroupKeys(b)) })
}

// twoGroupKeys are two keys whose queues of topic "two" (queue 0 on g1,
// queue 1 on g2) differ.
func twoGroupKeys(b *testing.B) []string {
	var keys []string
	seen := map[uint32]bool{}
	for i := 0; len(keys) < 2 && i < 100; i++ {
		k := fmt.Sprint("k", i)
		if q := clientcore.KeyHash(k) % 2; !seen[q] {
			seen[q] = true
			keys = append(keys, k)
		}
	}
	if len(keys) != 2 {
		b.Fatal("no two keys on two queues")
	}
	return keys
}
