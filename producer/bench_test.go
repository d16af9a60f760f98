package producer

import (
	"context"
	"encoding/binary"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/broker"
	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
	"github.com/ferrymq/ferrymq/sdk"
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
// *-delayed: every message is due in an hour, stored pending in its
// queue's internal queue (the timer index takes each too).
func BenchmarkProduce(b *testing.B) {
	cases := []struct {
		name  string
		async bool
		rel   protocol.Reliability
		flush storage.FlushMode
		slave bool
		idem  bool
		delay bool // every message delayed by an hour: stored pending
	}{
		{"sync-1/normal/idem-on", false, protocol.Normal, storage.FlushAsync, false, true, false},
		{"sync-1/normal/idem-off", false, protocol.Normal, storage.FlushAsync, false, false, false},
		{"async/normal/idem-on", true, protocol.Normal, storage.FlushAsync, false, true, false},
		{"async/normal/idem-off", true, protocol.Normal, storage.FlushAsync, false, false, false},
		{"async/normal-flush-sync", true, protocol.Normal, storage.FlushSync, false, true, false},
		{"async/high", true, protocol.High, storage.FlushAsync, true, true, false},
		{"async/normal/delayed", true, protocol.Normal, storage.FlushAsync, false, true, true},
		{"sync-1/normal/delayed", false, protocol.Normal, storage.FlushAsync, false, true, true},
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
			var after time.Duration
			if tc.delay {
				after = time.Hour
			}
			lat := make([]time.Duration, b.N)
			b.SetBytes(1024)
			b.ResetTimer()
			start := time.Now()
			if !tc.async {
				for i := range b.N {
					t0 := time.Now()
					if _, err := p.Send(ctx, &Message{Topic: "bench", Body: body, Reliability: tc.rel, DeliverAfter: after}); err != nil {
						b.Fatal(err)
					}
					lat[i] = time.Since(t0)
				}
			} else {
				for i := range b.N {
					t0 := time.Now()
					p.SendAsync(ctx, &Message{Topic: "bench", Body: body, Reliability: tc.rel, DeliverAfter: after}, func(_ Result, err error) {
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

// BenchmarkProduceSDK measures the SDK alone: `ferryctl bench --mode async
// --producers 4 --window 1000`'s shape (1 KiB messages, each producer its
// own client and connection, 1000 messages in flight each, linger 2 ms) to
// a null broker that answers every message OK without decoding or storing
// it, with routes and identities from fakes; the first shape into a topic
// of 1000 queues; and Send one message at a time (1p-sync). b.N counts
// messages; ns/op, B/op and allocs/op are per message, and most of them are
// the SDK's.
//
//	go test -run '^$' -bench BenchmarkProduceSDK -benchtime 400000x -count 5 ./producer
func BenchmarkProduceSDK(b *testing.B) {
	for _, tc := range []struct {
		name      string
		producers int
		window    int
		queues    int
		sync      bool // Send one at a time (the window unused)
	}{
		{"4p-w1000", 4, 1000, 8, false},
		{"1p-w500", 1, 500, 8, false},
		{"4p-w1000-q1000", 4, 1000, 1000, false},
		{"1p-sync", 1, 500, 8, true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			addr := startNullBroker(b)
			rt := newFakeRoutes()
			var qs []routing.QueueRoute
			for q := range tc.queues {
				qs = append(qs, routing.QueueRoute{Queue: uint32(q), Group: "g1", Master: addr, Epoch: 1, Writable: true})
			}
			rt.set("bench", qs...)
			ps := make([]*Client, tc.producers)
			for i := range ps {
				p, err := New(sdk.MetaAddrs("127.0.0.1:1"), withRouteSource(rt), withIdentitySource(&countingIDs{}),
					MaxBuffered(tc.window, 1<<30), Linger(2*time.Millisecond))
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { _ = p.Close() })
				ps[i] = p
			}
			ctx := context.Background()
			body := make([]byte, 1024)
			var left atomic.Int64
			left.Store(int64(b.N))
			var failed atomic.Int64
			b.SetBytes(1024)
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			cpu0, csw0 := cpuTime(), switches()
			var wg sync.WaitGroup
			for _, p := range ps {
				wg.Add(1)
				go func() {
					defer wg.Done()
					m := &Message{Topic: "bench", Body: body}
					promise := func(_ Result, err error) {
						if err != nil {
							failed.Add(1)
						}
					}
					for left.Add(-1) >= 0 {
						if tc.sync {
							promise(p.Send(ctx, m))
						} else {
							p.SendAsync(ctx, m, promise)
						}
					}
					if err := p.Flush(ctx); err != nil {
						b.Error(err)
					}
				}()
			}
			wg.Wait()
			elapsed := time.Since(start)
			cpu, csw := cpuTime()-cpu0, switches()-csw0
			b.StopTimer()
			if n := failed.Load(); n > 0 {
				b.Fatalf("%d sends failed", n)
			}
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
			// CPU per message (this process: the SDK, the null broker, the
			// runtime) moves less than msgs/s when other work shares the cores.
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/msg")
			// Context switches per message: a hand-off between goroutines
			// that finds the other's thread asleep costs one.
			b.ReportMetric(float64(csw)/float64(b.N), "csw/msg")
		})
	}
}

// startNullBroker is a SEND server that answers every message of a request
// OK (reading only the request's count), as fast as it can.
func startNullBroker(tb testing.TB) string {
	tb.Helper()
	srv := transport.NewServer(transport.ServerConfig{})
	var offset atomic.Int64
	srv.Handle(protocol.CodeSend, func(r *transport.Request) {
		if len(r.Body) < protocol.SendRequestHeaderSize {
			r.ReplyError(&protocol.Error{Status: protocol.StatusInvalid, Message: "short SEND"})
			return
		}
		n := int(binary.BigEndian.Uint32(r.Body[4:8]))
		results := make([]protocol.SendResult, n)
		base := offset.Add(int64(n)) - int64(n)
		for i := range results {
			results[i] = protocol.SendResult{Status: protocol.StatusOK, QueueOffset: base + int64(i), LogOffset: (base + int64(i)) * 1100}
		}
		_ = r.Reply(protocol.AppendSendResponse(nil, results))
	})
	ln, err := srv.Listen("127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = srv.Close() })
	return ln.String()
}

// switches is how many context switches (voluntary and not) this
// process's threads have made.
func switches() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Nvcsw + ru.Nivcsw
}

// cpuTime is the CPU time (user and system) this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
