package metaserver_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/ferrymq/ferrymq/protocol"
)

// TestAddQueuesKeepsTheQueueCap: a topic grows to at most 4096 queues, as
// it is created with at most 4096: the registry refuses the add that would
// pass the cap (INVALID, saying how many may still be added) and takes the
// one that reaches it.
func TestAddQueuesKeepsTheQueueCap(t *testing.T) {
	_, cl, s, _ := consumerMeta(t, 4)
	ctx := context.Background()
	_, err := cl.AddQueues(ctx, "orders", 4093)
	if !errors.Is(err, protocol.ErrInvalid) || !strings.Contains(err.Error(), "add at most 4092") {
		t.Fatalf("adding 4093 queues to 4: %v; want INVALID saying at most 4092 may be added", err)
	}
	if r, _ := s.FSM().Route("orders"); len(r.Queues) != 4 {
		t.Fatalf("the refused add changed the topic: %d queues", len(r.Queues))
	}
	if r, err := cl.AddQueues(ctx, "orders", 4092); err != nil || len(r.Queues) != 4096 {
		t.Fatalf("adding 4092 queues to 4: %d queues, %v; want 4096", len(r.Queues), err)
	}
	if _, err := cl.AddQueues(ctx, "orders", 1); !errors.Is(err, protocol.ErrInvalid) {
		t.Fatalf("adding a queue to 4096: %v; want INVALID", err)
	}
}
