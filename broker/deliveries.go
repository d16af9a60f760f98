package broker

import (
	"sync"

	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/protocol"
)

// Bounds of the deliveries a broker remembers.
const (
	readsPerQueue = 32   // the latest reads of each queue
	readQueues    = 4096 // queues remembered; past it one is forgotten
)

// deliveries remembers, per queue, the latest reads by members of
// consumer groups (the group and member a PULL names, the offsets it was
// answered, when): what a message's journey shows of its deliveries. It is
// memory only, bounded, and as the readers say: a restart or a failover
// forgets it, and a queue read by many keeps its latest reads.
type deliveries struct {
	clock clockwork.Clock
	mu    sync.Mutex
	reads map[pullKey]*queueReads
}

type queueReads struct {
	ring [readsPerQueue]protocol.Delivery
	n    int // reads recorded, ever
}

func newDeliveries(clock clockwork.Clock) *deliveries {
	return &deliveries{clock: clock, reads: map[pullKey]*queueReads{}}
}

// record notes that member of group was answered offsets [from, to) of a
// queue. A read that continues the same member's last one extends it.
func (d *deliveries) record(topic string, queue uint32, group, member string, from, to int64) {
	if d == nil || group == "" || from >= to {
		return
	}
	now := d.clock.Now().UnixMilli()
	k := pullKey{topic, queue}
	d.mu.Lock()
	defer d.mu.Unlock()
	q := d.reads[k]
	if q == nil {
		if len(d.reads) >= readQueues {
			for old := range d.reads {
				delete(d.reads, old)
				break
			}
		}
		q = &queueReads{}
		d.reads[k] = q
	}
	if q.n > 0 {
		last := &q.ring[(q.n-1)%readsPerQueue]
		if last.Group == group && last.Member == member && last.To == from {
			last.To = to
			return
		}
	}
	q.ring[q.n%readsPerQueue] = protocol.Delivery{Group: group, Member: member, From: from, To: to, At: now}
	q.n++
}

// of returns the remembered reads of a queue that include offset, oldest
// first.
func (d *deliveries) of(topic string, queue uint32, offset int64) []protocol.Delivery {
	if d == nil {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	q := d.reads[pullKey{topic, queue}]
	if q == nil {
		return nil
	}
	var out []protocol.Delivery
	for i := max(0, q.n-readsPerQueue); i < q.n; i++ {
		if r := q.ring[i%readsPerQueue]; r.From <= offset && offset < r.To {
			out = append(out, r)
		}
	}
	return out
}
