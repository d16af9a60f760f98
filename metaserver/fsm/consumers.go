package fsm

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"sort"

	"github.com/ferrymq/ferrymq/protocol"
)

// Consumer groups. A group has members (each subscribed to some topics), a
// generation that grows by one at every change of membership or of the
// queues of a subscribed topic, the assignment of every subscribed topic's
// queues to members in that generation, and committed offsets per (topic,
// queue). Sessions are not here: the leader keeps them in memory and applies
// LeaveGroup when one runs out. Consumer group commands do not move the
// registry Version: they change no route, and moving it would invalidate
// every cached route at every commit.

// Limits on consumer group commands.
const (
	// MaxConsumerName is the longest group or member name, in bytes.
	MaxConsumerName = 255
	// MaxConsumerTopics is the most topics one member may subscribe to.
	MaxConsumerTopics = 64
	// MaxCommitOffsets is the most offsets one commit or reset may carry.
	MaxCommitOffsets = 1 << 16
)

// ConsumerGroup is a consumer group in the registry.
type ConsumerGroup struct {
	Name       string                     `json:"name"`
	Generation uint64                     `json:"generation"`
	Members    map[string]*ConsumerMember `json:"members"`
	// Assignment holds, for every topic some member subscribes to, the
	// owner of each queue (by queue number) in the current generation; ""
	// for a queue with no owner (never, while the topic has a subscriber).
	Assignment map[string][]string `json:"assignment"`
	// Offsets are the committed offsets (the next offset to consume) by
	// topic and queue. They outlive members: an empty group resumes.
	Offsets map[string]map[uint32]int64 `json:"offsets"`
	// Epochs are the broker group epochs in which the committed offsets
	// were read (absent: unknown, e.g. a reset): a member that starts from
	// a committed offset names it in its PULLs, so that a broker of a later
	// epoch can send it back if a failover cut the log below the offset.
	Epochs    map[string]map[uint32]uint32 `json:"epochs,omitempty"`
	ChangedAt int64                        `json:"changed_at"` // unix ms of the last generation, stamped by the leader
	// Cooperative: the group keeps one owner at a time (handover.go): a
	// queue changes holder only once its earlier holder released it.
	Cooperative bool `json:"cooperative,omitempty"`
	// Releasing holds, by topic and queue, the earlier holder that must
	// release a queue before its owner in the current generation takes it.
	Releasing map[string]map[uint32]Holder `json:"releasing,omitempty"`
	// JoinUntil (unix ms, 0: closed) is the end of the join window of a
	// group that had no member: joins wait for it (SettleGroup).
	JoinUntil int64 `json:"join_until,omitempty"`
	// Filter is the canonical filter (protocol.Filter) of the messages the
	// group receives, "*" or "" (none set yet) for every message. Every
	// member receives by it: see admitFilter.
	Filter string `json:"filter,omitempty"`
	// FilterBy says who set Filter: "member M" (the first member, asking
	// for it) or "set-filter" (and by whom); "" while none is set.
	FilterBy string `json:"filter_by,omitempty"`
}

// ConsumerMember is one member of a consumer group.
type ConsumerMember struct {
	Topics []string `json:"topics"` // sorted, no duplicates
	// SessionMillis is the session the leader applies to the member (so a
	// new leader knows it before the member's next heartbeat).
	SessionMillis int64 `json:"session_ms"`
	JoinedAt      int64 `json:"joined_at"`
	// Incarnation is the member's current incarnation (handover.go); 0 for
	// a member that joined by JoinGroup.
	Incarnation uint64 `json:"incarnation,omitempty"`
	// Principal is who joined the member ("": joined with authorization
	// off): only it may act as the member (CheckBound).
	Principal string `json:"principal,omitempty"`
}

// QueueOffset is a queue's offset in a commit or a reset.
type QueueOffset struct {
	Topic  string `json:"topic"`
	Queue  uint32 `json:"queue"`
	Offset int64  `json:"offset"`
	Epoch  uint32 `json:"epoch,omitempty"` // the epoch it was read in (commits); 0 unknown
	// EpochGroup is the broker group whose epoch Epoch is (commits; "":
	// the queue's group). An epoch of another group than the queue's now
	// (the queue moved since it was read) is recorded as unknown.
	EpochGroup string `json:"epoch_group,omitempty"`
	// Rewound (CommitHeld): the broker sent the holder below the committed
	// offset (the queue's log ends before it), so a lower offset is taken.
	Rewound bool `json:"rewound,omitempty"`
}

// JoinGroup adds a member to a group (creating the group) or updates its
// topics or session. Joining with the topics the member has changes nothing
// (a retried join is harmless; a changed session alone is recorded without
// a new generation); otherwise the group moves to the next generation with a
// new assignment. Every topic must exist (UNKNOWN_TOPIC otherwise).
type JoinGroup struct {
	Group         string   `json:"group"`
	Member        string   `json:"member"`
	Topics        []string `json:"topics"`
	SessionMillis int64    `json:"session_ms"`
	At            int64    `json:"at"`
	// Principal is who asks ("": no one to check, authorization is off);
	// the same in every command that acts as a member (CheckBound).
	Principal string `json:"principal,omitempty"`
	// Filter is the canonical filter the member asks for ("": none, it
	// takes the group's); see admitFilter.
	Filter string `json:"filter,omitempty"`
}

// LeaveGroup removes a member: the next generation, with a new assignment.
// Removing an absent member changes nothing. ExpectGeneration, when not 0,
// must be the group's generation (the leader expiring a member names the
// generation it judged in), else CONFLICT.
type LeaveGroup struct {
	Group            string `json:"group"`
	Member           string `json:"member"`
	ExpectGeneration uint64 `json:"expect_generation,omitempty"`
	At               int64  `json:"at"`
	Principal        string `json:"principal,omitempty"` // "": the leader expiring it, or authorization off
}

// CommitOffsets records a member's offsets, all or nothing. It is refused
// with STALE_GENERATION when Generation is not the group's or any queue is
// not assigned to Member in it; a negative offset is INVALID. Repeating a
// commit is harmless.
type CommitOffsets struct {
	Group      string        `json:"group"`
	Member     string        `json:"member"`
	Generation uint64        `json:"generation"`
	Offsets    []QueueOffset `json:"offsets"`
	Principal  string        `json:"principal,omitempty"`
}

// ResetOffsets sets a group's committed offsets (creating the group), all or
// nothing; offsets it does not name are kept. It is refused with
// GROUP_ACTIVE while the group has members.
type ResetOffsets struct {
	Group   string        `json:"group"`
	Offsets []QueueOffset `json:"offsets"`
	At      int64         `json:"at"`
}

func (JoinGroup) Type() CommandType     { return TypeJoinGroup }
func (LeaveGroup) Type() CommandType    { return TypeLeaveGroup }
func (CommitOffsets) Type() CommandType { return TypeCommitOffsets }
func (ResetOffsets) Type() CommandType  { return TypeResetOffsets }

// ValidateConsumerName checks a consumer group's name (what is "group")
// or a member's ("member"): 1 to MaxConsumerName bytes of letters a-z A-Z,
// digits, '.', '_' and '-'. Its error names the first character that is not
// allowed, by character (protocol.ValidateName), and calls a group a
// consumer group.
func ValidateConsumerName(what, name string) error {
	if what == "group" {
		what = "consumer group"
	}
	return protocol.ValidateName(what, name, MaxConsumerName, "._-")
}

// NormalizeTopics returns topics sorted without duplicates.
func NormalizeTopics(topics []string) []string {
	out := slices.Clone(topics)
	slices.Sort(out)
	return slices.Compact(out)
}

// Filters. A group receives the messages its filter matches, every member
// the same: a member with another filter would silently lose the messages
// its queues' other filter skips (RocketMQ's trap). A joining member may
// ask for a filter: the group's (or none) is admitted; another is refused,
// except when the group has no filter yet and no other member, when it
// becomes the group's. Only SetGroupFilter changes a group's filter once
// set; members take a changed one from their next heartbeat. Members
// already in the group are not checked again (they follow the group's).

// refuseFilter refuses the filter a member joining g (nil: a new group)
// asks for when it is not the group's and cannot become it.
func (g *ConsumerGroup) refuseFilter(member, filter string) error {
	if g == nil || filter == "" || filter == g.Filter || filter == "*" && g.Filter == "" || g.mayTake(member) {
		return nil
	}
	has := g.Filter
	if has == "" {
		has = "*"
	}
	return invalidErr("consumer group %q receives the messages of the filter %q (set by %s), and member %q asks for %q: every member of a group receives the same messages "+
		"(change the group's filter with ferryctl group set-filter, or consume in another group)", g.Name, has, cmp.Or(g.FilterBy, "its first members"), member, filter)
}

// mayTake says whether a joining member's filter becomes g's: none is set
// and no other member is in.
func (g *ConsumerGroup) mayTake(member string) bool {
	others := len(g.Members)
	if g.Members[member] != nil {
		others--
	}
	return g.FilterBy == "" && others == 0
}

// takeFilter makes a joining member's filter, admitted by refuseFilter,
// the group's when it may.
func (g *ConsumerGroup) takeFilter(member, filter string) {
	if filter != "" && filter != g.Filter && g.mayTake(member) {
		g.Filter, g.FilterBy = filter, "member "+member
	}
}

// SetGroupFilter sets the filter of the messages a consumer group receives,
// creating the group if it does not exist. Filter is canonical
// (protocol.Filter.Canonical; "*" for every message).
type SetGroupFilter struct {
	Group     string `json:"group"`
	Filter    string `json:"filter"`
	Principal string `json:"principal,omitempty"`
	At        int64  `json:"at"`
}

func (SetGroupFilter) Type() CommandType { return TypeSetGroupFilter }

// TypeSetGroupFilter is SetGroupFilter's command type.
const TypeSetGroupFilter CommandType = 29

func (f *FSM) setGroupFilter(c *SetGroupFilter) any {
	if err := ValidateConsumerName("group", c.Group); err != nil {
		return invalidErr("%v", err)
	}
	if c.Filter == "" {
		return invalidErr("a filter is needed (\"*\" for every message)")
	}
	if err := checkFilter(c.Filter); err != nil {
		return err
	}
	g := f.consumerGroup(c.Group, true)
	by := "set-filter"
	if c.Principal != "" {
		by += " by " + c.Principal
	}
	if g.Filter == c.Filter && g.FilterBy == by {
		return &Result{Generation: g.Generation}
	}
	g.Filter, g.FilterBy = c.Filter, by
	return &Result{Changed: true, Generation: g.Generation}
}

// checkFilter bounds a filter's length. The servers put it in canonical
// form before they propose a command; Apply does not parse it, so that a
// later release's canonical form cannot make a replay refuse what was
// applied.
func checkFilter(filter string) error {
	if len(filter) > protocol.MaxFilterLen {
		return invalidErr("filter of %d bytes over the cap %d", len(filter), protocol.MaxFilterLen)
	}
	return nil
}

// Member binding. With authorization on, a member is bound to the
// principal that joined it (ConsumerMember.Principal): a command that acts
// as the member (a join, a leave, a commit, a release) for another
// principal is refused NOT_AUTHORIZED, so that a consumer of a group
// cannot commit, heartbeat or leave as another principal's member. A
// command that names no principal (authorization off; the leader expiring
// a member) is not checked; a member that has none (joined with
// authorization off) is bound by its next join that names one. The
// binding ends with the member: once it left, its id is free.

// CheckBound refuses principal acting as member of g when another
// principal joined the member.
func (g *ConsumerGroup) CheckBound(member, principal string) error {
	m := g.Members[member]
	if m == nil || principal == "" || m.Principal == "" || m.Principal == principal {
		return nil
	}
	return &protocol.Error{Status: protocol.StatusNotAuthorized,
		Message: fmt.Sprintf("principal %q may not act as member %q of consumer group %q: another principal joined it (use a member id of your own)",
			principal, member, g.Name)}
}

func invalidErr(format string, args ...any) error {
	return &protocol.Error{Status: protocol.StatusInvalid, Message: fmt.Sprintf(format, args...)}
}

func (g *ConsumerGroup) clone() *ConsumerGroup {
	c := *g
	c.Members = make(map[string]*ConsumerMember, len(g.Members))
	for id, m := range g.Members {
		m2 := *m
		m2.Topics = slices.Clone(m.Topics)
		c.Members[id] = &m2
	}
	c.Assignment = make(map[string][]string, len(g.Assignment))
	for t, owners := range g.Assignment {
		c.Assignment[t] = slices.Clone(owners)
	}
	c.Offsets = make(map[string]map[uint32]int64, len(g.Offsets))
	for t, qs := range g.Offsets {
		c.Offsets[t] = maps.Clone(qs)
	}
	if g.Epochs != nil {
		c.Epochs = make(map[string]map[uint32]uint32, len(g.Epochs))
		for t, qs := range g.Epochs {
			c.Epochs[t] = maps.Clone(qs)
		}
	}
	if g.Releasing != nil {
		c.Releasing = make(map[string]map[uint32]Holder, len(g.Releasing))
		for t, qs := range g.Releasing {
			c.Releasing[t] = maps.Clone(qs)
		}
	}
	return &c
}

func (g *ConsumerGroup) fill() {
	if g.Members == nil {
		g.Members = map[string]*ConsumerMember{}
	}
	if g.Assignment == nil {
		g.Assignment = map[string][]string{}
	}
	if g.Offsets == nil {
		g.Offsets = map[string]map[uint32]int64{}
	}
	for id, m := range g.Members {
		if m == nil {
			delete(g.Members, id)
		}
	}
}

// Topics is the union of the members' topics, sorted.
func (g ConsumerGroup) Topics() []string {
	var out []string
	for _, m := range g.Members {
		out = append(out, m.Topics...)
	}
	return NormalizeTopics(out)
}

// Queues returns member's queues by topic in the current generation,
// topics sorted and queues ascending.
func (g ConsumerGroup) Queues(member string) []QueueOffset {
	var out []QueueOffset
	topics := slices.Sorted(maps.Keys(g.Assignment))
	for _, t := range topics {
		for q, o := range g.Assignment[t] {
			if o == member {
				off, ok := g.Offsets[t][uint32(q)]
				if !ok {
					off = -1
				}
				out = append(out, QueueOffset{Topic: t, Queue: uint32(q), Offset: off, Epoch: g.Epochs[t][uint32(q)]})
			}
		}
	}
	return out
}

// Committed returns the committed offsets, by topic then queue.
func (g ConsumerGroup) Committed() []QueueOffset {
	var out []QueueOffset
	for _, t := range slices.Sorted(maps.Keys(g.Offsets)) {
		for _, q := range slices.Sorted(maps.Keys(g.Offsets[t])) {
			out = append(out, QueueOffset{Topic: t, Queue: q, Offset: g.Offsets[t][q]})
		}
	}
	return out
}

func (f *FSM) consumerGroup(name string, create bool) *ConsumerGroup {
	g := f.s.ConsumerGroups[name]
	if g == nil && create {
		g = &ConsumerGroup{Name: name}
		g.fill()
		f.s.ConsumerGroups[name] = g
	}
	return g
}

// checkJoin checks the names of a join and the topics it subscribes to,
// and returns the topics normalized.
func (f *FSM) checkJoin(group, member string, subscribed []string) ([]string, error) {
	if err := ValidateConsumerName("group", group); err != nil {
		return nil, invalidErr("%v", err)
	}
	if err := ValidateConsumerName("member", member); err != nil {
		return nil, invalidErr("%v", err)
	}
	topics := NormalizeTopics(subscribed)
	if len(topics) == 0 || len(topics) > MaxConsumerTopics {
		return nil, invalidErr("a member subscribes to 1 to %d topics, got %d", MaxConsumerTopics, len(topics))
	}
	for _, t := range topics {
		if f.s.Topics[t] == nil {
			return nil, &protocol.Error{Status: protocol.StatusUnknownTopic, Message: fmt.Sprintf("topic %q does not exist", t)}
		}
	}
	return topics, nil
}

func (f *FSM) joinGroup(c *JoinGroup) any {
	topics, err := f.checkJoin(c.Group, c.Member, c.Topics)
	if err != nil {
		return err
	}
	if c.SessionMillis < 0 {
		return invalidErr("session must not be negative, got %d ms", c.SessionMillis)
	}
	if g := f.s.ConsumerGroups[c.Group]; g != nil {
		if err := g.CheckBound(c.Member, c.Principal); err != nil {
			return err
		}
	}
	if err := checkFilter(c.Filter); err != nil {
		return err
	}
	if g := f.s.ConsumerGroups[c.Group]; g == nil || g.Members[c.Member] == nil {
		if err := g.refuseFilter(c.Member, c.Filter); err != nil {
			return err
		}
	}
	g := f.consumerGroup(c.Group, true)
	if g.Members[c.Member] == nil {
		g.takeFilter(c.Member, c.Filter)
	}
	if m := g.Members[c.Member]; m != nil && slices.Equal(m.Topics, topics) {
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
	joined, principal := c.At, c.Principal
	if m := g.Members[c.Member]; m != nil {
		joined = m.JoinedAt
		if principal == "" {
			principal = m.Principal
		}
	}
	g.Members[c.Member] = &ConsumerMember{Topics: topics, SessionMillis: c.SessionMillis, JoinedAt: joined, Principal: principal}
	f.rebalance(g, c.At)
	return &Result{Changed: true, Generation: g.Generation, Rebalanced: 1}
}

func (f *FSM) leaveGroup(c *LeaveGroup) any {
	g := f.s.ConsumerGroups[c.Group]
	if g == nil {
		return &Result{}
	}
	if c.ExpectGeneration != 0 && c.ExpectGeneration != g.Generation {
		return conflict("consumer group %q is at generation %d, not %d", c.Group, g.Generation, c.ExpectGeneration)
	}
	if g.Members[c.Member] == nil {
		return &Result{Generation: g.Generation}
	}
	if err := g.CheckBound(c.Member, c.Principal); err != nil {
		return err
	}
	delete(g.Members, c.Member)
	f.rebalance(g, c.At)
	return &Result{Changed: true, Generation: g.Generation, Rebalanced: 1}
}

func staleGeneration(format string, args ...any) error {
	return &protocol.Error{Status: protocol.StatusStaleGeneration, Message: fmt.Sprintf(format, args...)}
}

// commitGroup checks a commit's offsets and returns the group it commits
// to.
func (f *FSM) commitGroup(group string, offsets []QueueOffset) (*ConsumerGroup, error) {
	if len(offsets) > MaxCommitOffsets {
		return nil, invalidErr("a commit carries at most %d offsets, got %d", MaxCommitOffsets, len(offsets))
	}
	for _, o := range offsets {
		if o.Offset < 0 {
			return nil, invalidErr("offset of %s queue %d is %d; offsets are 0 or more", o.Topic, o.Queue, o.Offset)
		}
	}
	g := f.s.ConsumerGroups[group]
	if g == nil {
		return nil, notFound("consumer group %q", group)
	}
	return g, nil
}

func (f *FSM) commitOffsets(c *CommitOffsets) any {
	g, err := f.commitGroup(c.Group, c.Offsets)
	if err != nil {
		return err
	}
	if err := g.CheckBound(c.Member, c.Principal); err != nil {
		return err
	}
	if c.Generation != g.Generation {
		return staleGeneration("consumer group %q is at generation %d, not %d: rejoin", c.Group, g.Generation, c.Generation)
	}
	for _, o := range c.Offsets {
		owners := g.Assignment[o.Topic]
		if int(o.Queue) >= len(owners) || owners[o.Queue] != c.Member {
			return staleGeneration("%s queue %d is not assigned to member %q in generation %d of consumer group %q: rejoin",
				o.Topic, o.Queue, c.Member, g.Generation, c.Group)
		}
	}
	offsets := make([]QueueOffset, len(c.Offsets))
	for i, o := range c.Offsets {
		if o.EpochGroup != "" && f.s.queueGroup(o.Topic, o.Queue) != o.EpochGroup {
			o = f.s.readElsewhere(o)
		}
		offsets[i] = o
	}
	return &Result{Changed: g.setOffsets(offsets), Generation: g.Generation}
}

func (f *FSM) resetOffsets(c *ResetOffsets) any {
	if err := ValidateConsumerName("group", c.Group); err != nil {
		return invalidErr("%v", err)
	}
	if len(c.Offsets) > MaxCommitOffsets {
		return invalidErr("a reset carries at most %d offsets, got %d", MaxCommitOffsets, len(c.Offsets))
	}
	for _, o := range c.Offsets {
		t := f.s.Topics[o.Topic]
		if t == nil {
			return &protocol.Error{Status: protocol.StatusUnknownTopic, Message: fmt.Sprintf("topic %q does not exist", o.Topic)}
		}
		if int(o.Queue) >= len(t.Queues) {
			return invalidErr("topic %q has %d queues; there is no queue %d", o.Topic, len(t.Queues), o.Queue)
		}
		if o.Offset < 0 {
			return invalidErr("offset of %s queue %d is %d; offsets are 0 or more", o.Topic, o.Queue, o.Offset)
		}
	}
	if g := f.s.ConsumerGroups[c.Group]; g != nil && len(g.Members) > 0 {
		return &protocol.Error{Status: protocol.StatusGroupActive,
			Message: fmt.Sprintf("consumer group %q has %d members; offsets can be reset only when it has none", c.Group, len(g.Members))}
	}
	g := f.consumerGroup(c.Group, true)
	for _, o := range c.Offsets {
		qs := g.Offsets[o.Topic]
		if qs == nil {
			qs = map[uint32]int64{}
			g.Offsets[o.Topic] = qs
		}
		qs[o.Queue] = o.Offset
		delete(g.Epochs[o.Topic], o.Queue) // an operator's offset: read in no epoch
	}
	return &Result{Changed: true, Generation: g.Generation}
}

// topicGrew starts a new generation of every group subscribed to topic
// (which just gained queues), in name order. It returns how many.
func (f *FSM) topicGrew(topic string, at int64) int {
	n := 0
	for _, name := range slices.Sorted(maps.Keys(f.s.ConsumerGroups)) {
		g := f.s.ConsumerGroups[name]
		if _, ok := g.Assignment[topic]; ok {
			f.rebalance(g, at)
			n++
		}
	}
	return n
}

// rebalance moves g to its next generation with a new assignment; in a
// cooperative group, queues whose owner changed wait for their holder to
// release them (handOver).
func (f *FSM) rebalance(g *ConsumerGroup, at int64) {
	prev := g.Assignment
	defer func() {
		if g.Cooperative {
			g.handOver(prev, at)
		}
	}()
	g.Generation++
	g.ChangedAt = at
	next := make(map[string][]string)
	for _, t := range g.Topics() {
		n := 0
		if tp := f.s.Topics[t]; tp != nil {
			n = len(tp.Queues)
		}
		var subs []string
		for id, m := range g.Members {
			if slices.Contains(m.Topics, t) {
				subs = append(subs, id)
			}
		}
		slices.Sort(subs)
		next[t] = AssignQueues(n, g.Assignment[t], subs)
	}
	g.Assignment = next
}

// AssignQueues assigns n queues of one topic to subs (the subscribing
// members, sorted by id), given the previous owner of each queue (prev[q],
// "" or a member no longer subscribed for none). It is deterministic,
// balanced (every member gets n/len(subs) queues or one more) and sticky:
//
//  1. A member's kept queues are those it owned before, lowest first.
//  2. Targets: every member gets n/k; the n%k extra queues go to the
//     members keeping the most (counting at most n/k+1), ties by id, so as
//     few queues move as balance allows.
//  3. Each member keeps its old queues up to its target.
//  4. The other queues, lowest first, go to the least-loaded member still
//     under its target, ties by id.
//
// When a member joins a balanced group, the others keep their queues up to
// their targets and receive none: only the queues the newcomer needs move.
// It returns the owner of each queue (nil when subs is empty).
func AssignQueues(n int, prev []string, subs []string) []string {
	k := len(subs)
	if k == 0 || n <= 0 {
		return nil
	}
	base, extra := n/k, n%k
	isSub := make(map[string]bool, k)
	for _, m := range subs {
		isSub[m] = true
	}
	kept := make(map[string][]int, k)
	for q := 0; q < min(n, len(prev)); q++ {
		if o := prev[q]; isSub[o] {
			kept[o] = append(kept[o], q)
		}
	}
	order := slices.Clone(subs)
	sort.SliceStable(order, func(i, j int) bool {
		return min(len(kept[order[i]]), base+1) > min(len(kept[order[j]]), base+1)
	})
	target := make(map[string]int, k)
	for i, m := range order {
		target[m] = base
		if i < extra {
			target[m]++
		}
	}
	out := make([]string, n)
	load := make(map[string]int, k)
	for _, m := range subs {
		for _, q := range kept[m][:min(len(kept[m]), target[m])] {
			out[q] = m
			load[m]++
		}
	}
	for q := range out {
		if out[q] != "" {
			continue
		}
		best := ""
		for _, m := range subs {
			if load[m] < target[m] && (best == "" || load[m] < load[best]) {
				best = m
			}
		}
		out[q] = best
		load[best]++
	}
	return out
}

// GroupFilter is the filter a consumer group's members name in their
// PULLs: its canonical filter, "" for every message.
func (f *FSM) GroupFilter(name string) string {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if g := f.s.ConsumerGroups[name]; g != nil && g.Filter != "*" {
		return g.Filter
	}
	return ""
}

// ConsumerGroup returns a copy of a consumer group, and whether it exists.
func (f *FSM) ConsumerGroup(name string) (ConsumerGroup, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	g := f.s.ConsumerGroups[name]
	if g == nil {
		return ConsumerGroup{}, false
	}
	return *g.clone(), true
}

// CheckBound is ConsumerGroup.CheckBound on the group named group (nil if
// there is none), without copying it.
func (f *FSM) CheckBound(group, member, principal string) error {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if g := f.s.ConsumerGroups[group]; g != nil {
		return g.CheckBound(member, principal)
	}
	return nil
}

// ConsumerGroups returns copies of every consumer group, sorted by name.
func (f *FSM) ConsumerGroups() []ConsumerGroup {
	f.mu.RLock()
	defer f.mu.RUnlock()
	out := make([]ConsumerGroup, 0, len(f.s.ConsumerGroups))
	for _, name := range slices.Sorted(maps.Keys(f.s.ConsumerGroups)) {
		out = append(out, *f.s.ConsumerGroups[name].clone())
	}
	return out
}
