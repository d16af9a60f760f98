package metaserver_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ferrymq/ferrymq/internal/testcluster"
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
