package broker_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/metaserver"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
	"github.com/ferrymq/ferrymq/storage"
)

// BenchmarkSendOne measures the latency of one SEND at a time: one 1 KiB
// stamped NORMAL message per request from one connection on loopback, to a
// master with flush=async and no slave (the shape of `ferryctl bench --mode
// sync --producers 1`, without the producer SDK). It reports the p50, p90
// and p99 round trip; b.N counts messages. With broker=process the master
// runs in a child process, as in production: a hand-off between goroutines
// then often costs a thread wake-up, which an in-process run (broker=inproc,
// where the caller's goroutines keep the runtime's threads busy) hides.
//
//	go test -run '^$' -bench BenchmarkSendOne -benchtime 20000x ./broker
func BenchmarkSendOne(b *testing.B) {
	for _, child := range []bool{true, false} {
		name := "broker=process"
		if !child {
			name = "broker=inproc"
		}
		b.Run(name, func(b *testing.B) {
			meta := testcluster.StartMeta(b, 1, func(c *metaserver.Config) { c.LagTime, c.SessionTimeout = time.Minute, 10*time.Second })
			cfg := testcluster.BrokerConfig(meta.Addrs(), "g1", routing.RoleMaster, b.TempDir())
			cfg.Flush = storage.FlushAsync
			cfg.SegmentSize = 256 << 20
			cfg.HeartbeatInterval = time.Second
			cfg.SessionTimeout = 10 * time.Second
			var addr string
			if child {
				addr, _ = startChild(b, cfg)
			} else {
				addr = testcluster.StartBroker(b, cfg).Addr()
			}
			testwait.For(b, 10*time.Second, "the broker to register", func() bool { _, ok := meta.Nodes[0].FSM().Group("g1"); return ok })
			meta.CreateTopic(b, "bench", "g1")
			benchSendOne(b, addr)
		})
	}
}

func benchSendOne(b *testing.B, addr string) {
	c := testcluster.Dial(b, addr)
	// A fresh topic is NO_ROUTE until the broker has looked it up.
	testwait.For(b, 10*time.Second, "the broker to take writes", func() bool {
		msg := []protocol.Message{{ID: "warm", Topic: "bench", Timestamp: 1, Body: []byte("w")}}
		return testcluster.Send(b, c, msg)[0].Status == protocol.StatusOK
	})
	body := make([]byte, 1024)
	msgs := []protocol.Message{{Topic: "bench", Reliability: protocol.Normal, Timestamp: 1, Body: body,
		Producer: protocol.ProducerStamp{ID: 7, Epoch: 1}}}
	var buf []byte
	lat := make([]time.Duration, 0, b.N)
	b.SetBytes(1024)
	b.ResetTimer()
	for i := range b.N {
		msgs[0].ID = fmt.Sprint(i)
		msgs[0].Producer.Seq = int64(i)
		buf = protocol.AppendSendRequest(buf[:0], 0, msgs)
		t0 := time.Now()
		resp, err := c.Call(context.Background(), protocol.CodeSend, buf)
		lat = append(lat, time.Since(t0))
		if err != nil {
			b.Fatal(err)
		}
		if res, err := protocol.DecodeSendResponse(resp.Body, nil); err != nil || res[0].Status != protocol.StatusOK {
			b.Fatalf("message %d of %d: answer %v, %v", i, b.N, res, err)
		}
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*9/10].Nanoseconds())/1e3, "p90-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-µs")
}
