package broker

import (
	"cmp"
	"slices"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/metaserver/api"
)

// queueEndsEvery is how many heartbeat intervals apart a master reports
// its queues' ends: the registry records them (one raft write per group
// and report, when an end moved), so that a queue moved off this group
// when it is dead continues past them. Messages stored after the last
// recorded report are the ones a move gives other messages' offsets to.
const queueEndsEvery = 5

// queueEndsReport hands a master's heartbeat the commit log's queue ends,
// every queueEndsEvery heartbeat intervals, the first in the first
// heartbeat the broker sends as the master. Only the heartbeater's
// goroutine calls take.
type queueEndsReport struct {
	every time.Duration
	clock clockwork.Clock
	last  time.Time // zero: report in the next heartbeat
}

// queueLister is the part of the commit log a report reads.
type queueLister interface {
	Queues(fn func(topic string, queue uint32, first, next int64))
}

// take returns the ends to report now: every queue with a message, by
// topic and queue; nil when the last report is recent.
func (r *queueEndsReport) take(log queueLister) []api.QueueEnd {
	now := r.clock.Now()
	if !r.last.IsZero() && now.Sub(r.last) < r.every {
		return nil
	}
	r.last = now
	var out []api.QueueEnd
	log.Queues(func(topic string, queue uint32, _, next int64) {
		if next > 0 {
			out = append(out, api.QueueEnd{Topic: topic, Queue: queue, End: next})
		}
	})
	slices.SortFunc(out, func(a, b api.QueueEnd) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Queue, b.Queue))
	})
	return out
}
