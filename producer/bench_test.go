package producer

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/broker"
	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/storage"
)

// BenchmarkProduce measures end to end, producer SDK to one broker group on
// loopback, 1 KiB messages; b.N counts messages.
//
//	go test -run '^$' -bench BenchmarkProduce -benchtime 100000x ./producer
//
// sync-1: Send one at a time (p50/p99 per message). async-*: SendAsync with
// batching, then Flush (p50/p99 from send to promise). idem-on (the
// default) stamps messages and the broker checks them; idem-off does not.
func BenchmarkProduce(b *testing.B) {
	cases := []struct {
		name  string
		async bool
		rel   protocol.Reliability
		flush storage.FlushMode
		slave bool
		idem  bool
	}{
		{"sync-1/normal/idem-on", false, protocol.Normal, storage.FlushAsync, false, true},
		{"sync-1/normal/idem-off", false, protocol.Normal, storage.FlushAsync, false, false},
		{"async/normal/idem-on", true, protocol.Normal, storage.FlushAsync, false, true},
		{"async/normal/idem-off", true, protocol.Normal, storage.FlushAsync, false, false},
		{"async/normal-flush-sync", true, protocol.Normal, storage.FlushSync, false, true},
		{"async/high", true, protocol.High, storage.FlushAsync, true, true},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			// The old harness's broker settings: 256 MiB segments (1 MiB ones
			// would roll every thousand messages) and 20 ms HA fetch waits.
			c := testcluster.Start(b, testcluster.Opts{Groups: []string{"g1"}, Slaves: tc.slave, MetaEdit: testcluster.SteadyMeta,
				BrokerEdit: func(cfg *broker.Config) {
					testcluster.SteadyBroker(cfg)
					cfg.SegmentSize, cfg.HAFetchWait, cfg.Flush = 256<<20, 20*time.Millisecond, tc.flush
				}})
			c.Meta.CreateTopic(b, "bench", "g1", "g1", "g1", "g1", "g1", "g1", "g1", "g1")
			p := newProducer(b, c, MaxBuffered(50_000, 256<<20), Idempotence(tc.idem))
			ctx := context.Background()
			body := make([]byte, 1024)
			lat := make([]time.Duration, b.N)
			b.SetBytes(1024)
			b.ResetTimer()
			start := time.Now()
			if !tc.async {
				for i := range b.N {
					t0 := time.Now()
					if _, err := p.Send(ctx, &Message{Topic: "bench", Body: body, Reliability: tc.rel}); err != nil {
						b.Fatal(err)
					}
					lat[i] = time.Since(t0)
				}
			} else {
				for i := range b.N {
					t0 := time.Now()
					p.SendAsync(ctx, &Message{Topic: "bench", Body: body, Reliability: tc.rel}, func(_ Result, err error) {
						if err != nil {
							b.Error(err)
						}
						lat[i] = time.Since(t0)
					})
				}
				if err := p.Flush(ctx); err != nil {
					b.Fatal(err)
				}
			}
			elapsed := time.Since(start)
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		})
	}
}
