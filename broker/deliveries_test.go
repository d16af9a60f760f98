package broker

import (
	"fmt"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
)

// TestDeliveries: reads are remembered per queue, a member's read that
// continues its last one extends it, a read again (a redelivery) is a new
// one, only the latest readsPerQueue reads of a queue are kept, at most
// readQueues queues, and reads that name no group are not kept.
func TestDeliveries(t *testing.T) {
	clock := clockwork.NewFakeClock()
	d := newDeliveries(clock)
	d.record("t", 0, "g", "m1", 0, 10)
	d.record("t", 0, "g", "m1", 10, 20) // continues: one read [0, 20)
	d.record("t", 0, "", "", 20, 30)    // no group: not kept
	clock.Advance(time.Second)
	d.record("t", 0, "g", "m2", 5, 15) // read again, by another member
	got := d.of("t", 0, 12)
	if len(got) != 2 || got[0].Member != "m1" || got[0].From != 0 || got[0].To != 20 || got[1].Member != "m2" || got[1].At <= got[0].At {
		t.Fatalf("reads of offset 12: %+v", got)
	}
	if got := d.of("t", 0, 25); len(got) != 0 {
		t.Fatalf("an offset only an anonymous read covered: %+v", got)
	}
	if got := d.of("t", 1, 0); got != nil {
		t.Fatalf("a queue never read: %+v", got)
	}
	for i := range readsPerQueue + 5 {
		d.record("t", 0, "g", fmt.Sprint("r", i), 100, 101)
	}
	got = d.of("t", 0, 100)
	if len(got) != readsPerQueue || got[0].Member != "r5" || got[len(got)-1].Member != fmt.Sprint("r", readsPerQueue+4) {
		t.Fatalf("after %d reads of one offset: %d kept, from %s to %s", readsPerQueue+5, len(got), got[0].Member, got[len(got)-1].Member)
	}
	for q := range uint32(readQueues + 10) {
		d.record("many", q, "g", "m", 0, 1)
	}
	d.mu.Lock()
	n := len(d.reads)
	d.mu.Unlock()
	if n > readQueues {
		t.Fatalf("%d queues remembered, at most %d", n, readQueues)
	}
}
