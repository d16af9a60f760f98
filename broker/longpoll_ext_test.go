package broker_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/broker"
	tc "github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/protocol"
)

type pullResult struct {
	resp protocol.PullResponse
	err  error
	at   time.Time // when the answer arrived
}

// longPull sends a PULL with a wait and returns where its answer comes.
func longPull(c *transport.Client, topic string, queue uint32, offset int64, waitMillis uint32) <-chan pullResult {
	out := make(chan pullResult, 1)
	go func() {
		resp, err := c.Call(context.Background(), protocol.CodePull, protocol.AppendPullRequest(nil,
			&protocol.PullRequest{Topic: topic, Queue: queue, Offset: offset, WaitMillis: waitMillis}))
		at := time.Now()
		if err != nil {
			out <- pullResult{err: err, at: at}
			return
		}
		pr, err := protocol.DecodePullResponse(resp.Body)
		out <- pullResult{resp: pr, err: err, at: at}
	}()
	return out
}

func awaitPull(t *testing.T, ch <-chan pullResult) pullResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("the PULL was not answered")
		return pullResult{}
	}
}

func waitParked(t testing.TB, b *broker.Broker, n int64) {
	t.Helper()
	testwait.For(t, 5*time.Second, "the PULL to park", func() bool { return b.Stats().PullsParked.Load() == n })
}

// A consumer's PULL at the end of a queue waits on the master and returns
// the message as soon as a producer's SEND stores it.
func TestLongPollPullReturnsWhenAMessageIsSent(t *testing.T) {
	meta := tc.StartMeta(t, 1, nil)
	g := tc.StartGroup(t, meta.Addrs(), "g1", tc.GroupOpts{})
	meta.CreateTopic(t, "lp", "g1")
	c := tc.Dial(t, g.Master.Addr())
	warmRoute(t, c, "lp", 0) // offset 0 holds the probe
	ch := longPull(c, "lp", 0, 1, 20_000)
	waitParked(t, g.Master, 1)
	sent := time.Now()
	if r := tc.Send(t, c, []protocol.Message{tc.Msg("lp", 0, protocol.Normal, "wake")}); r[0].Status != protocol.StatusOK {
		t.Fatal(r[0].Status)
	}
	r := awaitPull(t, ch)
	if r.err != nil || len(r.resp.Messages) != 1 || string(r.resp.Messages[0].Message.Body) != "wake" || r.resp.Messages[0].StoreTime == 0 {
		t.Fatalf("answer %+v, %v", r.resp, r.err)
	}
	t.Logf("send to long-poll answer: %v", r.at.Sub(sent))
	if n := g.Master.Stats().PullWakeups.Load(); n != 1 {
		t.Fatalf("wake-ups %d", n)
	}
}

// On a slave, a parked PULL returns the message once the follower copied it.
func TestLongPollOnTheSlaveWakesWhenTheFollowerCopies(t *testing.T) {
	meta := tc.StartMeta(t, 1, nil)
	g := tc.StartGroup(t, meta.Addrs(), "g1", tc.GroupOpts{Slave: true})
	meta.CreateTopic(t, "lps", "g1")
	mc := tc.Dial(t, g.Master.Addr())
	warmRoute(t, mc, "lps", 0)
	testwait.For(t, 5*time.Second, "the slave to copy the probe", func() bool {
		return g.Slave.Store().EndOffset() == g.Master.Store().EndOffset()
	})
	sc := tc.Dial(t, g.Slave.Addr())
	ch := longPull(sc, "lps", 0, 1, 20_000)
	idle := longPull(sc, "lps", 1, 0, 20_000)
	waitParked(t, g.Slave, 2)
	if r := tc.Send(t, mc, []protocol.Message{tc.Msg("lps", 0, protocol.High, "copied")}); r[0].Status != protocol.StatusOK {
		t.Fatal(r[0].Status)
	}
	r := awaitPull(t, ch)
	if r.err != nil || len(r.resp.Messages) != 1 || string(r.resp.Messages[0].Message.Body) != "copied" {
		t.Fatalf("answer %+v, %v", r.resp, r.err)
	}
	if len(idle) > 0 || g.Slave.Stats().PullsParked.Load() != 1 {
		t.Fatal("the PULL of a queue that got nothing was answered")
	}
}

// A parked PULL is answered empty, with the queue's offsets, once its wait
// passed on the broker's (fake) clock.
func TestLongPollPullExpiresOnTheBrokersClock(t *testing.T) {
	meta := tc.StartMeta(t, 1, nil)
	clock := clockwork.NewFakeClock()
	g := tc.StartGroup(t, meta.Addrs(), "g1", tc.GroupOpts{Edit: func(c *broker.Config) { c.Clock = clock }})
	meta.CreateTopic(t, "lpe", "g1")
	c := tc.Dial(t, g.Master.Addr())
	warmRoute(t, c, "lpe", 0)
	ch := longPull(c, "lpe", 0, 1, 3000)
	waitParked(t, g.Master, 1)
	var r pullResult
	testwait.For(t, 10*time.Second, "the wait to pass", func() bool {
		clock.Advance(500 * time.Millisecond)
		select {
		case r = <-ch:
			return true
		default:
			return false
		}
	})
	if r.err != nil || len(r.resp.Messages) != 0 || r.resp.NextOffset != 1 || r.resp.MaxOffset != 1 {
		t.Fatalf("answer %+v, %v", r.resp, r.err)
	}
	if n := g.Master.Stats().PullsExpired.Load(); n != 1 {
		t.Fatalf("expired %d", n)
	}
}

// Closing a broker answers its parked PULLs SHUTTING_DOWN at once.
func TestLongPollCloseAnswersParkedPulls(t *testing.T) {
	meta := tc.StartMeta(t, 1, nil)
	g := tc.StartGroup(t, meta.Addrs(), "g1", tc.GroupOpts{})
	c := tc.Dial(t, g.Master.Addr())
	chs := []<-chan pullResult{longPull(c, "nothing", 0, 0, 60_000), longPull(c, "nothing", 1, 0, 60_000)}
	waitParked(t, g.Master, 2)
	start := time.Now()
	if err := g.Master.Close(); err != nil {
		t.Fatal(err)
	}
	for _, ch := range chs {
		if r := awaitPull(t, ch); protocol.StatusOf(r.err) != protocol.StatusShuttingDown {
			t.Fatalf("answer %v", r.err)
		}
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("close took %v", d)
	}
}

// BenchmarkLongPollWake measures how soon a consumer's parked PULL returns
// a message after a producer sends it, on an idle master over loopback:
// each op parks one PULL, sends one 1 KiB message and waits for both
// answers. It reports the p50/p99 from the SEND's start to the PULL's
// answer (wake-µs), and the SEND's own round trip (send-µs) beside it.
//
//	go test -run '^$' -bench BenchmarkLongPollWake -benchtime 2000x ./broker
func BenchmarkLongPollWake(b *testing.B) {
	meta := tc.StartMeta(b, 1, nil)
	g := tc.StartGroup(b, meta.Addrs(), "g1", tc.GroupOpts{})
	meta.CreateTopic(b, "wake", "g1")
	pc, cc := tc.Dial(b, g.Master.Addr()), tc.Dial(b, g.Master.Addr()) // producer and consumer connections
	testwait.For(b, 5*time.Second, "the route", func() bool {
		return tc.Send(b, pc, []protocol.Message{tc.Msg("wake", 0, protocol.Normal, "probe")})[0].Status == protocol.StatusOK
	})
	body := string(make([]byte, 1024))
	wake := make([]time.Duration, 0, b.N)
	send := make([]time.Duration, 0, b.N)
	off := int64(1)
	b.ResetTimer()
	for range b.N {
		ch := longPull(cc, "wake", 0, off, 5000)
		for g.Master.Stats().PullsParked.Load() != 1 {
			time.Sleep(20 * time.Microsecond)
		}
		start := time.Now()
		res := tc.Send(b, pc, []protocol.Message{tc.Msg("wake", 0, protocol.Normal, body)})
		acked := time.Now()
		r := <-ch
		if res[0].Status != protocol.StatusOK || r.err != nil || len(r.resp.Messages) != 1 {
			b.Fatalf("send %v, pull %v (%d messages)", res[0].Status, r.err, len(r.resp.Messages))
		}
		off = r.resp.NextOffset
		wake = append(wake, r.at.Sub(start))
		send = append(send, acked.Sub(start))
	}
	b.StopTimer()
	slices.Sort(wake)
	slices.Sort(send)
	q := func(d []time.Duration, p float64) float64 { return float64(d[int(p*float64(len(d)-1))].Microseconds()) }
	b.ReportMetric(q(wake, 0.5), "wake-p50-µs")
	b.ReportMetric(q(wake, 0.99), "wake-p99-µs")
	b.ReportMetric(q(send, 0.5), "send-p50-µs")
}
