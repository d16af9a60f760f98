package loadgen

import (
	"fmt"
	"strings"
	"testing"

	"github.com/ferrymq/ferrymq/producer"
	"github.com/ferrymq/ferrymq/protocol"
)

// TestSendErrorCausesByKind: failures the producer reports with a message
// id, an attempt count or an address in their text are counted by their
// kind (the producer's sentinels) and status, not one cause per message;
// the first error's full text is the example.
func TestSendErrorCausesByKind(t *testing.T) {
	var s sendErrors
	unreachable := fmt.Errorf("%w: route lookup: metaserver client: ROUTE_LOOKUP: transport: dial 127.0.0.1:8301: i/o timeout", producer.ErrUnreachable)
	var first string
	for i := range 50 {
		err := fmt.Errorf("%w: message 0000%04d to %q (attempts: %d): %w", producer.ErrDeliveryTimeout, i, "orders", i%7+1, unreachable)
		if i == 0 {
			first = err.Error()
		}
		s.add(err)
	}
	for i := range 20 {
		s.add(fmt.Errorf("%w: message 0001%04d to %q (attempts: %d): send to group g1 at 127.0.0.1:%d: %w",
			producer.ErrDeliveryTimeout, i, "orders", i+1, 7400+i, &protocol.Error{Status: protocol.StatusReadOnly, Message: fmt.Sprintf("group g1 epoch %d", i)}))
	}
	for i := range 5 {
		s.add(fmt.Errorf("%w: message 0002%04d to %q", producer.ErrFenced, i, "orders"))
	}
	got := s.list()
	want := []struct {
		cause string
		count int64
	}{
		{"not delivered in time: metaserver unreachable", 50},
		{"not delivered in time: READ_ONLY", 20},
		{"producer fenced", 5},
	}
	if len(got) != len(want) {
		t.Fatalf("%d causes, want %d; the first: %+v", len(got), len(want), got[:min(2, len(got))])
	}
	for i, w := range want {
		if got[i].Cause != w.cause || got[i].Count != w.count {
			t.Errorf("cause %d: %q x %d, want %q x %d", i, got[i].Cause, got[i].Count, w.cause, w.count)
		}
	}
	if got[0].Example != first {
		t.Errorf("example %q, want the first error %q", got[0].Example, first)
	}
}

// TestSendErrorCauses: errors with a status are counted by it, others by
// their text; the causes come most frequent first, each with its first
// error as the example.
func TestSendErrorCauses(t *testing.T) {
	var s sendErrors
	for range 3 {
		s.add(&protocol.Error{Status: protocol.StatusReadOnly, Message: "group g1"})
	}
	s.add(fmt.Errorf("dial: %w", &protocol.Error{Status: protocol.StatusBusy}))
	s.add(fmt.Errorf("something else"))
	s.add(fmt.Errorf("something else"))
	got := s.list()
	if len(got) != 3 || got[0].Cause != "READ_ONLY" || got[0].Count != 3 || got[1].Cause != "something else" || got[1].Count != 2 ||
		got[2].Cause != "BUSY" || got[2].Count != 1 || !strings.Contains(got[0].Example, "group g1") || got[2].Example != "dial: ferrymq: BUSY" {
		t.Fatalf("%+v", got)
	}
}
