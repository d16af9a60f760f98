package fsm

import (
	"cmp"
	"fmt"
	"maps"
	"slices"

	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// Broker group admission and retirement.
//
// A group is admitted (it may hold queues), pending (it registered while
// the leader admits groups by hand, RegisterBroker.Pending, and waits for
// AdmitGroup) or retired (RetireGroup moved its queues to other groups; it
// has no brokers, and a broker naming it is refused until AdmitGroup). Only
// admitted groups get queues: CreateTopic and AddQueues refuse others, and
// so does a retirement's target.
//
// A queue keeps its number when it moves: topic T's queue q routes to its
// new group, which takes it up at a base offset, so that the queue's offsets
// go on growing past the old group's. The registry knows a queue's old end
// only from what it heard: the ends its group's master reports in its
// heartbeats (recorded by RecordQueueEnds when they moved) and the consumer
// groups' committed offsets. The base is the highest of
// those (and of the queue's previous base). Messages the old group stored
// after its last recorded report are on its disk only; their offsets are
// taken again by the new group.
//
// The commands have no IgnoreUnknown bit: a node that skipped one would
// route queues elsewhere, admit other groups, or compute other bases than
// the others once it led.
const (
	TypeAdmitGroup      CommandType = 40
	TypeRetireGroup     CommandType = 41
	TypeRecordQueueEnds CommandType = 42
)

// QueueState is what the registry knows of one queue besides its group.
type QueueState struct {
	// Base is the queue offset at which the queue's current group took it
	// up (0: where it began).
	Base int64 `json:"base,omitempty"`
	// End is the highest next offset of the queue known to the registry:
	// reported by its group's master (RecordQueueEnds), or its Base.
	End int64 `json:"end,omitempty"`
	// Left names the groups the queue moved off (the last maxLeft): a
	// group's commit log that holds records of a queue cannot take it up
	// again at a higher offset, so a retirement moves it elsewhere when it
	// can.
	Left []string `json:"left,omitempty"`
}

// maxLeft bounds QueueState.Left.
const maxLeft = 8

// AdmitGroup admits a pending or retired group: it may hold queues from
// now on (a retired one gets its brokers back as they register). A group
// that has not registered is NOT_FOUND; admitting an admitted group changes
// nothing.
type AdmitGroup struct {
	Group string `json:"group"`
	At    int64  `json:"at"`
}

// QueueMove is one queue of a retirement: its new group, and the base the
// leader computed (the FSM takes the higher of it and its own).
type QueueMove struct {
	Topic string `json:"topic"`
	Queue uint32 `json:"queue"`
	To    string `json:"to"`
	Base  int64  `json:"base"`
}

// RetireGroup moves every queue of Group to another admitted group and
// retires it. Moves must name exactly the queues the group holds (else
// CONFLICT: the registry changed since the leader planned); each queue is
// taken up at its base (see above), the consumer groups' committed epochs
// for it are dropped (an epoch is the old group's), and the group loses its
// brokers and its heartbeat-lost and slave-lag reasons (the judge leaves a
// retired group alone). Retiring a retired group with no moves changes
// nothing.
type RetireGroup struct {
	Group string      `json:"group"`
	Moves []QueueMove `json:"moves,omitempty"`
	At    int64       `json:"at"`
}

// QueueEnd is a queue's next offset as a broker reported it.
type QueueEnd struct {
	Topic string `json:"topic"`
	Queue uint32 `json:"queue"`
	End   int64  `json:"end"`
}

// RecordQueueEnds records the queue ends Group's master reported: an end
// counts only for a queue the group holds, and only upwards. It does not
// move the registry Version (no route changes).
type RecordQueueEnds struct {
	Group string     `json:"group"`
	Ends  []QueueEnd `json:"ends"`
}

func (AdmitGroup) Type() CommandType      { return TypeAdmitGroup }
func (RetireGroup) Type() CommandType     { return TypeRetireGroup }
func (RecordQueueEnds) Type() CommandType { return TypeRecordQueueEnds }

// placeable returns why queues may not be placed on group, nil if they may.
func (f *FSM) placeable(group string) error {
	g := f.s.Groups[group]
	switch {
	case g == nil:
		return notFound("broker group %q does not exist", group)
	case g.Admission == routing.Pending:
		return conflict("broker group %q is pending: it takes no queues until an operator admits it (ferryctl broker add-group %s)", group, group)
	case g.Admission == routing.Retired:
		return conflict("broker group %q is retired: it takes no queues until an operator admits it again (ferryctl broker add-group %s)", group, group)
	}
	return nil
}

// refuseRetired refuses a broker that names a retired group.
func refuseRetired(g *routing.Group, broker string) error {
	if g == nil || g.Admission != routing.Retired {
		return nil
	}
	return conflict("broker group %q is retired (its queues moved to other groups); broker %s may join it only once an operator admits it again (ferryctl broker add-group %s)",
		g.Name, broker, g.Name)
}

func (f *FSM) admitGroup(c *AdmitGroup) any {
	g := f.s.Groups[c.Group]
	if g == nil {
		return notFound("broker group %q has not registered: start its brokers (-group %s) first", c.Group, c.Group)
	}
	if g.Admission == routing.Admitted {
		return &Result{Version: g.Version}
	}
	g.Admission = routing.Admitted
	g.ChangedAt = c.At
	return f.bumpGroup(g)
}

// heldQueues returns the queues routed to group, by topic then queue.
func (s *State) heldQueues(group string) []QueueMove {
	var out []QueueMove
	for _, t := range sortedTopics(s) {
		for q, g := range t.Queues {
			if g == group {
				out = append(out, QueueMove{Topic: t.Name, Queue: uint32(q)})
			}
		}
	}
	return out
}

// baseFor is where a queue moving now would continue: past every offset
// the registry knows of (its base, its reported end, every committed
// offset).
func (s *State) baseFor(topic string, queue uint32) int64 {
	qs := s.Queues[topic][queue]
	base := max(qs.Base, qs.End)
	for _, cg := range s.ConsumerGroups {
		if off, ok := cg.Offsets[topic][queue]; ok {
			base = max(base, off)
		}
	}
	return base
}

func (f *FSM) retireGroup(c *RetireGroup) any {
	s := f.s
	g := s.Groups[c.Group]
	if g == nil {
		return notFound("broker group %q does not exist", c.Group)
	}
	held := s.heldQueues(c.Group)
	if g.Admission == routing.Retired && len(c.Moves) == 0 && len(held) == 0 {
		return &Result{Version: g.Version} // a retried retirement
	}
	named := make(map[QueueMove]bool, len(c.Moves))
	for _, m := range c.Moves {
		named[QueueMove{Topic: m.Topic, Queue: m.Queue}] = true
	}
	if len(named) != len(c.Moves) || len(held) != len(c.Moves) || slices.ContainsFunc(held, func(m QueueMove) bool { return !named[m] }) {
		return conflict("broker group %q holds %d queues and the retirement names %d others: the registry changed meanwhile, try again",
			c.Group, len(held), len(c.Moves))
	}
	for _, m := range c.Moves {
		if m.To == c.Group {
			return invalidErr("queue %d of %s cannot move to the group it leaves", m.Queue, m.Topic)
		}
		if err := f.placeable(m.To); err != nil {
			return err
		}
	}
	s.Version++
	for _, m := range c.Moves {
		base := max(m.Base, s.baseFor(m.Topic, m.Queue))
		t := s.Topics[m.Topic]
		t.Queues = slices.Clone(t.Queues)
		t.Queues[m.Queue] = m.To
		t.Version = s.Version
		left := append(slices.Clone(s.Queues[m.Topic][m.Queue].Left), c.Group)
		left = left[max(0, len(left)-maxLeft):]
		s.setQueueState(m.Topic, m.Queue, QueueState{Base: base, End: base, Left: left})
		for _, cg := range s.ConsumerGroups {
			delete(cg.Epochs[m.Topic], m.Queue) // the old group's epoch means nothing to the new one
		}
	}
	g.Admission = routing.Retired
	g.Master, g.Slave, g.Slaves = routing.Broker{}, routing.Broker{}, nil
	if len(g.InSync) > 0 {
		g.InSync = nil
		g.SyncVersion++
	}
	g.Eligible = nil
	g.Reasons &^= routing.HeartbeatLost | routing.SlaveLag // nothing to judge: no alert stays on
	g.ChangedAt = c.At
	g.Version = s.Version
	return &Result{Changed: true, Version: s.Version}
}

func (s *State) setQueueState(topic string, queue uint32, qs QueueState) {
	if s.Queues == nil {
		s.Queues = map[string]map[uint32]QueueState{}
	}
	m := s.Queues[topic]
	if m == nil {
		m = map[uint32]QueueState{}
		s.Queues[topic] = m
	}
	m[queue] = qs
}

// newEnds returns the ends that RecordQueueEnds would record.
func (s *State) newEnds(group string, ends []QueueEnd) []QueueEnd {
	var out []QueueEnd
	for _, e := range ends {
		t := s.Topics[e.Topic]
		if t == nil || int(e.Queue) >= len(t.Queues) || t.Queues[e.Queue] != group {
			continue
		}
		if e.End > s.Queues[e.Topic][e.Queue].End {
			out = append(out, e)
		}
	}
	return out
}

func (f *FSM) recordQueueEnds(c *RecordQueueEnds) any {
	changed := false
	for _, e := range f.s.newEnds(c.Group, c.Ends) {
		qs := f.s.Queues[e.Topic][e.Queue]
		if e.End > qs.End { // a queue named twice: the larger end
			qs.End = e.End
			f.s.setQueueState(e.Topic, e.Queue, qs)
			changed = true
		}
	}
	return &Result{Changed: changed}
}

// NewQueueEnds returns those of ends, reported by group's master, that the
// registry would record: of queues the group holds, above what it knows.
func (f *FSM) NewQueueEnds(group string, ends []QueueEnd) []QueueEnd {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.s.newEnds(group, ends)
}

// QueueState returns what the registry knows of a queue besides its group.
func (f *FSM) QueueState(topic string, queue uint32) QueueState {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.s.Queues[topic][queue]
}

// QueueGroup returns the group a queue is routed to ("" if there is no such
// queue).
func (f *FSM) QueueGroup(topic string, queue uint32) string {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.s.queueGroup(topic, queue)
}

func (s *State) queueGroup(topic string, queue uint32) string {
	if t := s.Topics[topic]; t != nil && int(queue) < len(t.Queues) {
		return t.Queues[queue]
	}
	return ""
}

// readElsewhere is a commit's offset of a queue read in a group the queue
// has left since: its epoch means nothing to the queue's group now, and an
// offset past the base the queue moved at names messages of the old group
// the registry never heard of (they are on its disk), whose numbers the new
// group gives to other messages: the commit goes no further than the base,
// so the consumer group skips none of those.
func (s *State) readElsewhere(o QueueOffset) QueueOffset {
	o.Epoch = 0
	if qs := s.Queues[o.Topic][o.Queue]; len(qs.Left) > 0 {
		o.Offset = min(o.Offset, qs.Base)
	}
	return o
}

// MemberQueues returns a consumer group's generation and member's queues
// in it, each committed epoch with the group it is of (the queue's group:
// a retirement drops the epochs of the queues it moves), read at one
// moment. An unknown group is generation 0 and no queues.
func (f *FSM) MemberQueues(group, member string) (uint64, []QueueOffset) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	g := f.s.ConsumerGroups[group]
	if g == nil {
		return 0, nil
	}
	qs := g.Queues(member)
	for i := range qs {
		if qs[i].Epoch != 0 {
			qs[i].EpochGroup = f.s.queueGroup(qs[i].Topic, qs[i].Queue)
		}
	}
	return g.Generation, qs
}

// PlannedMove is one queue of a planned retirement, with what its base
// comes from.
type PlannedMove struct {
	QueueMove
	// KnownEnd is the highest end the registry recorded for the queue (or
	// its previous base); Committed the highest committed offset of a
	// consumer group (-1: none).
	KnownEnd  int64
	Committed int64
}

// PlanRetire plans the retirement of group: each queue it holds goes to the
// target (a name in targets other than group) holding the fewest queues at
// that point, ties by name, and continues at the base the registry would
// compute now. It fails when the group holds queues and targets names
// none it could take.
func (f *FSM) PlanRetire(group string, targets []string) ([]PlannedMove, error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	s := f.s
	if s.Groups[group] == nil {
		return nil, notFound("broker group %q does not exist", group)
	}
	load := map[string]int{}
	for _, t := range targets {
		if t != group && f.placeable(t) == nil {
			load[t] = 0
		}
	}
	for _, t := range s.Topics {
		for _, g := range t.Queues {
			if _, ok := load[g]; ok {
				load[g]++
			}
		}
	}
	held := s.heldQueues(group)
	if len(held) > 0 && len(load) == 0 {
		return nil, &protocol.Error{Status: protocol.StatusNoRoute,
			Message: fmt.Sprintf("no other admitted, writable broker group to move the %d queues of %q to", len(held), group)}
	}
	names := slices.Sorted(maps.Keys(load))
	out := make([]PlannedMove, 0, len(held))
	for _, m := range held {
		qs := s.Queues[m.Topic][m.Queue]
		fresh := slices.DeleteFunc(slices.Clone(names), func(n string) bool { return slices.Contains(qs.Left, n) })
		if len(fresh) == 0 {
			fresh = names // every target held it before: its broker says why it cannot take it up
		}
		to := slices.MinFunc(fresh, func(a, b string) int { return cmp.Or(cmp.Compare(load[a], load[b]), cmp.Compare(a, b)) })
		load[to]++
		m.To = to
		m.Base = s.baseFor(m.Topic, m.Queue)
		pm := PlannedMove{QueueMove: m, KnownEnd: max(qs.End, qs.Base), Committed: -1}
		for _, cg := range s.ConsumerGroups {
			if off, ok := cg.Offsets[m.Topic][m.Queue]; ok {
				pm.Committed = max(pm.Committed, off)
			}
		}
		out = append(out, pm)
	}
	return out, nil
}

// cloneQueueStates deep-copies State.Queues.
func cloneQueueStates(in map[string]map[uint32]QueueState) map[string]map[uint32]QueueState {
	if in == nil {
		return nil
	}
	out := make(map[string]map[uint32]QueueState, len(in))
	for t, qs := range in {
		m := make(map[uint32]QueueState, len(qs))
		for q, st := range qs {
			st.Left = slices.Clone(st.Left)
			m[q] = st
		}
		out[t] = m
	}
	return out
}
