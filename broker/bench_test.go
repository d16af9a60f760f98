package broker_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/broker"
	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/storage"
)

// BenchmarkSend measures one master taking 1 KiB messages in batches of 64
// from 16 concurrent senders over 4 connections on loopback. b.N counts
// messages. It reports messages/s, MB/s, the p50/p99 batch latency and
// the process's CPU time per message.
//
//	go test -run '^$' -bench BenchmarkSend -benchtime 200000x ./broker
func BenchmarkSend(b *testing.B) {
	cases := []struct {
		name  string
		flush storage.FlushMode
		rel   protocol.Reliability
		slave bool
	}{
		{"normal-async", storage.FlushAsync, protocol.Normal, false},
		{"normal-sync", storage.FlushSync, protocol.Normal, false},
		{"high-async-slave", storage.FlushAsync, protocol.High, true},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			// The lease lasts the shorter of the broker's and the metaserver's
			// session: both must outlast the heartbeat interval by far.
			meta := testcluster.StartMeta(b, 1, func(c *metaserver.Config) { c.LagTime, c.SessionTimeout = time.Minute, 10*time.Second })
			g := testcluster.StartGroup(b, meta.Addrs(), "g1", testcluster.GroupOpts{Slave: tc.slave, Edit: func(c *broker.Config) {
				c.Flush = tc.flush
				c.SegmentSize = 256 << 20
				c.HeartbeatInterval = time.Second
				c.SessionTimeout = time.Minute
			}})
			meta.CreateTopic(b, "bench", "g1", "g1", "g1", "g1", "g1", "g1", "g1", "g1")
			benchSend(b, g.Master.Addr(), tc.rel, 64, 16, 4)
		})
	}
}

func benchSend(b *testing.B, addr string, rel protocol.Reliability, batchSize, senders, conns int) {
	clients := make([]*transport.Client, conns)
	for i := range clients {
		clients[i] = testcluster.Dial(b, addr)
	}
	// A fresh topic is NO_ROUTE until the broker has looked it up.
	for q := range uint32(8) {
		testwait.For(b, 5*time.Second, "the route", func() bool {
			msg := []protocol.Message{{ID: "warm", Topic: "bench", Queue: q, Reliability: rel, Timestamp: 1, Body: []byte("w")}}
			return testcluster.Send(b, clients[0], msg)[0].Status == protocol.StatusOK
		})
	}
	body := make([]byte, 1024)
	batches := (b.N + batchSize - 1) / batchSize
	var next atomic.Int64
	lat := make([][]time.Duration, senders)
	var wg sync.WaitGroup
	b.SetBytes(1024)
	b.ResetTimer()
	start, cpu0 := time.Now(), cpuTime()
	for s := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := clients[s%conns]
			msgs := make([]protocol.Message, batchSize)
			var buf []byte
			for n := next.Add(1); n <= int64(batches); n = next.Add(1) {
				for i := range msgs {
					msgs[i] = protocol.Message{ID: fmt.Sprintf("%d-%d-%d", s, n, i), Topic: "bench", Queue: uint32((int(n) + i) % 8),
						Reliability: rel, Timestamp: 1, Body: body}
				}
				buf = protocol.AppendSendRequest(buf[:0], 0, msgs)
				t0 := time.Now()
				resp, err := c.Call(context.Background(), protocol.CodeSend, buf)
				if err != nil {
					b.Error(err)
					return
				}
				lat[s] = append(lat[s], time.Since(t0))
				res, err := protocol.DecodeSendResponse(resp.Body, nil)
				if err != nil || len(res) != batchSize {
					b.Errorf("bad response: %v", err)
					return
				}
				for _, r := range res {
					if r.Status != protocol.StatusOK {
						b.Errorf("status %v", r.Status)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	elapsed, cpu := time.Since(start), cpuTime()-cpu0
	b.StopTimer()
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	slices.Sort(all)
	if len(all) > 0 {
		msgs := float64(len(all) * batchSize)
		b.ReportMetric(msgs/elapsed.Seconds(), "msgs/s")
		b.ReportMetric(float64(all[len(all)/2].Microseconds()), "p50-µs")
		b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-µs")
		// CPU per message (the broker and the senders, in this process)
		// moves less than msgs/s when other work shares the cores.
		b.ReportMetric(float64(cpu.Nanoseconds())/msgs, "cpu-ns/msg")
	}
}

// cpuTime is the CPU time (user and system) this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
