package producer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/metaserver"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/sdk"
)

// sentinels are the producer's public errors; a case's error must match the
// ones it wants and none of the others.
var sentinels = []error{ErrClosed, ErrBufferFull, ErrConnLost, ErrUnreachable, ErrDeliveryTimeout, ErrFenced}

// TestErrorsMatch drives the producer into every failure it tells apart,
// through real situations where they are cheap (a broker that cannot take
// HIGH messages, a read-only group, a dead metaserver address, a killed
// broker) and a fake broker for the statuses a real one only gives under
// faults, and checks that users can match each with errors.Is.
func TestErrorsMatch(t *testing.T) {
	c := testcluster.Start(t, testcluster.Opts{Groups: []string{"g1", "gro", "gk"}, BrokerEdit: testcluster.SteadyBroker,
		MetaEdit: func(m *metaserver.Config) {
			testcluster.SteadyMeta(m)
			m.AutoCreateTopics = false
		}})
	c.Meta.CreateTopic(t, "t", "g1")
	c.Meta.CreateTopic(t, "ro", "gro")
	c.Meta.CreateTopic(t, "kill", "gk")
	ctx := context.Background()
	if _, err := c.Meta.Client(t).SetGroupReadOnly(ctx, "gro", true); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 5*time.Second, "gro's master to enforce RO", func() bool { return !c.Master("gro").Writable() })
	startFakeBroker(t, c.MetaAddr(), "gf")
	c.Meta.CreateTopic(t, "fake", "gf")
	hung := startFakeBroker(t, c.MetaAddr(), "gh")
	hung.first.hang.Store(int32(hangBefore))
	c.Meta.CreateTopic(t, "hang", "gh")
	// Retriable failures end after 300 ms of retries.
	short := []Opt{DeliveryTimeout(300 * time.Millisecond), RetryBackoff(5 * time.Millisecond)}
	send := func(p *Client, m *Message) error {
		_, err := p.Send(ctx, m)
		return err
	}
	// async sends m now and returns its case's err: the slow cases (each
	// retries until its delivery deadline) run at once, not one by one.
	async := func(p *Client, m *Message) func(*testing.T) error {
		ch := make(chan error, 1)
		p.SendAsync(ctx, m, func(_ Result, err error) { ch <- err })
		return func(*testing.T) error { return <-ch }
	}
	msg := func(topic, body string) *Message { return &Message{Topic: topic, Body: []byte(body)} }

	type errCase struct {
		name     string
		parallel bool
		err      func(t *testing.T) error
		want     []error // each must match
	}
	cases := []errCase{
		{name: "closed", err: func(t *testing.T) error {
			p := newProducer(t, c)
			_ = p.Close()
			return send(p, msg("t", "x"))
		}, want: []error{ErrClosed}},
		{name: "closed, async", err: func(t *testing.T) error {
			p := newProducer(t, c)
			_ = p.Close()
			var got error
			p.SendAsync(ctx, msg("t", "x"), func(_ Result, err error) { got = err }) // called before it returns
			return got
		}, want: []error{ErrClosed}},
		{name: "buffer full", err: func(t *testing.T) error {
			// The first message lingers, so a buffer of one is full.
			p := newProducer(t, c, FailWhenFull(), MaxBuffered(1, 1<<20), Linger(20*time.Second))
			p.SendAsync(ctx, msg("t", "1"), func(Result, error) {})
			return send(p, msg("t", "2"))
		}, want: []error{ErrBufferFull}},
		{name: "context ends waiting for room", err: func(t *testing.T) error {
			// The first message is sent (a full buffer sends what lingers)
			// and never answered, so a buffer of one stays full.
			p := newProducer(t, c, append([]Opt{MaxBuffered(1, 1<<20)}, short...)...)
			p.SendAsync(ctx, msg("hang", "1"), func(Result, error) {})
			wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			defer cancel()
			_, err := p.Send(wctx, msg("t", "2"))
			return err
		}, want: []error{context.DeadlineExceeded}},
		{name: "metaserver unreachable", parallel: true, err: func(t *testing.T) error {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			dead := l.Addr().String()
			_ = l.Close()
			p, err := New(append([]Opt{sdk.MetaAddrs(dead)}, short...)...)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			return send(p, msg("t", "x"))
		}, want: []error{ErrUnreachable, ErrDeliveryTimeout}},
		{name: "broker killed mid-send", parallel: true, err: func(t *testing.T) error { return killedMidSend(t, c, "gk", "kill") },
			want: []error{ErrConnLost, ErrDeliveryTimeout}},
		{name: "unknown topic", err: func(t *testing.T) error {
			return send(newProducer(t, c), msg("nope", "x"))
		}, want: []error{protocol.ErrUnknownTopic}},
		{name: "message too large", err: func(t *testing.T) error {
			return send(newProducer(t, c), &Message{Topic: "t", Body: make([]byte, protocol.MaxMessageSize+1)})
		}, want: []error{protocol.ErrMessageTooLarge}},
		{name: "invalid topic", err: func(t *testing.T) error {
			return send(newProducer(t, c), msg("bad topic", "x"))
		}, want: []error{protocol.ErrInvalid}},
		{name: "HIGH without a slave", err: async(newProducer(t, c, short...), &Message{Topic: "t", Body: []byte("x"), Reliability: protocol.High}),
			want: []error{protocol.ErrNotEnoughReplicas, ErrDeliveryTimeout}},
		{name: "read-only group", err: async(newProducer(t, c, short...), msg("ro", "x")),
			want: []error{protocol.ErrReadOnly, ErrDeliveryTimeout}},
	}
	// Every status a broker may answer: for one message (every message in
	// a batch of one producer, each answered its own status), and for a
	// whole request (a producer each), from the fake broker.
	// An idempotent producer retries every status that may mean the message
	// was stored (INTERNAL too), on the same queue, until the deadline.
	// DUPLICATE is a success (TestDuplicateIsSuccess); PRODUCER_FENCED
	// fences the whole producer, so it has its own.
	statusOf := newProducer(t, c, short...)
	for s := protocol.Status(1); s.Known(); s++ {
		if s == protocol.StatusDuplicate {
			continue
		}
		want := []error{&protocol.Error{Status: s}}
		if s.Retriable() || s.MaybeStored() {
			want = append(want, ErrDeliveryTimeout)
		}
		p := statusOf
		if s == protocol.StatusProducerFenced {
			p = newProducer(t, c, short...)
			want = append(want, ErrFenced)
		}
		cases = append(cases, errCase{name: "broker answers " + s.String(),
			err: async(p, msg("fake", fmt.Sprintf("status:%d", s))), want: want})
	}
	for _, s := range []protocol.Status{protocol.StatusBusy, protocol.StatusInvalid} {
		want := []error{&protocol.Error{Status: s}}
		if s.Retriable() {
			want = append(want, ErrDeliveryTimeout)
		}
		cases = append(cases, errCase{name: "broker answers the request " + s.String(),
			err: async(newProducer(t, c, short...), msg("fake", fmt.Sprintf("request:%d", s))), want: want})
	}

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.parallel {
				t.Parallel()
			}
			err := tc.err(t)
			if err == nil {
				t.Fatal("no error")
			}
			t.Log(err)
			// The error names the producer once, however many layers of it
			// (a delivery timeout around an unreachable metaserver) it has.
			if n := len(producerLayer.FindAllString(err.Error(), -1)); n > 1 {
				t.Errorf("%v\nsays %q %d times", err, "producer: ", n)
			}
			if n := strings.Count(err.Error(), "transport: "); n > 1 {
				t.Errorf("%v\nsays %q %d times", err, "transport: ", n)
			}
			for _, w := range tc.want {
				if !errors.Is(err, w) {
					t.Errorf("%v\ndoes not match %v", err, w)
				}
			}
			for _, s := range sentinels {
				if errors.Is(err, s) && !errors.Is(errors.Join(tc.want...), s) {
					t.Errorf("%v\nmatches %v too", err, s)
				}
			}
			// No other status, but a TIMEOUT of the attempt that ran into the
			// delivery deadline.
			for _, st := range statuses(err) {
				if !errors.Is(errors.Join(tc.want...), &protocol.Error{Status: st}) &&
					!(st == protocol.StatusTimeout && errors.Is(err, ErrDeliveryTimeout)) {
					t.Errorf("%v\ncarries the status %v", err, st)
				}
			}
		})
	}
}

// producerLayer is the "producer: " a layer of an error begins with (not
// "the same producer: ", the end of ErrFenced's text).
var producerLayer = regexp.MustCompile(`(^|: )producer: `)

// statuses are the statuses of every *protocol.Error in err's tree.
func statuses(err error) []protocol.Status {
	var out []protocol.Status
	if pe, ok := err.(*protocol.Error); ok {
		out = append(out, pe.Status)
	}
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		if e := u.Unwrap(); e != nil {
			out = append(out, statuses(e)...)
		}
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			out = append(out, statuses(e)...)
		}
	}
	return out
}

// killedMidSend kills group's only broker under a stream of sends to topic:
// every message that fails ran out of time retrying the lost broker.
func killedMidSend(t *testing.T, c *testcluster.Cluster, group, topic string) error {
	p := newProducer(t, c, DeliveryTimeout(200*time.Millisecond), RetryBackoff(5*time.Millisecond))
	ctx := context.Background()
	if _, err := p.Send(ctx, &Message{Topic: topic, Body: []byte("warm")}); err != nil {
		t.Fatal(err)
	}
	pr := newPromises(t)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			p.SendAsync(ctx, &Message{Topic: topic, Body: []byte("m")}, pr.next(i))
			time.Sleep(200 * time.Microsecond)
		}
	}()
	testwait.For(t, 10*time.Second, "20 results before the kill", func() bool { n, _ := pr.count(); return n >= 20 })
	_ = c.Master(group).Close()
	testwait.For(t, 10*time.Second, "20 failures after the kill", func() bool { _, f := pr.count(); return f >= 20 })
	close(stop)
	wg.Wait()
	_ = p.Flush(ctx)
	pr.wg.Wait()
	for _, err := range pr.errs[1:] {
		if !errors.Is(err, ErrConnLost) || !errors.Is(err, ErrDeliveryTimeout) {
			t.Errorf("a message sent to the killed broker: %v", err)
		}
	}
	return pr.errs[0]
}

// TestTimeoutAtDeadlineKeepsCause: when the last attempt runs into the
// delivery deadline, the error still carries why the message was not
// delivered before (here BUSY), whatever path the timed-out attempt took
// (an idempotent producer keeps it on its queue, with its stamp).
func TestTimeoutAtDeadlineKeepsCause(t *testing.T) {
	c, fakes := fakeCluster(t, "tc", "g1")
	f := fakes["g1"]
	f.setInject(byBody("x", func(attempt int) (protocol.Status, injectMode) {
		// The first attempt is refused BUSY; from then on the broker hangs:
		// the next attempt waits until the delivery deadline.
		f.first.hang.Store(int32(hangBefore))
		return protocol.StatusBusy, refuse
	}))
	p := newProducer(t, c, DeliveryTimeout(300*time.Millisecond), RetryBackoff(5*time.Millisecond))
	_, err := p.Send(context.Background(), &Message{Topic: "tc", Body: []byte("x")})
	if !errors.Is(err, ErrDeliveryTimeout) || !errors.Is(err, protocol.ErrBusy) {
		t.Fatalf("got %v, want a delivery timeout that matches BUSY", err)
	}
}
