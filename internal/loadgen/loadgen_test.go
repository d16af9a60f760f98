package loadgen

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// config is a run against meta with ferryctl bench's defaults, 16-byte
// bodies and 2 queues.
func config(meta, topic string) Config {
	return Config{
		MetaAddrs: []string{meta}, CallTimeout: 5 * time.Second,
		Topic: topic, Queues: 2, Producers: 1, Size: 16, Count: 100000, Mode: Async, Window: 1000,
		Reliability: protocol.Normal, DeliveryTimeout: 30 * time.Second, Linger: 2 * time.Millisecond, Idempotence: true,
		ConsumeWait: 10 * time.Second,
	}
}

// TestValidate: a config that cannot run is refused before any network
// call, with every problem named at once, as a *ConfigError.
func TestValidate(t *testing.T) {
	c := Config{Mode: "fast", Linger: time.Second, DeliveryTimeout: time.Second, Backlog: true, Rate: -1, DelaySpread: -time.Second,
		Tags: []string{"ok", "no tag"}, Filter: "A ||"}
	res, err := Run(context.Background(), c)
	var ce *ConfigError
	if !errors.As(err, &ce) || res.Sent != 0 {
		t.Fatalf("Run of an invalid config: %+v, %v; want a *ConfigError", res, err)
	}
	for _, want := range []string{"no metaserver address", "no topic", "0 queues", "0 producers", "the run would not end",
		"rate -1", "delay spread -1s", `mode "fast"`, "linger 1s must be shorter", "a backlog run needs consumers", "a backlog run needs QueueEnds",
		"tag:", "filter:"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
	ok := config("127.0.0.1:1", "t")
	if err := ok.Validate(); err != nil {
		t.Fatalf("a valid config: %v", err)
	}
	spread := ok
	spread.DelaySpread = time.Hour
	if err := spread.Validate(); err == nil || !strings.Contains(err.Error(), "only with a deliver-after delay") {
		t.Errorf("a spread without a delay: %v; want it refused", err)
	}
	spread.DeliverAfter = time.Minute
	if err := spread.Validate(); err != nil {
		t.Errorf("a spread with a delay: %v", err)
	}
}

// TestSpreadDelay: with a spread, every delay lies in [after,
// after+spread) and the draws cover the span (each tenth of it is hit);
// without one the delay is after.
func TestSpreadDelay(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	if d := spreadDelay(time.Minute, 0, rnd); d != time.Minute {
		t.Fatalf("no spread: %v, want 1m", d)
	}
	after, spread := time.Minute, 10*time.Second
	var tenths [10]int
	for range 10000 {
		d := spreadDelay(after, spread, rnd)
		if d < after || d >= after+spread {
			t.Fatalf("delay %v outside [%v, %v)", d, after, after+spread)
		}
		tenths[(d-after)*10/spread]++
	}
	for i, n := range tenths {
		if n < 800 { // ~1000 each
			t.Errorf("tenth %d of the spread drawn %d times in 10000: %v", i, n, tenths)
		}
	}
}

// TestRun: a run sends its count, or what its duration allows, and the
// first limit reached ends it.
func TestRun(t *testing.T) {
	meta := testcluster.Start(t, testcluster.Opts{Groups: []string{"g1", "g2"}}).MetaAddr()
	for _, c := range []struct {
		name     string
		edit     func(*Config)
		min, max int64
		atLeast  time.Duration
	}{
		{"count", func(c *Config) { c.Count = 500; c.Mode = Sync }, 500, 500, 0},
		{"duration alone", func(c *Config) { c.Count, c.Duration, c.Rate = 0, time.Second, 200 }, 1, 400, time.Second},
		// 100 messages at 20/s would take 5s: the second ends the run first.
		{"duration first", func(c *Config) { c.Count, c.Duration, c.Rate, c.Mode = 100, time.Second, 20, Sync }, 1, 99, time.Second},
		{"count first", func(c *Config) { c.Count, c.Duration = 30, time.Hour }, 30, 30, 0},
	} {
		cfg := config(meta, "b")
		c.edit(&cfg)
		res, err := Run(context.Background(), cfg)
		if err != nil || res.Errors != 0 || res.Sent < c.min || res.Sent > c.max || res.Seconds < c.atLeast.Seconds() {
			t.Errorf("%s: %v; sent %d, %d errors in %.3fs; want %d to %d sent in at least %v", c.name, err, res.Sent, res.Errors, res.Seconds, c.min, c.max, c.atLeast)
		}
		if res.Count != cfg.Count || res.DurationSeconds != cfg.Duration.Seconds() || res.Mode != string(cfg.Mode) {
			t.Errorf("%s: the result says count %d, duration %vs, mode %s; the run had %d, %v, %s", c.name, res.Count, res.DurationSeconds, res.Mode, cfg.Count, cfg.Duration, cfg.Mode)
		}
	}
}

// TestRateEndsAtDuration: a Rate whose next turn comes after Duration
// ends the run at the duration, without sending at that turn: at 0.5
// messages/s four producers have their second turns 8s in, so a 2s run
// sends one message each; at 0.001 the second turn is 1000s (one producer)
// away. Each run must end well before its next turn: a run still going
// after a minute fails the test.
func TestRateEndsAtDuration(t *testing.T) {
	meta := testcluster.Start(t, testcluster.Opts{Groups: []string{"g1", "g2"}}).MetaAddr()
	for _, c := range []struct {
		rate      float64
		producers int
		duration  time.Duration
		count     int64
		mode      Mode
		most      int64
	}{
		{0.5, 4, 2 * time.Second, 0, Async, 4},
		{0.001, 1, 2 * time.Second, 0, Sync, 1},
		{0.001, 2, time.Second, 5, Async, 2},
	} {
		cfg := config(meta, "paced")
		cfg.Rate, cfg.Producers, cfg.Duration, cfg.Count, cfg.Mode = c.rate, c.producers, c.duration, c.count, c.mode
		type result struct {
			res Result
			err error
		}
		done := make(chan result, 1)
		go func() {
			res, err := Run(context.Background(), cfg)
			done <- result{res, err}
		}()
		var r result
		select {
		case r = <-done:
		case <-time.After(time.Minute):
			t.Fatalf("rate %g, %d producers, %v: still runs after a minute", c.rate, c.producers, c.duration)
		}
		if r.err != nil || r.res.Sent < 1 || r.res.Sent > c.most || r.res.Errors != 0 {
			t.Errorf("rate %g, %d producers, %v: %v; sent %d, %d errors; want 1 to %d sent (the turns before the deadline)",
				c.rate, c.producers, c.duration, r.err, r.res.Sent, r.res.Errors, c.most)
		}
	}
}

// TestBacklogConsumeClock: a backlog run starts its members after every
// send was answered, and its rate is what the SDK delivered from the first
// message to the last: Consumed/(LastDelivery-FirstDelivery), over all
// members and per member. (The clock used to start once the group had
// settled, after the SDK had fetched most of a small backlog: 20,000
// messages read "in 0.00 s".)
func TestBacklogConsumeClock(t *testing.T) {
	meta := testcluster.Start(t, testcluster.Opts{Groups: []string{"g1", "g2"}}).MetaAddr()
	for _, members := range []int{1, 4} {
		cfg := config(meta, fmt.Sprintf("backlog%d", members))
		cfg.Queues, cfg.Count, cfg.Size, cfg.Producers = 4, 20000, 1024, 2
		cfg.Consumers, cfg.Backlog, cfg.ConsumeWait = members, true, 5*time.Second
		cfg.QueueEnds = func(_ context.Context, r routing.Route) ([]api.QueueOffset, error) {
			out := make([]api.QueueOffset, len(r.Queues))
			for i, q := range r.Queues {
				out[i] = api.QueueOffset{Topic: r.Topic, Queue: q.Queue} // a new topic: every queue starts at 0
			}
			return out, nil
		}
		before := time.Now()
		res, err := Run(context.Background(), cfg)
		if err != nil || res.Sent != cfg.Count || res.Consume == nil {
			t.Fatalf("%d members: %v; sent %d, consume %+v", members, err, res.Sent, res.Consume)
		}
		c := res.Consume
		span := c.LastDelivery.Sub(c.FirstDelivery).Seconds()
		if c.Consumed != cfg.Count || c.Seconds <= 0 || c.Seconds != span || math.Abs(c.MsgsPerSec-float64(c.Consumed)/span) > 1e-6 {
			t.Errorf("%d members: consumed %d in %.6fs at %.0f msgs/s, delivered from %v to %v; want %d in last-first (%.6fs) at consumed/(last-first)",
				members, c.Consumed, c.Seconds, c.MsgsPerSec, c.FirstDelivery, c.LastDelivery, cfg.Count, span)
		}
		if sendsEnd := before.Add(time.Duration(res.Seconds * float64(time.Second))); c.FirstDelivery.Before(sendsEnd) {
			t.Errorf("%d members: first delivery %v before the backlog was written (%v)", members, c.FirstDelivery, sendsEnd)
		}
		if c.SettleSeconds < 0 || c.SettleSeconds > c.Seconds {
			t.Errorf("%d members: settle %.6fs outside the run's %.6fs", members, c.SettleSeconds, c.Seconds)
		}
		var sum int64
		for _, m := range c.Members {
			sum += m.Consumed
			if m.Consumed > 0 && (m.Seconds <= 0 || m.Seconds > c.Seconds || math.Abs(m.MsgsPerSec-float64(m.Consumed)/m.Seconds) > 1e-6) {
				t.Errorf("%d members: member %+v; want its rate over its own first-to-last, within the run's %.6fs", members, m, c.Seconds)
			}
		}
		if len(c.Members) != members || sum != c.Consumed {
			t.Errorf("%d members: %d member results summing to %d; want %d summing to %d", members, len(c.Members), sum, members, c.Consumed)
		}
		t.Logf("%d members: %d in %.3fs (settle %.3fs): %.0f msgs/s; %+v", members, c.Consumed, c.Seconds, c.SettleSeconds, c.MsgsPerSec, c.Members)
	}

	// Tags in turn and a filter: the group receives the tenth tagged A (each
	// producer takes the tags in turn from its first message: up to one
	// more A each), and the run waits for exactly those.
	cfg := config(meta, "backlog-filtered")
	cfg.Queues, cfg.Count, cfg.Size, cfg.Producers = 4, 20000, 128, 2
	cfg.Consumers, cfg.Backlog, cfg.ConsumeWait = 1, true, 5*time.Second
	cfg.Tags, cfg.Filter = strings.Split("A,B,C,D,E,F,G,H,I,J", ","), "A"
	cfg.QueueEnds = func(_ context.Context, r routing.Route) ([]api.QueueOffset, error) {
		out := make([]api.QueueOffset, len(r.Queues))
		for i, q := range r.Queues {
			out[i] = api.QueueOffset{Topic: r.Topic, Queue: q.Queue}
		}
		return out, nil
	}
	res, err := Run(context.Background(), cfg)
	if err != nil || res.Sent != cfg.Count || res.Consume == nil || res.Consume.Missing != 0 ||
		res.Consume.Consumed < 2000 || res.Consume.Consumed > 2000+int64(cfg.Producers) {
		t.Fatalf("a filtered backlog: %v; sent %d, consume %+v; want every tenth consumed, none missing", err, res.Sent, res.Consume)
	}
}
