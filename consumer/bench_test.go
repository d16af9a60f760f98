package consumer

import (
	"context"
	"fmt"
	"os"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"syscall"
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

// BenchmarkConsumeDrain drains a backlog of b.N 1 KiB messages, written
// beforehand to a topic of 8 queues on one in-process master, with one
// member and with four (Run, one handler call per message). The clock runs
// from the first message the handler gets to the last; msgs/s is over that
// span, and cpu-ns/msg is the process's CPU (user and system, every
// goroutine: the broker's reads and the members' fetches and handlers)
// over it, per message: on a shared machine, judge by that and allocs/op.
// FERRYMQ_DRAIN_CPUPROFILE=file profiles the drain alone (not the writes
// before it, which -cpuprofile includes).
func BenchmarkConsumeDrain(b *testing.B) {
	for _, members := range []int{1, 4} {
		b.Run(fmt.Sprintf("members=%d", members), func(b *testing.B) { benchDrain(b, members) })
	}
	// A prefetch smaller than the backlog: the members' buffers fill, and
	// PULLs go on as the handler makes room.
	b.Run("members=1/prefetch=4MiB", func(b *testing.B) { benchDrain(b, 1, MaxPrefetchBytes(4<<20)) })
}

func benchDrain(b *testing.B, members int, opts ...Opt) {
	e := startEnv(b, []string{"g1"}, false)
	e.cl.Meta.CreateTopic(b, "bench", "g1", "g1", "g1", "g1", "g1", "g1", "g1", "g1")
	p, err := producer.New(sdk.MetaAddrs(e.cl.MetaAddr()))
	if err != nil {
		b.Fatal(err)
	}
	body := make([]byte, 1024)
	var wg sync.WaitGroup
	var sendErr atomic.Pointer[error]
	for range b.N {
		wg.Add(1)
		p.SendAsync(context.Background(), &producer.Message{Topic: "bench", Body: body}, func(_ producer.Result, err error) {
			if err != nil {
				sendErr.CompareAndSwap(nil, &err)
			}
			wg.Done()
		})
	}
	wg.Wait()
	_ = p.Close()
	if err := sendErr.Load(); err != nil {
		b.Fatal(*err)
	}
	var (
		handled  atomic.Int64
		firstAt  atomic.Int64 // unix nanos of the first handler call
		cpuFirst atomic.Int64 // the process's CPU then
		cpuLast  int64
		lastAt   time.Time
	)
	done := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	var runs sync.WaitGroup
	var consumers []*Consumer
	if path := os.Getenv("FERRYMQ_DRAIN_CPUPROFILE"); path != "" {
		f, err := os.Create(path)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			b.Fatal(err)
		}
		defer pprof.StopCPUProfile()
	}
	b.ResetTimer()
	for i := range members {
		c, err := New("grp", []string{"bench"}, append([]Opt{sdk.MetaAddrs(e.cl.MetaAddr()), MemberID(fmt.Sprint("m", i))}, opts...)...)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		consumers = append(consumers, c)
		runs.Add(1)
		go func() {
			defer runs.Done()
			_ = c.Run(ctx, func(ctx context.Context, m *Message) error {
				n := handled.Add(1)
				if n == 1 {
					cpuFirst.Store(int64(processCPU()))
					firstAt.Store(time.Now().UnixNano())
				}
				if n == int64(b.N) {
					lastAt, cpuLast = time.Now(), int64(processCPU())
					close(done)
				}
				return nil
			})
		}()
	}
	select {
	case <-done:
	case <-time.After(5*time.Minute + time.Duration(b.N)*50*time.Microsecond):
		b.Fatalf("drained %d of %d messages", handled.Load(), b.N)
	}
	b.StopTimer()
	if b.N > 1 {
		span := lastAt.Sub(time.Unix(0, firstAt.Load()))
		b.ReportMetric(float64(b.N-1)/span.Seconds(), "msgs/s")
		b.ReportMetric(float64(cpuLast-cpuFirst.Load())/float64(b.N-1), "cpu-ns/msg")
		var fetched, fetches int64
		for _, c := range consumers {
			s := c.Stats()
			fetched, fetches = fetched+s.Messages, fetches+s.Fetches
		}
		b.ReportMetric(float64(fetched)/float64(max(1, fetches)), "msgs/pull")
	}
	cancel()
	runs.Wait()
}

// processCPU is the process's user and system CPU so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
