package broker

import (
	"cmp"
	"slices"

	"github.com/ferrymq/ferrymq/metaserver/api"
)

// queueEndsFull is how many heartbeats apart a master reports the ends of
// all its queues; the heartbeats between report the queues whose end moved
// since the heartbeat before. The registry records the ends it did not know
// (one raft write per group and heartbeat, when an end moved), so that a
// queue moved off this group once it is dead continues past them: what the
// master stored after its last heartbeat the registry heard is what a move
// gives other messages' offsets to. The full reports make up for
// heartbeats that were lost.
const queueEndsFull = 5

// queueEndsReport hands a master's heartbeats the commit log's queue ends.
// Only the heartbeat loop's goroutine (session.run) calls it.
type queueEndsReport struct {
	beats int            // heartbeats reported since the last full report
	last  map[qEnd]int64 // the ends as of the last report
}

type qEnd struct {
	topic string
	queue uint32
}

// queueLister is the part of the commit log a report reads.
type queueLister interface {
	Queues(fn func(topic string, queue uint32, first, next int64))
}

// take returns the ends to report in this heartbeat of a master, by topic
// and queue: every queue with a message in every queueEndsFull-th
// heartbeat (the first one as master too), else those whose end moved.
func (r *queueEndsReport) take(log queueLister) []api.QueueEnd {
	full := r.last == nil || r.beats%queueEndsFull == 0
	r.beats++
	cur := make(map[qEnd]int64, len(r.last))
	var out []api.QueueEnd
	log.Queues(func(topic string, queue uint32, _, next int64) {
		if next == 0 {
			return
		}
		k := qEnd{topic, queue}
		cur[k] = next
		if full || r.last[k] != next {
			out = append(out, api.QueueEnd{Topic: topic, Queue: queue, End: next})
		}
	})
	r.last = cur
	slices.SortFunc(out, func(a, b api.QueueEnd) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Queue, b.Queue))
	})
	return out
}

// notMaster is called for a heartbeat the broker sends as anything but the
// master: its next report as the master is a full one.
func (r *queueEndsReport) notMaster() {
	r.beats, r.last = 0, nil
}
