package consumer

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/producer"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/sdk"
)

// TestLookupAndFind: a send's handle finds its message, with the member
// that read it once it was consumed; Find pages a key's messages newest
// first from every group; a handle of nothing is NOT_FOUND.
func TestLookupAndFind(t *testing.T) {
	e := startEnv(t, []string{"g1", "g2"}, false)
	e.cl.Meta.CreateTopic(t, "orders", "g1", "g2")
	ctx := context.Background()
	var msgs []*producer.Message
	for i := range 3 {
		msgs = append(msgs, &producer.Message{Topic: "orders", Key: "order-4711", Tag: "paid", Body: []byte{byte('a' + i)}})
	}
	results := sendEach(t, e, msgs...)
	rec := newRecorder()
	c := e.consumer(t, "billing", []string{"orders"}, MemberID("reader"))
	failed := false
	handle := rec.handler("reader")
	stop := runIn(t, c, func(ctx context.Context, m *Message) error {
		if string(m.Body) == "b" && !failed {
			failed = true // one worker per queue: no race
			return errors.New("not yet")
		}
		return handle(ctx, m)
	})
	waitFor(t, 20*time.Second, "the three read", func() bool { return rec.count() == 3 })
	// Its commit reports the message handled at its second delivery.
	waitFor(t, 10*time.Second, "the redelivery reported", func() bool {
		infos, err := e.meta.ConsumerGroups(ctx, "billing")
		if err != nil || len(infos) != 1 {
			return false
		}
		for _, r := range infos[0].Redelivered {
			if r.Offset == results[1].QueueOffset && r.Queue == results[1].Queue && r.Deliveries == 2 && r.Member == "reader" {
				return true
			}
		}
		return false
	})
	stop()

	m, err := c.Lookup(ctx, results[1].Handle)
	if err != nil || m.ID != results[1].ID || m.Key != "order-4711" || m.Tag != "paid" || string(m.Body) != "b" || m.QueueOffset != results[1].QueueOffset {
		t.Fatalf("Lookup(%s): %+v, %v", results[1].Handle, m, err)
	}
	if len(m.Deliveries) == 0 || m.Deliveries[0].Group != "billing" || m.Deliveries[0].Member != "reader" {
		t.Fatalf("Lookup after the read: deliveries %+v", m.Deliveries)
	}
	page, err := c.Find(ctx, FindQuery{Key: "order-4711", Limit: 2})
	var all []protocol.FoundMessage
	for err == nil {
		all = append(all, page.Messages...)
		if page.Cursor == "" {
			break
		}
		page, err = c.Find(ctx, FindQuery{Key: "order-4711", Limit: 2, Cursor: page.Cursor})
	}
	if err != nil || len(all) != 3 || all[0].ID != results[2].ID {
		t.Fatalf("Find by key in pages of 2: %d messages, first %+v, %v", len(all), all, err)
	}
	h := results[0].Handle
	h.Offset += 1
	if _, err := c.Lookup(ctx, h); !errors.Is(err, protocol.ErrNotFound) {
		t.Fatalf("Lookup of an offset where no message starts: %v", err)
	}
}

// sendEach sends msgs one at a time, in order, and returns their results.
func sendEach(t *testing.T, e *env, msgs ...*producer.Message) []producer.Result {
	t.Helper()
	p, err := producer.New(sdk.MetaAddrs(e.cl.Meta.Addrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	out := make([]producer.Result, len(msgs))
	for i, m := range msgs {
		if out[i], err = p.Send(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	return out
}
