package consumer

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/metaserver"
	"github.com/ferrymq/ferrymq/protocol"
)

// TestNonBlockingRetriesCluster: through an in-process cluster whose
// brokers hold delayed messages, a group with NonBlockingRetries reads
// 2,000 messages from 4 queues; 0.5% of them fail their first call and two
// always fail. Every message is handled, once; a failed one comes back as
// the original (same topic, queue, offset, id, key; 2 deliveries) no
// sooner than its retry's delay after it failed, while its queue went on
// meanwhile (the message after it was handled before it came back); the
// two that always fail are dead-lettered after MaxRetries with their
// origin; every queue's offset, the retry topic's included, is committed
// to its end.
func TestNonBlockingRetriesCluster(t *testing.T) {
	forEachCoord(t, []string{"g1"}, func(t *testing.T, e *env) {
		const n, delay = 2000, 500 * time.Millisecond
		e.cl.Meta.CreateTopic(t, "jobs", "g1", "g1", "g1", "g1")
		send(t, e, "jobs", "job", n)
		failsOnce := func(i int) bool { return i%200 == 7 } // 0.5%
		poison := func(i int) bool { return i == 500 || i == 1501 }

		type call struct {
			m  Message
			at time.Time
		}
		var mu sync.Mutex
		calls := map[int][]call{}      // message index -> its handler calls
		handled := map[int]int{}       // message index -> successful calls
		handledAt := map[qkey][]call{} // per queue, the successful calls in order
		if e.fake {
			// The fake coordinator learns the topics' queues when it is
			// made: the retry topic's too, made here as the consumer would.
			if _, err := e.meta.Route(context.Background(), "%RETRY%grp"); err != nil {
				t.Fatal(err)
			}
			e.coord(t, "grp", []string{"jobs", "%RETRY%grp"})
		}
		c := e.consumer(t, "grp", []string{"jobs"}, NonBlockingRetries(), RetrySchedule(delay), MaxRetries(2))
		runIn(t, c, func(ctx context.Context, m *Message) error {
			var i int
			if _, err := fmt.Sscanf(string(m.Body), "job-%d", &i); err != nil {
				return fmt.Errorf("body %q: %w", m.Body, err)
			}
			mu.Lock()
			defer mu.Unlock()
			calls[i] = append(calls[i], call{*m, time.Now()})
			if poison(i) || failsOnce(i) && len(calls[i]) == 1 {
				return fmt.Errorf("job %d fails (call %d)", i, len(calls[i]))
			}
			handled[i]++
			k := qkey{m.Topic, m.Queue}
			handledAt[k] = append(handledAt[k], call{*m, time.Now()})
			return nil
		})
		waitFor(t, 60*time.Second, "every message handled and the poison dead-lettered", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(handled) == n-2 && len(calls[500]) == 3 && len(calls[1501]) == 3 && c.Stats().DeadLetters == 2
		})
		mu.Lock()
		defer mu.Unlock()
		for i := range n {
			switch {
			case poison(i):
				if handled[i] != 0 {
					t.Errorf("poison job %d handled", i)
				}
			case handled[i] != 1:
				t.Errorf("job %d handled %d times", i, handled[i])
			}
		}
		for i := range n {
			if !failsOnce(i) || poison(i) {
				continue
			}
			cs := calls[i]
			if len(cs) != 2 {
				t.Errorf("job %d: %d calls, want 2", i, len(cs))
				continue
			}
			first, again := cs[0], cs[1]
			if again.m.Topic != "jobs" || again.m.Queue != first.m.Queue || again.m.Offset != first.m.Offset || again.m.ID != first.m.ID ||
				again.m.Key != first.m.Key || again.m.Deliveries != 2 || again.m.Properties[PropRetry] != fmt.Sprintf("job %d fails (call 1)", i) {
				t.Errorf("job %d came back as %+v; first %+v", i, again.m, first.m)
			}
			if d := again.at.Sub(first.at); d < delay {
				t.Errorf("job %d came back %v after it failed, before its retry's %v", i, d, delay)
			}
			// Its queue did not wait: the message after it was handled
			// before it came back.
			var next *call
			for j, h := range handledAt[qkey{"jobs", first.m.Queue}] {
				if h.m.Offset == first.m.Offset+1 {
					next = &handledAt[qkey{"jobs", first.m.Queue}][j]
				}
			}
			if next != nil && !next.at.Before(again.at) {
				t.Errorf("job %d: the next message of its queue was handled %v after it came back: the queue waited", i, next.at.Sub(again.at))
			}
		}
		if s := c.Stats(); s.RetriesStored != 10+2*2 || s.DeadLetters != 2 {
			t.Errorf("stats: %d retries stored (want 14), %d dead letters (want 2)", s.RetriesStored, s.DeadLetters)
		}

		// The dead letters, under their origin.
		r, err := e.meta.RouteExisting(context.Background(), "%DLQ%grp")
		if err != nil {
			t.Fatal(err)
		}
		var dead []protocol.StoredMessage
		for _, q := range r.Queues {
			dead = append(dead, testcluster.PullAll(t, testcluster.Dial(t, q.Master), r.Topic, q.Queue)...)
		}
		if len(dead) != 2 {
			t.Fatalf("%d dead letters, want 2", len(dead))
		}
		for _, d := range dead {
			props := map[string]string{}
			for _, p := range d.Message.Properties {
				props[p.Key] = p.Value
			}
			var i int
			_, _ = fmt.Sscanf(string(d.Message.Body), "job-%d", &i)
			first := calls[i][0].m
			if !poison(i) || props[PropOriginTopic] != "jobs" || props[PropOriginOffset] != strconv.FormatInt(first.Offset, 10) ||
				props[PropOriginID] != first.ID || props[PropDeliveries] != "3" || props["key"] != first.Key || props[PropRetry] == "" {
				t.Errorf("dead letter %q: %v", d.Message.Body, props)
			}
		}

		// Every queue committed to its end, the retry topic's too.
		for _, topic := range []string{"jobs", "%RETRY%grp"} {
			route, err := e.meta.RouteExisting(context.Background(), topic)
			if err != nil {
				t.Fatal(err)
			}
			for _, qr := range route.Queues {
				end := int64(len(testcluster.PullAll(t, testcluster.Dial(t, qr.Master), topic, qr.Queue)))
				waitFor(t, 10*time.Second, fmt.Sprintf("%s/%d committed to %d", topic, qr.Queue, end), func() bool {
					return e.committed(t, "grp", topic, qr.Queue) == end
				})
			}
		}
	})
}

// TestNonBlockingRetriesNeedTheRetryTopic: with a metaserver that does not
// create topics and no retry topic, Run says what to do.
func TestNonBlockingRetriesNeedTheRetryTopic(t *testing.T) {
	cl := testcluster.Start(t, testcluster.Opts{Groups: []string{"g1"}, MetaEdit: noAutoCreate, BrokerEdit: testcluster.SteadyBroker})
	e := &env{cl: cl, meta: cl.Meta.Client(t), fakes: map[string]*fakeCoord{}}
	e.cl.Meta.CreateTopic(t, "jobs", "g1")
	c := e.consumer(t, "grp", []string{"jobs"}, NonBlockingRetries())
	err := c.Run(context.Background(), func(context.Context, *Message) error { return nil })
	if !errors.Is(err, protocol.ErrUnknownTopic) || !strings.Contains(err.Error(), "the retry topic does not exist") {
		t.Fatalf("Run: %v", err)
	}
}

func noAutoCreate(c *metaserver.Config) {
	testcluster.SteadyMeta(c)
	c.AutoCreateTopics = false
}
