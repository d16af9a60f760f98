package consumer

import (
	"context"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/protocol"
)

// A released delayed message says when it was due, when it was released
// (its store time) and the pending record it came from (its group's
// handle); an ordinary message next to it has none of the three.
func TestReleasedMessageTimes(t *testing.T) {
	fb := newFakeBrokers()
	due := time.Date(2026, 12, 6, 19, 0, 0, 250_000_000, time.UTC)
	fb.add("t", 0, "plain")
	fb.addMessage(protocol.Message{ID: "id-late", Topic: "t", Queue: 0, Timestamp: time.Now().UnixMilli(), Body: []byte("late"),
		Schedule: protocol.Schedule{Kind: protocol.ScheduleReleased, At: due.UnixMilli(), Ref: 42}})
	co := newFakeCoord(map[string]int{"t": 1})
	c := fakeConsumer(t, fb, co, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var got []*Message
	for len(got) < 2 {
		msgs, err := c.Poll(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, msgs...)
	}
	plain, late := got[0], got[1]
	if !plain.DueAt.IsZero() || !plain.ReleasedAt.IsZero() || plain.DelayedHandle != (protocol.Handle{}) {
		t.Fatalf("an ordinary message: DueAt %v ReleasedAt %v DelayedHandle %v, want all zero", plain.DueAt, plain.ReleasedAt, plain.DelayedHandle)
	}
	if !late.DueAt.Equal(due) || !late.ReleasedAt.Equal(late.StoreTime) || late.ReleasedAt.IsZero() ||
		late.DelayedHandle != (protocol.Handle{Group: "g", Offset: 42, DueAt: due.UnixMilli()}) {
		t.Fatalf("a released message: DueAt %v ReleasedAt %v (stored %v) DelayedHandle %v, want due %v, released when stored, g@42",
			late.DueAt, late.ReleasedAt, late.StoreTime, late.DelayedHandle, due)
	}
}
