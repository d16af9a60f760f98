package consumer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/producer"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/sdk"
)

// sendTagged sends n messages to topic, the i-th tagged tags[i%len(tags)]
// ("" untagged), bodies "prefix-i-TAG".
func sendTagged(t *testing.T, e *env, topic, prefix string, n int, tags ...string) {
	t.Helper()
	p, err := producer.New(sdk.MetaAddrs(e.cl.Meta.Addrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		tag := tags[i%len(tags)]
		wg.Add(1)
		p.SendAsync(context.Background(), &producer.Message{Topic: topic, Key: fmt.Sprint("k", i%8), Tag: tag, Body: fmt.Appendf(nil, "%s-%d-%s", prefix, i, tag)},
			func(_ producer.Result, err error) {
				defer wg.Done()
				if err != nil {
					errs <- err
				}
			})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
}

// TestGroupFilter: a group with a filter receives exactly the messages it
// takes, its committed offsets reach the queues' ends past the others, a
// member asking for another filter is refused with the group's, and a
// set-filter reaches a running member at its next heartbeat.
func TestGroupFilter(t *testing.T) {
	e := startEnv(t, []string{"g1"}, false)
	e.cl.Meta.CreateTopic(t, "orders", "g1", "g1")
	sendTagged(t, e, "orders", "first", 300, "A", "B", "C", "")

	rec := newRecorder()
	a := e.consumer(t, "grp", []string{"orders"}, MemberID("a"), Filter("A||B"))
	runIn(t, a, rec.handler("a"))
	waitFor(t, 20*time.Second, "a to commit both queues to their ends", func() bool {
		return committedSum(e, "grp") == 300
	})
	rec.mu.Lock()
	got := len(rec.seen)
	for body := range rec.seen {
		if !strings.HasSuffix(body, "-A") && !strings.HasSuffix(body, "-B") {
			t.Errorf("the group of A||B received %q", body)
		}
	}
	rec.mu.Unlock()
	if got != 150 {
		t.Fatalf("the group of A||B received %d messages, want the 150 tagged A or B", got)
	}

	other := e.consumer(t, "grp", []string{"orders"}, MemberID("b"), Filter("C"))
	err := other.Run(context.Background(), func(context.Context, *Message) error { return nil })
	if !errors.Is(err, protocol.ErrInvalid) || !strings.Contains(err.Error(), "A OR B") {
		t.Fatalf("a member asking for another filter: %v", err)
	}

	if _, err := e.meta.SetGroupFilter(context.Background(), "grp", "C"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "a to take the group's new filter", func() bool {
		f := a.filter.Load()
		return f != nil && *f == "C"
	})
	// Should a join again (a lapsed session), it asks for the group's
	// filter, not the option's old one, which would be refused.
	if hb := a.heartbeatReq(false, nil); hb.Filter != "" {
		t.Fatalf("after the group named its filter, a heartbeat asks for %q", hb.Filter)
	}
	sendTagged(t, e, "orders", "second", 40, "A", "C")
	waitFor(t, 20*time.Second, "a to commit the second batch", func() bool {
		return committedSum(e, "grp") == 340
	})
	rec.mu.Lock()
	defer rec.mu.Unlock()
	var second []string
	for body := range rec.seen {
		if strings.HasPrefix(body, "second") {
			second = append(second, body)
			if !strings.HasSuffix(body, "-C") {
				t.Errorf("after set-filter C the group received %q", body)
			}
		}
	}
	if len(second) != 20 {
		t.Fatalf("after set-filter C the group received %d of the 20 tagged C", len(second))
	}
}

// committedSum is the sum of a group's committed offsets (0 before it
// exists).
func committedSum(e *env, group string) int64 {
	infos, err := e.meta.ConsumerGroups(context.Background(), group)
	if err != nil || len(infos) != 1 {
		return 0
	}
	var n int64
	for _, o := range infos[0].Offsets {
		n += o.Offset
	}
	return n
}

// TestFilterNeedsAMetaserverThatKeepsIt: a member asking for a filter whose
// join is answered with none (a metaserver that keeps no filters) fails
// rather than receive every message.
func TestFilterNeedsAMetaserverThatKeepsIt(t *testing.T) {
	co := newFakeCoord(map[string]int{"t": 1})
	c, err := New("grp", []string{"t"}, withCoordinator(co), withRouter(fakeRouter{1}), withPuller(&pastEndScript{at8: make(chan struct{})}),
		withDeadLetterer(&fakeDLQ{}), Heartbeat(50*time.Millisecond), Filter("A || B"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = c.Run(ctx, func(context.Context, *Message) error { return nil })
	if err == nil || !strings.Contains(err.Error(), "keeps no consumer group filters") {
		t.Fatalf("Run with a filter the metaserver does not keep: %v", err)
	}
}
