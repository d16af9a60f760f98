package consumer

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/producer"
	"github.com/ferrymq/ferrymq/sdk"
)

// BenchmarkConsume drains a backlog of b.N 1 KiB messages from 8 queues
// with a group of 4 members (Run, one handler call per message).
func BenchmarkConsume(b *testing.B) {
	e := startEnv(b, []string{"g1"}, false)
	e.cl.Meta.CreateTopic(b, "bench", "g1", "g1", "g1", "g1", "g1", "g1", "g1", "g1")
	p, err := producer.New(sdk.MetaAddrs(e.cl.MetaAddr()))
	if err != nil {
		b.Fatal(err)
	}
	body := make([]byte, 1024)
	var wg sync.WaitGroup
	for range b.N {
		wg.Add(1)
		p.SendAsync(context.Background(), &producer.Message{Topic: "bench", Body: body}, func(producer.Result, error) { wg.Done() })
	}
	wg.Wait()
	_ = p.Close()
	var handled atomic.Int64
	done := make(chan struct{})
	b.ResetTimer()
	began := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	var runs sync.WaitGroup
	for i := range 4 {
		c, err := New("grp", []string{"bench"}, sdk.MetaAddrs(e.cl.MetaAddr()), MemberID(fmt.Sprint("m", i)))
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		runs.Add(1)
		go func() {
			defer runs.Done()
			_ = c.Run(ctx, func(ctx context.Context, m *Message) error {
				if handled.Add(1) == int64(b.N) {
					close(done)
				}
				return nil
			})
		}()
	}
	<-done
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(began).Seconds(), "msgs/s")
	cancel()
	runs.Wait()
}
