package consumer

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/protocol"
)

// fakeCoord is an in-memory consumer group coordinator, as the metaserver's
// is specified (metaserver/api/consumer.go): sessions, generations, a
// sticky assignment handed over one owner at a time (a queue whose owner
// changed stays with its earlier holder until it is released or the holder
// leaves), commits by the holder only and never backwards, STALE_GENERATION.
// One group; incarnations are not fenced.
type fakeCoord struct {
	mu        sync.Mutex
	queues    map[string]int // topic -> queue count
	session   time.Duration
	members   map[string]time.Time // member -> when its session ends
	gen       uint64
	assign    map[qkey]string
	releasing map[qkey]string // queue -> the earlier holder its owner waits for
	committed map[qkey]int64
	// epochs holds each queue's last commit's epoch and its group.
	epochs  map[qkey]api.QueueOffset
	commits int
	down    bool // answer nothing (an unreachable metaserver)
	// history records, per generation, each queue's owner.
	history map[uint64]map[qkey]string
}

func newFakeCoord(queues map[string]int) *fakeCoord {
	return &fakeCoord{queues: queues, session: 2 * time.Second, members: map[string]time.Time{},
		assign: map[qkey]string{}, releasing: map[qkey]string{}, committed: map[qkey]int64{}, epochs: map[qkey]api.QueueOffset{}, history: map[uint64]map[qkey]string{}}
}

var errFakeDown = &protocol.Error{Status: protocol.StatusTimeout, Message: "fake coordinator down"}

func (f *fakeCoord) setDown(down bool) {
	f.mu.Lock()
	f.down = down
	f.mu.Unlock()
}

func (f *fakeCoord) ConsumerHeartbeat(ctx context.Context, hb api.ConsumerHeartbeat) (api.ConsumerHeartbeatReply, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return api.ConsumerHeartbeatReply{}, errFakeDown
	}
	now := time.Now()
	changed := false
	for m, end := range f.members {
		if now.After(end) {
			f.drop(m)
			changed = true
		}
	}
	for _, r := range hb.Released {
		if k := (qkey{r.Topic, r.Queue}); f.releasing[k] == hb.Member {
			delete(f.releasing, k)
		}
	}
	if hb.Leave {
		if _, ok := f.members[hb.Member]; ok {
			f.drop(hb.Member)
			changed = true
		}
	} else {
		if _, ok := f.members[hb.Member]; !ok {
			changed = true
		}
		session := f.session
		if hb.SessionMillis > 0 {
			session = time.Duration(hb.SessionMillis) * time.Millisecond
		}
		f.members[hb.Member] = now.Add(session)
	}
	if changed || f.gen == 0 {
		f.rebalance()
	}
	reply := api.ConsumerHeartbeatReply{Generation: f.gen, SessionMillis: f.session.Milliseconds()}
	if hb.SessionMillis > 0 {
		reply.SessionMillis = hb.SessionMillis
	}
	for k, h := range f.releasing {
		if h == hb.Member && !hb.Leave {
			reply.Release = append(reply.Release, api.QueueRef{Topic: k.topic, Queue: k.queue})
		}
	}
	for k, m := range f.assign {
		if m == hb.Member && !hb.Leave && f.releasing[k] != "" {
			reply.Waiting++
		}
		if m == hb.Member && !hb.Leave && f.releasing[k] == "" {
			c, ok := f.committed[k]
			if !ok {
				c = -1
			}
			e := f.epochs[k]
			reply.Assignment = append(reply.Assignment, api.QueueAssignment{Topic: k.topic, Queue: k.queue, Committed: c,
				CommittedEpoch: e.Epoch, EpochGroup: e.EpochGroup})
		}
	}
	return reply, nil
}

// drop removes a member (it left, or its session ended): it holds nothing
// any more.
func (f *fakeCoord) drop(m string) {
	delete(f.members, m)
	for k, h := range f.releasing {
		if h == m {
			delete(f.releasing, k)
		}
	}
}

// holder is who holds queue k now: the member releasing it, else its owner.
func (f *fakeCoord) holder(k qkey) string {
	if h := f.releasing[k]; h != "" {
		return h
	}
	return f.assign[k]
}

// rebalance starts a generation: members keep their queues up to a fair
// share, the rest go to the members with the fewest; a queue whose owner
// changed waits for its holder to release it.
func (f *fakeCoord) rebalance() {
	prev := f.assign
	defer func() {
		for k, o := range f.assign {
			switch h := f.releasing[k]; {
			case h == o:
				delete(f.releasing, k)
			case h == "" && prev[k] != "" && prev[k] != o:
				if _, live := f.members[prev[k]]; live {
					f.releasing[k] = prev[k]
				}
			}
		}
	}()
	f.gen++
	var all []qkey
	for t, n := range f.queues {
		for q := range n {
			all = append(all, qkey{t, uint32(q)})
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].String() < all[j].String() })
	var members []string
	for m := range f.members {
		members = append(members, m)
	}
	sort.Strings(members)
	next := map[qkey]string{}
	if len(members) > 0 {
		quota := (len(all) + len(members) - 1) / len(members)
		count := map[string]int{}
		for _, k := range all {
			if m, ok := f.assign[k]; ok {
				if _, live := f.members[m]; live && count[m] < quota {
					next[k] = m
					count[m]++
				}
			}
		}
		for _, k := range all {
			if _, ok := next[k]; ok {
				continue
			}
			best := members[0]
			for _, m := range members {
				if count[m] < count[best] {
					best = m
				}
			}
			next[k] = best
			count[best]++
		}
	}
	f.assign = next
	h := map[qkey]string{}
	for k, m := range next {
		h[k] = m
	}
	f.history[f.gen] = h
}

func (f *fakeCoord) CommitOffsets(ctx context.Context, req api.CommitRequest) (api.CommitReply, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return api.CommitReply{}, errFakeDown
	}
	for _, o := range req.Offsets {
		k := qkey{o.Topic, o.Queue}
		if f.holder(k) != req.Member {
			return api.CommitReply{}, &protocol.Error{Status: protocol.StatusStaleGeneration, Message: "not held by the member"}
		}
		if old, ok := f.committed[k]; ok && o.Offset < old && !o.Rewound && o.Epoch <= f.epochs[k].Epoch {
			return api.CommitReply{}, &protocol.Error{Status: protocol.StatusStaleGeneration, Message: "below the committed offset"}
		}
	}
	for _, o := range req.Offsets {
		f.committed[qkey{o.Topic, o.Queue}] = o.Offset
		f.epochs[qkey{o.Topic, o.Queue}] = o
	}
	f.commits++
	return api.CommitReply{Generation: f.gen}, nil
}

// epoch is the epoch and group the last commit of a queue named.
func (f *fakeCoord) epoch(topic string, queue uint32) (uint32, string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	e := f.epochs[qkey{topic, queue}]
	return e.Epoch, e.EpochGroup
}

func (f *fakeCoord) offset(topic string, queue uint32) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	if o, ok := f.committed[qkey{topic, queue}]; ok {
		return o
	}
	return -1
}
