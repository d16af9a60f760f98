package consumer

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/producer"
)

// TestFilterSkipsAreNotDeliveries: a message the group's filter passed
// over between two it took is not delivered to the group, and the reads
// the broker remembers do not say it was.
func TestFilterSkipsAreNotDeliveries(t *testing.T) {
	e := startEnv(t, []string{"g1"}, false)
	e.cl.Meta.CreateTopic(t, "orders", "g1")
	ctx := context.Background()
	var msgs []*producer.Message
	for i, tag := range []string{"A", "B", "A"} {
		msgs = append(msgs, &producer.Message{Topic: "orders", Key: "k", Tag: tag, Body: []byte{byte('0' + i)}})
	}
	rs := sendEach(t, e, msgs...)
	if rs[0].Queue != rs[1].Queue || rs[1].Queue != rs[2].Queue {
		t.Fatalf("one key's messages in queues %d, %d, %d", rs[0].Queue, rs[1].Queue, rs[2].Queue)
	}
	rec := newRecorder()
	c := e.consumer(t, "billing", []string{"orders"}, MemberID("reader"), Filter("A"))
	stop := runIn(t, c, rec.handler("reader"))
	waitFor(t, 20*time.Second, "the two A read", func() bool { return rec.count() == 2 })
	stop()
	m, err := c.Lookup(ctx, rs[1].Handle)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Deliveries) != 0 {
		t.Fatalf("the B message, which filter A passed over, is shown delivered: %+v", m.Deliveries)
	}
}

// TestFindPagesBigMessages: Find of a key whose messages are of 3 MiB pages
// them, each page under the frame cap (bodies in base64 JSON), and the
// pages hold them all.
func TestFindPagesBigMessages(t *testing.T) {
	e := startEnv(t, []string{"g1"}, false)
	e.cl.Meta.CreateTopic(t, "orders", "g1")
	ctx := context.Background()
	body := bytes.Repeat([]byte("x"), 3<<20)
	var msgs []*producer.Message
	for range 4 {
		msgs = append(msgs, &producer.Message{Topic: "orders", Key: "big", Body: body})
	}
	sendEach(t, e, msgs...)
	c := e.consumer(t, "billing", []string{"orders"}, MemberID("reader"))
	found, pages := 0, 0
	for cursor := ""; ; pages++ {
		page, err := c.Find(ctx, FindQuery{Key: "big", Cursor: cursor})
		if err != nil {
			t.Fatalf("Find of 4 messages of 3 MiB, page %d: %v", pages, err)
		}
		found += len(page.Messages)
		if cursor = page.Cursor; cursor == "" {
			break
		}
	}
	if found != 4 || pages < 1 {
		t.Fatalf("found %d in %d pages after the first, want 4 in more than one", found, pages)
	}
}
