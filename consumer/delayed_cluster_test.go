package consumer

import (
	"context"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/producer"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/sdk"
)

// Through a real broker: a message sent with DeliverAfter reaches the
// handler once released, no earlier than due, saying when it was due, when
// it was released and which pending record it came from (the producer's
// handle) and with its tag; the ordinary message sent after it, without
// one, arrives first.
func TestDelayedDelivery(t *testing.T) {
	e := startEnv(t, []string{"g1"}, true)
	e.cl.Meta.CreateTopic(t, "remind", "g1")
	p, err := producer.New(sdk.MetaAddrs(e.cl.MetaAddr()))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	res, err := p.Send(ctx, &producer.Message{Topic: "remind", Body: []byte("later"), Tag: "reminder", DeliverAfter: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Send(ctx, &producer.Message{Topic: "remind", Body: []byte("now")}); err != nil {
		t.Fatal(err)
	}
	got := make(chan *Message, 2)
	c := e.consumer(t, "g", []string{"remind"})
	runIn(t, c, func(_ context.Context, m *Message) error {
		got <- m
		return nil
	})
	var msgs []*Message
	for len(msgs) < 2 {
		select {
		case m := <-got:
			msgs = append(msgs, m)
		case <-time.After(10 * time.Second):
			t.Fatalf("got %d messages in 10s, want 2", len(msgs))
		}
	}
	now, later := msgs[0], msgs[1]
	if string(now.Body) != "now" || now.Tag != "" || !now.DueAt.IsZero() || !now.ReleasedAt.IsZero() || now.DelayedHandle != (protocol.Handle{}) {
		t.Fatalf("first message %q: DueAt %v ReleasedAt %v DelayedHandle %v; want the ordinary one, with none",
			now.Body, now.DueAt, now.ReleasedAt, now.DelayedHandle)
	}
	if string(later.Body) != "later" || !later.DueAt.Equal(res.DueAt) || later.ReleasedAt.Before(later.DueAt) ||
		!later.ReleasedAt.Equal(later.StoreTime) || later.DelayedHandle != res.Handle || later.ID != res.ID || later.Tag != "reminder" {
		t.Fatalf("released message %q (tag %q): DueAt %v ReleasedAt %v StoreTime %v DelayedHandle %v; want due %v, released then or later, from %v",
			later.Body, later.Tag, later.DueAt, later.ReleasedAt, later.StoreTime, later.DelayedHandle, res.DueAt, res.Handle)
	}
}
