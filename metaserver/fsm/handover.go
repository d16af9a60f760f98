package fsm

import (
	"fmt"
	"maps"
	"slices"

	"github.com/ferrymq/ferrymq/protocol"
)

// One owner at a time (DESIGN.md, "Consumer groups"). A queue's owner in
// the current generation (Assignment) takes it only once its holder in
// earlier generations has stopped delivering it: the holder released it
// (ReleaseQueues, which a member sends after its last handler call of the
// queue returned and its offset was committed), or left the group (Close,
// or its session ran out on the leader: by then the member, which stops
// delivering once it has had no heartbeat answered for its session less a
// margin by its own clock, has stopped). Until then the queue is in
// Releasing, and only its holder may commit it.
//
// Every member is an incarnation (the SDK's start time): a member id that
// joins again with a newer incarnation (a restart with a stable
// InstanceID) keeps its queues without a rebalance, but takes them only
// once the older incarnation released them or its session ran out; the
// older incarnation is fenced (its heartbeats and commits are refused).
//
// A group that has no member opens a join window when its first member
// joins: members that join within it share the first assignment
// (SettleGroup closes it), rather than the first taking every queue.
//
// These rules belong to the commands of this file (JoinMember,
// LeaveMember, CommitHeld, ReleaseQueues, SettleGroup, DeleteGroup); a
// group that one of them touched is Cooperative, and its rebalances keep
// the rules whatever command moves them. The earlier commands (JoinGroup,
// LeaveGroup, CommitOffsets) apply to other groups as they always did, so
// a Raft log written before replays the same.

// Command types of this file. None has the IgnoreUnknown bit: a node that
// skipped one would disagree on who holds a queue and whose commits count.
const (
	TypeJoinMember    CommandType = 23
	TypeLeaveMember   CommandType = 24
	TypeCommitHeld    CommandType = 25
	TypeReleaseQueues CommandType = 26
	TypeSettleGroup   CommandType = 27
	TypeDeleteGroup   CommandType = 28
)

// Holder is a member incarnation that still holds a queue another member
// owns in the current generation; Since is when it was asked to let go
// (unix ms, the rebalance's stamp).
type Holder struct {
	Member      string `json:"member"`
	Incarnation uint64 `json:"incarnation,omitempty"`
	Since       int64  `json:"since"`
}

// QueueRef names one queue of a topic.
type QueueRef struct {
	Topic string `json:"topic"`
	Queue uint32 `json:"queue"`
}

// JoinMember is JoinGroup with one owner at a time: Incarnation is the
// member's incarnation (a newer one than the registry's replaces the older
// incarnation; an older one is refused MEMBER_FENCED), and JoinWindowMillis
// opens the join window of a group that has no member (0: none).
type JoinMember struct {
	Group            string   `json:"group"`
	Member           string   `json:"member"`
	Incarnation      uint64   `json:"incarnation"`
	Topics           []string `json:"topics"`
	SessionMillis    int64    `json:"session_ms"`
	JoinWindowMillis int64    `json:"join_window_ms,omitempty"`
	At               int64    `json:"at"`
	Principal        string   `json:"principal,omitempty"` // who asks (member binding: JoinGroup)
	Filter           string   `json:"filter,omitempty"`    // the filter it asks for (JoinGroup)
}

// LeaveMember is LeaveGroup with one owner at a time: the member's queues
// are released with it. Incarnation, when not 0, must be the member's
// (else MEMBER_FENCED: an older incarnation cannot remove a newer one).
type LeaveMember struct {
	Group            string `json:"group"`
	Member           string `json:"member"`
	Incarnation      uint64 `json:"incarnation,omitempty"`
	ExpectGeneration uint64 `json:"expect_generation,omitempty"`
	At               int64  `json:"at"`
	Principal        string `json:"principal,omitempty"` // "": the leader expiring it, or authorization off
}

// CommitHeld records the offsets of queues the member incarnation holds:
// each queue must be one it owns and no other holder releases, or one it
// releases (else STALE_GENERATION). An offset below the committed one is
// refused (STALE_GENERATION: the member's position is stale) unless it was
// read in a later broker epoch than the committed one (a failover sent the
// reader back) or is marked Rewound (the broker's log of the queue ends
// before the committed offset). All or nothing.
type CommitHeld struct {
	Group       string        `json:"group"`
	Member      string        `json:"member"`
	Incarnation uint64        `json:"incarnation"`
	Offsets     []QueueOffset `json:"offsets"`
	Principal   string        `json:"principal,omitempty"`
}

// ReleaseQueues records that a member incarnation stopped delivering
// queues it was asked to let go (Queues nil: every one): their owners take
// them.
type ReleaseQueues struct {
	Group       string     `json:"group"`
	Member      string     `json:"member"`
	Incarnation uint64     `json:"incarnation"`
	Queues      []QueueRef `json:"queues,omitempty"`
	Principal   string     `json:"principal,omitempty"` // "": the leader releasing for it, or authorization off
}

// SettleGroup closes a group's join window once it has passed (At at or
// after it): the first assignment of everyone who joined meanwhile.
type SettleGroup struct {
	Group string `json:"group"`
	At    int64  `json:"at"`
}

// DeleteGroup removes a consumer group and its committed offsets; refused
// GROUP_ACTIVE while it has members.
type DeleteGroup struct {
	Group string `json:"group"`
}

func (JoinMember) Type() CommandType    { return TypeJoinMember }
func (LeaveMember) Type() CommandType   { return TypeLeaveMember }
func (CommitHeld) Type() CommandType    { return TypeCommitHeld }
func (ReleaseQueues) Type() CommandType { return TypeReleaseQueues }
func (SettleGroup) Type() CommandType   { return TypeSettleGroup }
func (DeleteGroup) Type() CommandType   { return TypeDeleteGroup }

func memberFenced(format string, args ...any) error {
	return &protocol.Error{Status: protocol.StatusMemberFenced, Message: fmt.Sprintf(format, args...)}
}

func (f *FSM) joinMember(c *JoinMember) any {
	topics, err := f.checkJoin(c.Group, c.Member, c.Topics)
	if err != nil {
		return err
	}
	if c.SessionMillis < 0 || c.JoinWindowMillis < 0 {
		return invalidErr("session and join window must not be negative, got %d and %d ms", c.SessionMillis, c.JoinWindowMillis)
	}
	if g := f.s.ConsumerGroups[c.Group]; g != nil {
		if err := g.CheckBound(c.Member, c.Principal); err != nil {
			return err
		}
	}
	if err := checkFilter(c.Filter); err != nil {
		return err
	}
	if g := f.s.ConsumerGroups[c.Group]; g == nil || g.Members[c.Member] == nil || c.Incarnation > g.Members[c.Member].Incarnation {
		if err := g.refuseFilter(c.Member, c.Filter); err != nil {
			return err // before anything changes
		}
	}
	g := f.consumerGroup(c.Group, true)
	g.Cooperative = true
	m := g.Members[c.Member]
	if m != nil && c.Incarnation < m.Incarnation {
		return memberFenced("member %q of consumer group %q was replaced by a newer instance", c.Member, c.Group)
	}
	newer := m != nil && c.Incarnation > m.Incarnation
	if m == nil || newer {
		g.takeFilter(c.Member, c.Filter)
	}
	if m != nil && !newer && slices.Equal(m.Topics, topics) {
		bind := m.Principal == "" && c.Principal != ""
		if m.SessionMillis == c.SessionMillis && !bind {
			return &Result{Generation: g.Generation}
		}
		m.SessionMillis = c.SessionMillis
		if bind {
			m.Principal = c.Principal
		}
		return &Result{Changed: true, Generation: g.Generation}
	}
	if newer {
		// The older incarnation keeps what it holds until it released it
		// or its session ran out (the leader releases it then).
		g.holdFor(c.Member, m.Incarnation, c.At)
	}
	joined, principal := c.At, c.Principal
	if m != nil {
		joined = m.JoinedAt
		if principal == "" {
			principal = m.Principal
		}
	}
	if len(g.Members) == 0 && c.JoinWindowMillis > 0 {
		g.JoinUntil = c.At + c.JoinWindowMillis
	}
	g.Members[c.Member] = &ConsumerMember{Topics: topics, SessionMillis: c.SessionMillis, JoinedAt: joined, Incarnation: c.Incarnation,
		Principal: principal}
	if m != nil && slices.Equal(m.Topics, topics) {
		return &Result{Changed: true, Generation: g.Generation} // a new incarnation, the same member: no rebalance
	}
	if g.JoinUntil != 0 {
		return &Result{Changed: true, Generation: g.Generation} // the window is open: SettleGroup assigns
	}
	f.rebalance(g, c.At)
	return &Result{Changed: true, Generation: g.Generation, Rebalanced: 1}
}

// holdFor makes every queue that member's incarnation inc holds (owns and
// nobody else releases) one it releases, since at: its owner, a newer
// incarnation of the same member, waits for it.
func (g *ConsumerGroup) holdFor(member string, inc uint64, at int64) {
	for t, owners := range g.Assignment {
		for q, o := range owners {
			if o == member && g.releaser(t, uint32(q)) == nil {
				g.setReleasing(t, uint32(q), Holder{Member: member, Incarnation: inc, Since: at})
			}
		}
	}
}

func (f *FSM) leaveMember(c *LeaveMember) any {
	g := f.s.ConsumerGroups[c.Group]
	if g == nil {
		return &Result{}
	}
	g.Cooperative = true
	if c.ExpectGeneration != 0 && c.ExpectGeneration != g.Generation {
		return conflict("consumer group %q is at generation %d, not %d", c.Group, g.Generation, c.ExpectGeneration)
	}
	m := g.Members[c.Member]
	if m == nil {
		return &Result{Generation: g.Generation}
	}
	if err := g.CheckBound(c.Member, c.Principal); err != nil {
		return err
	}
	if c.Incarnation != 0 && c.Incarnation != m.Incarnation {
		return memberFenced("member %q of consumer group %q was replaced by a newer instance", c.Member, c.Group)
	}
	delete(g.Members, c.Member)
	g.release(c.Member, 0, nil, true)
	if len(g.Members) == 0 {
		g.JoinUntil = 0
	}
	if g.JoinUntil != 0 {
		return &Result{Changed: true, Generation: g.Generation}
	}
	f.rebalance(g, c.At)
	return &Result{Changed: true, Generation: g.Generation, Rebalanced: 1}
}

// release drops the queues member holds for others (of incarnation inc,
// or of any when any), all or those named; it reports how many.
func (g *ConsumerGroup) release(member string, inc uint64, queues []QueueRef, any bool) int {
	n := 0
	match := func(h Holder) bool { return h.Member == member && (any || h.Incarnation == inc) }
	if queues == nil {
		for t, qs := range g.Releasing {
			for q, h := range qs {
				if match(h) {
					delete(qs, q)
					n++
				}
			}
			if len(qs) == 0 {
				delete(g.Releasing, t)
			}
		}
	} else {
		for _, r := range queues {
			if h := g.releaser(r.Topic, r.Queue); h != nil && match(*h) {
				delete(g.Releasing[r.Topic], r.Queue)
				if len(g.Releasing[r.Topic]) == 0 {
					delete(g.Releasing, r.Topic)
				}
				n++
			}
		}
	}
	if len(g.Releasing) == 0 {
		g.Releasing = nil
	}
	return n
}

func (f *FSM) releaseQueues(c *ReleaseQueues) any {
	g := f.s.ConsumerGroups[c.Group]
	if g == nil {
		return &Result{}
	}
	if err := g.CheckBound(c.Member, c.Principal); err != nil {
		return err
	}
	n := g.release(c.Member, c.Incarnation, c.Queues, false)
	return &Result{Changed: n > 0, Generation: g.Generation}
}

func (f *FSM) settleGroup(c *SettleGroup) any {
	g := f.s.ConsumerGroups[c.Group]
	if g == nil || g.JoinUntil == 0 || c.At < g.JoinUntil {
		return &Result{}
	}
	g.JoinUntil = 0
	if len(g.Members) == 0 {
		return &Result{Changed: true, Generation: g.Generation}
	}
	f.rebalance(g, c.At)
	return &Result{Changed: true, Generation: g.Generation, Rebalanced: 1}
}

func (f *FSM) deleteGroup(c *DeleteGroup) any {
	g := f.s.ConsumerGroups[c.Group]
	if g == nil {
		return notFound("consumer group %q does not exist", c.Group)
	}
	if len(g.Members) > 0 {
		return &protocol.Error{Status: protocol.StatusGroupActive,
			Message: fmt.Sprintf("consumer group %q has %d members; a group can be deleted only when it has none", c.Group, len(g.Members))}
	}
	delete(f.s.ConsumerGroups, c.Group)
	return &Result{Changed: true}
}

// Holder returns the member incarnation that holds queue q of topic t in
// group g now: the one that releases it, else its owner once the join
// window closed; ok is false for none.
func (g *ConsumerGroup) Holder(t string, q uint32) (Holder, bool) {
	if h := g.releaser(t, q); h != nil {
		return *h, true
	}
	owners := g.Assignment[t]
	if g.JoinUntil != 0 || int(q) >= len(owners) || owners[q] == "" {
		return Holder{}, false
	}
	m := g.Members[owners[q]]
	if m == nil {
		return Holder{}, false
	}
	return Holder{Member: owners[q], Incarnation: m.Incarnation}, true
}

func (g *ConsumerGroup) releaser(t string, q uint32) *Holder {
	if h, ok := g.Releasing[t][q]; ok {
		return &h
	}
	return nil
}

func (g *ConsumerGroup) setReleasing(t string, q uint32, h Holder) {
	if g.Releasing == nil {
		g.Releasing = map[string]map[uint32]Holder{}
	}
	if g.Releasing[t] == nil {
		g.Releasing[t] = map[uint32]Holder{}
	}
	g.Releasing[t][q] = h
}

// handOver records, after a rebalance from prev (the assignment before),
// which queues changed owner while their earlier holder, a member still in
// the group, holds them: that holder releases them first. A queue that came
// back to the member releasing it is its own again.
func (g *ConsumerGroup) handOver(prev map[string][]string, at int64) {
	for t, owners := range g.Assignment {
		for q, o := range owners {
			qq := uint32(q)
			if h := g.releaser(t, qq); h != nil {
				if m := g.Members[h.Member]; h.Member == o && m != nil && m.Incarnation == h.Incarnation {
					delete(g.Releasing[t], qq)
				}
				continue
			}
			old := ""
			if q < len(prev[t]) {
				old = prev[t][q]
			}
			if m := g.Members[old]; old != "" && old != o && m != nil {
				g.setReleasing(t, qq, Holder{Member: old, Incarnation: m.Incarnation, Since: at})
			}
		}
	}
	// A topic no member subscribes to any more: its holders let go.
	for t := range g.Releasing {
		if _, ok := g.Assignment[t]; !ok || len(g.Releasing[t]) == 0 {
			delete(g.Releasing, t)
		}
	}
	if len(g.Releasing) == 0 {
		g.Releasing = nil
	}
}

func (f *FSM) commitHeld(c *CommitHeld) any {
	g, err := f.commitGroup(c.Group, c.Offsets)
	if err != nil {
		return err
	}
	if err := g.CheckBound(c.Member, c.Principal); err != nil {
		return err
	}
	offsets := make([]QueueOffset, len(c.Offsets))
	for i, o := range c.Offsets {
		if h, ok := g.Holder(o.Topic, o.Queue); !ok || h.Member != c.Member || h.Incarnation != c.Incarnation {
			if m := g.Members[c.Member]; m != nil && c.Incarnation < m.Incarnation {
				return memberFenced("member %q of consumer group %q was replaced by a newer instance", c.Member, c.Group)
			}
			return staleGeneration("%s queue %d is not held by member %q of consumer group %q (generation %d): rejoin",
				o.Topic, o.Queue, c.Member, c.Group, g.Generation)
		}
		if o.EpochGroup != "" && f.s.queueGroup(o.Topic, o.Queue) != o.EpochGroup {
			o = f.s.readElsewhere(o)
		}
		if old, ok := g.Offsets[o.Topic][o.Queue]; ok && o.Offset < old && !o.Rewound && (o.Epoch == 0 || o.Epoch <= g.Epochs[o.Topic][o.Queue]) {
			return staleGeneration("%s queue %d: offset %d is below the committed %d of consumer group %q (read in the same broker epoch): the member's position is stale; rejoin",
				o.Topic, o.Queue, o.Offset, old, c.Group)
		}
		o.Rewound = false // not part of the record
		offsets[i] = o
	}
	return &Result{Changed: g.setOffsets(offsets), Generation: g.Generation}
}

// setOffsets records offsets (and the epochs they were read in); it
// reports whether anything changed.
func (g *ConsumerGroup) setOffsets(offsets []QueueOffset) bool {
	changed := false
	for _, o := range offsets {
		qs := g.Offsets[o.Topic]
		if qs == nil {
			qs = map[uint32]int64{}
			g.Offsets[o.Topic] = qs
		}
		if old, ok := qs[o.Queue]; !ok || old != o.Offset {
			qs[o.Queue] = o.Offset
			changed = true
		}
		if g.Epochs[o.Topic][o.Queue] != o.Epoch {
			if g.Epochs == nil {
				g.Epochs = map[string]map[uint32]uint32{}
			}
			es := g.Epochs[o.Topic]
			if es == nil {
				es = map[uint32]uint32{}
				g.Epochs[o.Topic] = es
			}
			if o.Epoch == 0 {
				delete(es, o.Queue)
			} else {
				es[o.Queue] = o.Epoch
			}
			changed = true
		}
	}
	return changed
}

// Held returns the queues member incarnation inc holds in group g (owns,
// and no other holder releases; none while the join window is open), and
// how many it owns that another holder still releases.
func (g ConsumerGroup) Held(member string, inc uint64) (held []QueueOffset, waiting int) {
	for _, t := range slices.Sorted(maps.Keys(g.Assignment)) {
		for q, o := range g.Assignment[t] {
			if o != member {
				continue
			}
			h, ok := g.Holder(t, uint32(q))
			switch {
			case !ok:
				waiting++
			case h.Member == member && h.Incarnation == inc:
				off, ok := g.Offsets[t][uint32(q)]
				if !ok {
					off = -1
				}
				held = append(held, QueueOffset{Topic: t, Queue: uint32(q), Offset: off, Epoch: g.Epochs[t][uint32(q)]})
			default:
				waiting++
			}
		}
	}
	return held, waiting
}

// HeldQueues returns a consumer group's generation, the queues member
// incarnation inc holds (each committed epoch with the broker group it is
// of), how many it owns that others still hold, the queues it holds for
// others (to release), and the end of the join window (0: closed), read at
// one moment. An unknown group is generation 0 and nothing.
func (f *FSM) HeldQueues(group, member string, inc uint64) (gen uint64, held []QueueOffset, waiting int, release []QueueRef, joinUntil int64) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	g := f.s.ConsumerGroups[group]
	if g == nil {
		return 0, nil, 0, nil, 0
	}
	held, waiting = g.Held(member, inc)
	for t, qs := range g.Releasing {
		for q, h := range qs {
			if h.Member == member && h.Incarnation == inc {
				release = append(release, QueueRef{Topic: t, Queue: q})
			}
		}
	}
	for i := range held {
		if held[i].Epoch != 0 {
			held[i].EpochGroup = f.s.queueGroup(held[i].Topic, held[i].Queue)
		}
	}
	return g.Generation, held, waiting, release, g.JoinUntil
}
