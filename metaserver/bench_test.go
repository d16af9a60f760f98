package metaserver_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/metaserver"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
)

// benchMeta is a one-node cluster with one group and one topic.
func benchMeta(b *testing.B) *client.Client {
	b.Helper()
	m := testcluster.StartMeta(b, 1, nil)
	cl := m.Client(b)
	ctx := context.Background()
	if _, err := cl.Heartbeat(ctx, api.Heartbeat{Group: "g1", Role: "master", BrokerID: "g1-m", Addr: "127.0.0.1:1"}); err != nil {
		b.Fatal(err)
	}
	if _, err := cl.CreateTopic(ctx, api.CreateTopicRequest{Name: "bench", Queues: 8}); err != nil {
		b.Fatal(err)
	}
	return cl
}

// parallel runs op b.N times from conc goroutines.
func parallel(b *testing.B, conc int, op func() error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(b.N) {
				if err := op(); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

func BenchmarkRouteLookup(b *testing.B) {
	for _, conc := range []int{1, 32} {
		b.Run(fmt.Sprintf("inflight=%d", conc), func(b *testing.B) {
			cl := benchMeta(b)
			ctx := context.Background()
			parallel(b, conc, func() error {
				_, err := cl.Route(ctx, "bench")
				return err
			})
		})
	}
}

func BenchmarkHeartbeat(b *testing.B) {
	cl := benchMeta(b)
	ctx := context.Background()
	var id atomic.Int64
	parallel(b, 32, func() error {
		// 64 distinct groups' masters, as a large cluster would send.
		g := fmt.Sprintf("hb%d", id.Add(1)%64)
		_, err := cl.Heartbeat(ctx, api.Heartbeat{Group: g, Role: "master", BrokerID: g + "-m", Addr: "127.0.0.1:1"})
		return err
	})
}

// BenchmarkCommitOffsets measures what committed offsets in the registry's
// Raft log cost: COMMIT_OFFSETS of 8 queues each (one Raft write per
// commit) through a real 3-node cluster, from 1 and from 16 concurrent
// committers (each a member of its own group, holding the topic's 8
// queues). It reports commits/s and the p50 and p99 latency of a commit.
func BenchmarkCommitOffsets(b *testing.B) {
	for _, conc := range []int{1, 16} {
		b.Run(fmt.Sprintf("committers=%d", conc), func(b *testing.B) {
			m := testcluster.StartMeta(b, 3, func(c *metaserver.Config) { c.ConsumerSession = 5 * time.Minute })
			cl := m.Client(b)
			ctx := context.Background()
			if _, err := cl.Heartbeat(ctx, api.Heartbeat{Group: "g1", Role: "master", BrokerID: "g1-m", Addr: "127.0.0.1:1"}); err != nil {
				b.Fatal(err)
			}
			if _, err := cl.CreateTopic(ctx, api.CreateTopicRequest{Name: "bench", Queues: 8}); err != nil {
				b.Fatal(err)
			}
			reqs := make([]api.CommitRequest, conc)
			for i := range reqs {
				group := fmt.Sprintf("bench-%d", i)
				r, err := cl.ConsumerHeartbeat(ctx, api.ConsumerHeartbeat{Group: group, Member: "m", Topics: []string{"bench"}})
				if err != nil || len(r.Assignment) != 8 {
					b.Fatalf("join: %+v, %v", r, err)
				}
				reqs[i] = api.CommitRequest{Group: group, Member: "m", Generation: r.Generation}
				for _, a := range r.Assignment {
					reqs[i].Offsets = append(reqs[i].Offsets, api.QueueOffset{Topic: a.Topic, Queue: a.Queue})
				}
			}
			var next atomic.Int64
			lat := make([][]time.Duration, conc)
			var wg sync.WaitGroup
			b.ResetTimer()
			start := time.Now()
			for w := range conc {
				wg.Add(1)
				go func() {
					defer wg.Done()
					req := reqs[w]
					for n := next.Add(1); n <= int64(b.N); n = next.Add(1) {
						for i := range req.Offsets {
							req.Offsets[i].Offset = n
						}
						t0 := time.Now()
						if _, err := cl.CommitOffsets(ctx, req); err != nil {
							b.Error(err)
							return
						}
						lat[w] = append(lat[w], time.Since(t0))
					}
				}()
			}
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			all := slices.Concat(lat...)
			slices.Sort(all)
			if len(all) == 0 {
				return
			}
			b.ReportMetric(float64(len(all))/elapsed.Seconds(), "commits/s")
			b.ReportMetric(float64(all[len(all)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-µs")
		})
	}
}
