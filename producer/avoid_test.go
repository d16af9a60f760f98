package producer

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// fakeBroker answers SEND like a broker: OK for every message, after a
// delay, or BUSY while it is failing. It heartbeats to the metaserver so the
// route points at it.
type fakeBroker struct {
	srv     *transport.Server
	delay   atomic.Int64 // nanoseconds
	failing atomic.Bool
	batches atomic.Int64
	msgs    atomic.Int64
	stop    chan struct{}
	done    chan struct{}
}

func startFakeBroker(t *testing.T, meta string, group string) *fakeBroker {
	t.Helper()
	f := &fakeBroker{srv: transport.NewServer(transport.ServerConfig{}), stop: make(chan struct{}), done: make(chan struct{})}
	var offset atomic.Int64
	f.srv.Handle(protocol.CodeSend, func(r *transport.Request) {
		msgs, err := protocol.DecodeSendRequest(r.Body, nil)
		if err != nil {
			r.ReplyError(err)
			return
		}
		f.batches.Add(1)
		reply := func() {
			if f.failing.Load() {
				r.ReplyError(&protocol.Error{Status: protocol.StatusBusy, Message: "fake broker failing"})
				return
			}
			f.msgs.Add(int64(len(msgs)))
			res := make([]protocol.SendResult, len(msgs))
			for i := range res {
				res[i] = protocol.SendResult{Status: protocol.StatusOK, QueueOffset: offset.Add(1), LogOffset: 0}
			}
			_ = r.Reply(protocol.AppendSendResponse(nil, res))
		}
		if d := time.Duration(f.delay.Load()); d > 0 {
			time.AfterFunc(d, reply)
			return
		}
		reply()
	})
	addr, err := f.srv.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cl, err := client.New(client.Config{Addrs: []string{meta}})
	if err != nil {
		t.Fatal(err)
	}
	hb := api.Heartbeat{Group: group, Role: "master", BrokerID: group, Addr: addr.String()}
	if _, err := cl.Heartbeat(context.Background(), hb); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(f.done)
		defer cl.Close()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-f.stop:
				return
			case <-tick.C:
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				_, _ = cl.Heartbeat(ctx, hb)
				cancel()
			}
		}
	}()
	t.Cleanup(func() {
		close(f.stop)
		<-f.done
		_ = f.srv.Close()
	})
	return f
}

// TestAvoidanceMovesAwayAndBack runs each policy against two fake groups:
// while g1 fails, sends move to g2; once g1 recovers, they come back.
func TestAvoidanceMovesAwayAndBack(t *testing.T) {
	policies := map[string]func() routing.Avoider{
		"latency-table": func() routing.Avoider {
			// RocketMQ's table, shrunk: a failure avoids a group for 300 ms.
			return &routing.LatencyTable{
				Latencies: []time.Duration{50 * time.Millisecond, 100 * time.Millisecond},
				Durations: []time.Duration{100 * time.Millisecond, 300 * time.Millisecond},
			}
		},
		"decaying-latency": func() routing.Avoider {
			d := routing.NewDecayingLatency()
			d.HalfLife = 50 * time.Millisecond
			d.Slack = 5 * time.Millisecond // loopback jitter under -race is not a slow group
			return d
		},
	}
	for name, policy := range policies {
		t.Run(name, func(t *testing.T) {
			c := startCluster(t, clusterOpts{dirs: t.TempDir})
			g1 := startFakeBroker(t, c.meta.RPCAddr(), "g1")
			g2 := startFakeBroker(t, c.meta.RPCAddr(), "g2")
			c.createTopic(t, "avoid", "g1", "g2", "g1", "g2")
			p := newProducer(t, c, Avoider(policy()), RetryBackoff(5*time.Millisecond), Linger(0))
			ctx := context.Background()
			sendN := func(n int) (g1Share float64) {
				b1 := g1.msgs.Load()
				b2 := g2.msgs.Load()
				var wg sync.WaitGroup
				for range 4 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for range n / 4 {
							if _, err := p.Send(ctx, &Message{Topic: "avoid", Body: []byte("x")}); err != nil {
								t.Error(err)
								return
							}
							time.Sleep(time.Millisecond)
						}
					}()
				}
				wg.Wait()
				d1, d2 := g1.msgs.Load()-b1, g2.msgs.Load()-b2
				return float64(d1) / float64(d1+d2)
			}
			healthy := sendN(200)
			g1.failing.Store(true)
			tried := g1.batches.Load()
			failingShare := sendN(200)
			triedWhileFailing := g1.batches.Load() - tried
			g1.failing.Store(false)
			time.Sleep(400 * time.Millisecond) // past the avoidance window
			recovered := sendN(400)
			t.Logf("%s: g1's share healthy %.2f, failing %.2f, recovered %.2f (batches tried on g1 while failing: %d)", name, healthy, failingShare, recovered, triedWhileFailing)
			if healthy < 0.2 {
				t.Fatalf("healthy g1 got only %.2f of the sends", healthy)
			}
			if failingShare != 0 || triedWhileFailing > 20 {
				t.Fatalf("while g1 failed it stored %.2f of the sends and was tried %d times for 200 sends", failingShare, triedWhileFailing)
			}
			if recovered < 0.2 {
				t.Fatalf("after recovering, g1 got only %.2f of the sends", recovered)
			}
		})
	}
}

// TestSlowGroupIsAvoided: a group answering in 60 ms gets far fewer sends
// than a fast one, under both policies.
func TestSlowGroupIsAvoided(t *testing.T) {
	for _, name := range []string{"latency-table", "decaying-latency"} {
		t.Run(name, func(t *testing.T) {
			var a routing.Avoider = &routing.LatencyTable{
				Latencies: []time.Duration{50 * time.Millisecond}, Durations: []time.Duration{time.Second},
			}
			if name == "decaying-latency" {
				a = routing.NewDecayingLatency()
			}
			c := startCluster(t, clusterOpts{dirs: t.TempDir})
			slow := startFakeBroker(t, c.meta.RPCAddr(), "slow")
			startFakeBroker(t, c.meta.RPCAddr(), "fast")
			slow.delay.Store(int64(60 * time.Millisecond))
			c.createTopic(t, "slowfast", "slow", "fast")
			p := newProducer(t, c, Avoider(a), Linger(0))
			for i := range 100 {
				if _, err := p.Send(context.Background(), &Message{Topic: "slowfast", Body: []byte(fmt.Sprint(i))}); err != nil {
					t.Fatal(err)
				}
			}
			t.Logf("%s: slow group took %d of 100 sends", name, slow.msgs.Load())
			if slow.msgs.Load() > 10 {
				t.Fatalf("the slow group took %d of 100 sends", slow.msgs.Load())
			}
		})
	}
}
