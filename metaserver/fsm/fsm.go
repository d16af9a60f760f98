package fsm

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// State is the whole registry. It is what snapshots hold.
type State struct {
	// Version increases with every change of groups, topics and members
	// (routes carry it). Producer identities do not move it: they change no
	// route, and moving it would invalidate every cached route.
	Version uint64                    `json:"version"`
	Groups  map[string]*routing.Group `json:"groups"`
	Topics  map[string]*routing.Topic `json:"topics"`
	// Members maps metaserver raft IDs to their RPC addresses.
	Members map[string]string `json:"members"`
	// NextProducerID is the next producer id to hand out; ids start at 1
	// (0 means "no producer"). A snapshot from before producer ids lacks it
	// and is read as 1.
	NextProducerID uint64 `json:"next_producer_id"`
	// Producers holds the current identity of each named producer.
	// Anonymous producers leave nothing here.
	Producers map[string]ProducerIdentity `json:"producers"`
	// ConsumerGroups holds the consumer groups by name (consumers.go). A
	// snapshot from before consumer groups lacks it and is read as none.
	ConsumerGroups map[string]*ConsumerGroup `json:"consumer_groups,omitempty"`
	// Principals are the ACL's principals by name (acl.go). A snapshot
	// from before the ACL lacks it and is read as none.
	Principals map[string]*PrincipalRecord `json:"principals,omitempty"`
	// ACLVersion grows by one at every change of Principals.
	ACLVersion uint64 `json:"acl_version,omitempty"`
	// Queues holds, by topic and queue, what the registry knows of queues
	// besides their group (groups.go): the base a moved queue continues
	// at, the ends brokers reported. A snapshot from before lacks it.
	Queues map[string]map[uint32]QueueState `json:"queues,omitempty"`
	// Txns are the transaction decisions held (txns.go). A snapshot from
	// before them lacks it and is read as none.
	Txns map[TxnKey]*TxnRecord `json:"txns,omitempty"`
	// Audit is the audit trail, oldest first (audit.go). A snapshot from
	// before it lacks it and is read as none.
	Audit []AuditRecord `json:"audit,omitempty"`
}

// ProducerIdentity is a producer's id and epoch.
type ProducerIdentity struct {
	ID    uint64 `json:"id"`
	Epoch uint16 `json:"epoch"`
}

// MaxProducerName is the longest producer name, in bytes.
const MaxProducerName = 255

// ValidateProducerName checks a producer name: empty (anonymous), or 1 to
// MaxProducerName bytes of letters a-z A-Z, digits, '.', '_' and '-', so a
// name prints and logs as it is. Its error names the first character that
// is not allowed, by character (protocol.ValidateName).
func ValidateProducerName(name string) error {
	if name == "" {
		return nil
	}
	return protocol.ValidateName("producer", name, MaxProducerName, "._-")
}

func newState() *State {
	return &State{Groups: map[string]*routing.Group{}, Topics: map[string]*routing.Topic{}, Members: map[string]string{},
		NextProducerID: 1, Producers: map[string]ProducerIdentity{}, ConsumerGroups: map[string]*ConsumerGroup{},
		Principals: map[string]*PrincipalRecord{}, Txns: map[TxnKey]*TxnRecord{}}
}

func (s *State) clone() *State {
	c := &State{Version: s.Version, Groups: make(map[string]*routing.Group, len(s.Groups)),
		Topics: make(map[string]*routing.Topic, len(s.Topics)), Members: make(map[string]string, len(s.Members)),
		NextProducerID: s.NextProducerID, Producers: maps.Clone(s.Producers)}
	if c.Producers == nil {
		c.Producers = map[string]ProducerIdentity{}
	}
	for k, g := range s.Groups {
		g2 := *g
		g2.History = slices.Clone(g.History)
		g2.Slaves = slices.Clone(g.Slaves)
		g2.InSync = slices.Clone(g.InSync)
		g2.Eligible = slices.Clone(g.Eligible)
		c.Groups[k] = &g2
	}
	for k, t := range s.Topics {
		t2 := *t
		t2.Queues = slices.Clone(t.Queues)
		c.Topics[k] = &t2
	}
	for k, v := range s.Members {
		c.Members[k] = v
	}
	c.ConsumerGroups = make(map[string]*ConsumerGroup, len(s.ConsumerGroups))
	for k, g := range s.ConsumerGroups {
		c.ConsumerGroups[k] = g.clone()
	}
	c.Principals = maps.Clone(s.Principals) // records are never modified, only replaced
	if c.Principals == nil {
		c.Principals = map[string]*PrincipalRecord{}
	}
	c.ACLVersion = s.ACLVersion
	c.Queues = cloneQueueStates(s.Queues)
	c.Txns = cloneTxns(s.Txns)
	// Records are never modified and the live slice only grows past the
	// clone's end or moves its start: the clone shares them (capped, so
	// that an append to it copies).
	c.Audit = s.Audit[:len(s.Audit):len(s.Audit)]
	return c
}

// Result is what a successful Apply returns through the future's Response.
type Result struct {
	Changed bool   // false when the command found nothing to do
	Version uint64 // the object's version after the command (group or topic)
	// Producer is the identity InitProducer allocated.
	Producer ProducerIdentity
	// Generation is the consumer group's generation after a consumer group
	// command.
	Generation uint64
	// Rebalanced is how many consumer groups moved to a new generation.
	Rebalanced int
	// Txn is the transaction's decision after TxnDecide (the one recorded
	// before, when Changed is false) or TxnDone (nil: none is held).
	Txn *TxnRecord
	// Expired is how many decisions TxnExpire, or records AuditExpire,
	// deleted.
	Expired int
}

// FSM is the registry's raft.FSM.
type FSM struct {
	mu sync.RWMutex
	s  *State
	// aclVersion is s.ACLVersion, written under mu, read without it;
	// aclTable is the last table ACL built (acl.go).
	aclVersion atomic.Uint64
	aclTable   atomic.Pointer[auth.Table]
}

// New returns an empty registry.
func New() *FSM { return &FSM{s: newState()} }

var _ raft.FSM = (*FSM)(nil)

func conflict(format string, args ...any) error {
	return &protocol.Error{Status: protocol.StatusConflict, Message: fmt.Sprintf(format, args...)}
}

func notFound(format string, args ...any) error {
	return &protocol.Error{Status: protocol.StatusNotFound, Message: fmt.Sprintf(format, args...)}
}

// Apply applies one committed log entry. It returns *Result or an error.
func (f *FSM) Apply(l *raft.Log) any {
	if l.Type != raft.LogCommand {
		return nil
	}
	c, err := Decode(l.Data)
	if err != nil {
		// A committed entry no node can decode: the log is broken.
		panic(fmt.Sprintf("fsm: undecodable committed entry at index %d: %v", l.Index, err))
	}
	if c == nil {
		return &Result{}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	res := f.apply(c)
	f.audit(l, c, res)
	return res
}

func (f *FSM) apply(c Command) any {
	s := f.s
	switch c := c.(type) {
	case *RegisterBroker:
		return f.registerBroker(c)
	case *SetGroupReasons:
		g := s.Groups[c.Group]
		if g == nil {
			return notFound("broker group %q does not exist", c.Group)
		}
		if c.ExpectVersion != 0 && c.ExpectVersion != g.Version {
			return conflict("group %q is at version %d, not %d", c.Group, g.Version, c.ExpectVersion)
		}
		next := (g.Reasons | c.Set) &^ c.Clear
		if next == g.Reasons {
			return &Result{Version: g.Version}
		}
		g.Reasons = next
		g.ChangedAt = c.At
		return f.bumpGroup(g)
	case *CreateTopic:
		if err := protocol.ValidateTopic(c.Name); err != nil {
			return &protocol.Error{Status: protocol.StatusInvalid, Message: err.Error()}
		}
		if t := s.Topics[c.Name]; t != nil {
			if slices.Equal(t.Queues, c.Queues) {
				return &Result{Version: t.Version} // a retried create
			}
			return conflict("topic %q already exists", c.Name)
		}
		if len(c.Queues) == 0 {
			return &protocol.Error{Status: protocol.StatusInvalid, Message: "a topic needs at least one queue"}
		}
		for _, g := range c.Queues {
			if err := f.placeable(g); err != nil {
				return err
			}
		}
		s.Version++
		s.Topics[c.Name] = &routing.Topic{Name: c.Name, Queues: slices.Clone(c.Queues), Version: s.Version}
		return &Result{Changed: true, Version: s.Version}
	case *AddQueues:
		t := s.Topics[c.Topic]
		if t == nil {
			return notFound("topic %q does not exist", c.Topic)
		}
		if c.ExpectVersion != 0 && c.ExpectVersion != t.Version {
			return conflict("topic %q is at version %d, not %d", c.Topic, t.Version, c.ExpectVersion)
		}
		for _, g := range c.Groups {
			if err := f.placeable(g); err != nil {
				return err
			}
		}
		if len(c.Groups) == 0 {
			return &Result{Version: t.Version}
		}
		s.Version++
		t.Queues = append(t.Queues, c.Groups...)
		t.Version = s.Version
		return &Result{Changed: true, Version: t.Version, Rebalanced: f.topicGrew(c.Topic, c.At)}
	case *RemoveGroup:
		g := s.Groups[c.Group]
		if g == nil {
			return &Result{} // already gone
		}
		if c.ExpectVersion != 0 && c.ExpectVersion != g.Version {
			return conflict("group %q is at version %d, not %d", c.Group, g.Version, c.ExpectVersion)
		}
		for _, t := range sortedTopics(s) {
			if slices.Contains(t.Queues, c.Group) {
				return conflict("group %q holds queues of topic %q", c.Group, t.Name)
			}
		}
		delete(s.Groups, c.Group)
		s.Version++
		return &Result{Changed: true, Version: s.Version}
	case *RemoveBroker:
		g := s.Groups[c.Group]
		if g == nil {
			return notFound("broker group %q does not exist", c.Group)
		}
		switch c.Role {
		case routing.RoleMaster:
			if g.Master == (routing.Broker{}) {
				return &Result{Version: g.Version}
			}
			g.Master = routing.Broker{}
		case routing.RoleSlave:
			if g.Slave == (routing.Broker{}) {
				return &Result{Version: g.Version}
			}
			return f.removeGroupBroker(&RemoveGroupBroker{Group: g.Name, Broker: g.Slave.ID, At: g.ChangedAt})
		default:
			return &protocol.Error{Status: protocol.StatusInvalid, Message: fmt.Sprintf("unknown role %q", c.Role)}
		}
		return f.bumpGroup(g)
	case *SetMember:
		if s.Members[c.ID] == c.RPCAddr {
			return &Result{}
		}
		s.Members[c.ID] = c.RPCAddr
		s.Version++
		return &Result{Changed: true, Version: s.Version}
	case *RemoveMember:
		if _, ok := s.Members[c.ID]; !ok {
			return &Result{}
		}
		delete(s.Members, c.ID)
		s.Version++
		return &Result{Changed: true, Version: s.Version}
	case *InitProducer:
		return f.initProducer(c)
	case *Promote:
		return f.promote(c)
	case *SetEpochStart:
		g := s.Groups[c.Group]
		if g == nil {
			return notFound("broker group %q does not exist", c.Group)
		}
		n := len(g.History)
		if n == 0 || g.Epoch != c.Epoch || g.History[n-1].Epoch != c.Epoch {
			return conflict("group %q is at epoch %d, not %d", c.Group, g.Epoch, c.Epoch)
		}
		if c.Start <= g.History[n-1].Start || g.History[n-1].Fixed {
			return &Result{Version: g.Version}
		}
		g.History = slices.Clone(g.History)
		g.History[n-1].Start = c.Start
		return f.bumpGroup(g)
	case *FixEpochStart:
		return f.fixEpochStart(c)
	case *ResyncBroker:
		return f.resyncBroker(c)
	case *ResyncDone:
		return f.resyncDone(c)
	case *JoinMember:
		return f.joinMember(c)
	case *LeaveMember:
		return f.leaveMember(c)
	case *CommitHeld:
		return f.commitHeld(c)
	case *ReleaseQueues:
		return f.releaseQueues(c)
	case *SettleGroup:
		return f.settleGroup(c)
	case *DeleteGroup:
		return f.deleteGroup(c)
	case *SetGroupFilter:
		return f.setGroupFilter(c)
	case *JoinGroup:
		return f.joinGroup(c)
	case *LeaveGroup:
		return f.leaveGroup(c)
	case *CommitOffsets:
		return f.commitOffsets(c)
	case *ResetOffsets:
		return f.resetOffsets(c)
	case *SetPrincipal:
		return f.setPrincipal(c)
	case *RemovePrincipal:
		return f.removePrincipal(c)
	case *AdmitGroup:
		return f.admitGroup(c)
	case *RetireGroup:
		return f.retireGroup(c)
	case *RecordQueueEnds:
		return f.recordQueueEnds(c)
	case *JoinSlave:
		return f.joinSlave(c)
	case *AlterSyncSet:
		return f.alterSyncSet(c)
	case *SetGroupPolicy:
		return f.setGroupPolicy(c)
	case *RemoveGroupBroker:
		return f.removeGroupBroker(c)
	case *TxnDecide:
		return f.txnDecide(c)
	case *TxnDone:
		return f.txnDone(c)
	case *TxnExpire:
		return f.txnExpire(c)
	case *AuditExpire:
		return f.auditExpire(c)
	case *AuditNote:
		return f.auditNote(c)
	}
	return &protocol.Error{Status: protocol.StatusInvalid, Message: fmt.Sprintf("unknown command %T", c)}
}

func (f *FSM) registerBroker(c *RegisterBroker) any {
	if c.Group == "" || c.Broker.ID == "" || c.Broker.Addr == "" {
		return &protocol.Error{Status: protocol.StatusInvalid, Message: "register: group, broker id and address are required"}
	}
	if !c.Role.Valid() {
		return &protocol.Error{Status: protocol.StatusInvalid, Message: fmt.Sprintf("unknown role %q", c.Role)}
	}
	g := f.s.Groups[c.Group]
	if err := refuseRetired(g, c.Broker.ID); err != nil {
		return err
	}
	if g == nil {
		g = &routing.Group{Name: c.Group, ChangedAt: c.At}
		if c.Pending {
			g.Admission = routing.Pending
		}
		f.s.Groups[c.Group] = g
	}
	role, known := g.RoleOf(c.Broker.ID)
	if !known {
		// A newcomer gets its preferred place if it is free, else the
		// other; a third broker joins with JoinSlave.
		other := routing.RoleSlave
		if c.Role == routing.RoleSlave {
			other = routing.RoleMaster
		}
		switch {
		case free(g, c.Role):
			role = c.Role
		case c.Role == routing.RoleSlave && c.MoreSlaves && len(g.Slaves) < routing.MaxSlaves:
			role = routing.RoleSlave
		case free(g, other):
			role = other
		default:
			if g.Version == 0 {
				delete(f.s.Groups, c.Group)
			}
			return conflict("group %q already has master %s and slave %s; remove one before %s can join",
				c.Group, g.Master.ID, g.Slave.ID, c.Broker.ID)
		}
	}
	if role == routing.RoleSlave {
		if b, ok := g.SlaveByID(c.Broker.ID); ok && b == c.Broker && g.Version != 0 {
			return &Result{Version: g.Version}
		}
		if known {
			g.Slaves = replaceSlave(g.Slaves, c.Broker)
		} else {
			g.Slaves = append(slices.Clone(g.Slaves), c.Broker)
		}
		g.MirrorSlave()
		return f.bumpGroup(g)
	}
	if g.Master == c.Broker && g.Version != 0 {
		return &Result{Version: g.Version}
	}
	g.Master = c.Broker
	if !known {
		// A new master: a new epoch, starting where its log ends (the
		// broker takes no write before the reply, so its start is fixed).
		f.newEpoch(g, c.Broker.ID, c.LogEnd, c.At, true)
	}
	return f.bumpGroup(g)
}

// free reports whether a newcomer may register into role (which must be
// valid): the group has no master, or no slave.
func free(g *routing.Group, role routing.Role) bool {
	if role == routing.RoleMaster {
		return g.Master.ID == ""
	}
	return len(g.Slaves) == 0
}

// newEpoch starts the group's next epoch under master at log offset start;
// fixed says whether that start is final already.
func (f *FSM) newEpoch(g *routing.Group, master string, start, at int64, fixed bool) {
	g.Epoch++
	g.History = append(g.History, routing.EpochRecord{Epoch: g.Epoch, Master: master, Start: start, At: at, Fixed: fixed})
	if n := len(g.History) - routing.MaxEpochHistory; n > 0 {
		g.History = slices.Clone(g.History[n:])
	}
}

func (f *FSM) promote(c *Promote) any {
	g := f.s.Groups[c.Group]
	if g == nil {
		return notFound("broker group %q does not exist", c.Group)
	}
	next, isSlave := g.SlaveByID(c.Slave)
	if g.Epoch != c.Epoch || g.Master.ID != c.Master || !isSlave || c.Slave == "" {
		return conflict("group %q is at epoch %d with master %q and slaves %v, not epoch %d with master %q and slave %q",
			c.Group, g.Epoch, g.Master.ID, slaveIDs(g), c.Epoch, c.Master, c.Slave)
	}
	// The other slaves stay, and so do the sync set's other members: they
	// hold every HIGH message the old master answered, as the new master
	// does, and follow it from where its epoch begins.
	g.Master = next
	g.Slaves = slices.DeleteFunc(slices.Clone(g.Slaves), func(b routing.Broker) bool { return b.ID == c.Slave })
	if g.IsInSync(c.Slave) {
		g.InSync = slices.DeleteFunc(slices.Clone(g.InSync), func(id string) bool { return id == c.Slave })
		g.SyncVersion++
	}
	g.Eligible = slices.DeleteFunc(slices.Clone(g.Eligible), func(id string) bool { return id == c.Slave })
	g.MirrorSlave()
	f.newEpoch(g, g.Master.ID, c.Start, c.At, false)
	g.Reasons &^= routing.HeartbeatLost | routing.SlaveLag
	g.ChangedAt = c.At
	return f.bumpGroup(g)
}

// slaveIDs lists the ids of g's slaves.
func slaveIDs(g *routing.Group) []string {
	out := make([]string, len(g.Slaves))
	for i, b := range g.Slaves {
		out[i] = b.ID
	}
	return out
}

func (f *FSM) initProducer(c *InitProducer) any {
	if err := ValidateProducerName(c.Name); err != nil {
		return &protocol.Error{Status: protocol.StatusInvalid, Message: err.Error()}
	}
	s := f.s
	if c.Name != "" {
		if p, ok := s.Producers[c.Name]; ok && p.Epoch < math.MaxUint16 {
			p.Epoch++
			s.Producers[c.Name] = p
			return &Result{Changed: true, Producer: p}
		}
	}
	if s.NextProducerID == math.MaxUint64 { // never in practice; and the counter never wraps to 0
		return &protocol.Error{Status: protocol.StatusInternal, Message: "producer ids are exhausted"}
	}
	p := ProducerIdentity{ID: s.NextProducerID}
	s.NextProducerID++
	if c.Name != "" {
		s.Producers[c.Name] = p
	}
	return &Result{Changed: true, Producer: p}
}

// Producer returns a named producer's current identity, and whether the
// name is known.
func (f *FSM) Producer(name string) (ProducerIdentity, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	p, ok := f.s.Producers[name]
	return p, ok
}

// NextProducerID is the id the next fresh producer identity will get.
func (f *FSM) NextProducerID() uint64 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.s.NextProducerID
}

func (f *FSM) bumpGroup(g *routing.Group) *Result {
	f.s.Version++
	g.Version = f.s.Version
	return &Result{Changed: true, Version: g.Version}
}

func sortedTopics(s *State) []*routing.Topic {
	out := make([]*routing.Topic, 0, len(s.Topics))
	for _, t := range s.Topics {
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Version is the registry's version.
func (f *FSM) Version() uint64 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.s.Version
}

// Route returns the route of a topic, and whether it exists.
func (f *FSM) Route(topic string) (routing.Route, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	t := f.s.Topics[topic]
	if t == nil {
		return routing.Route{}, false
	}
	r := routing.Route{Topic: topic, Version: f.s.Version, Queues: make([]routing.QueueRoute, len(t.Queues))}
	for i, gname := range t.Queues {
		q := routing.QueueRoute{Queue: uint32(i), Group: gname}
		if g := f.s.Groups[gname]; g != nil {
			q.Master = g.Master.Addr
			q.Slave = g.Slave.Addr
			q.Epoch = g.Epoch
			q.Writable = g.Writable() && g.Master.Addr != ""
		}
		q.Base = f.s.Queues[topic][uint32(i)].Base
		r.Queues[i] = q
	}
	return r, true
}

// Group returns a copy of a group, and whether it exists.
func (f *FSM) Group(name string) (routing.Group, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	g := f.s.Groups[name]
	if g == nil {
		return routing.Group{}, false
	}
	return *g, true
}

// Groups returns copies of every group, sorted by name.
func (f *FSM) Groups() []routing.Group {
	f.mu.RLock()
	defer f.mu.RUnlock()
	out := make([]routing.Group, 0, len(f.s.Groups))
	for _, g := range f.s.Groups {
		out = append(out, *g)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Topics returns copies of every topic, sorted by name.
func (f *FSM) Topics() []routing.Topic {
	f.mu.RLock()
	defer f.mu.RUnlock()
	out := make([]routing.Topic, 0, len(f.s.Topics))
	for _, t := range sortedTopics(f.s) {
		t2 := *t
		t2.Queues = slices.Clone(t.Queues)
		out = append(out, t2)
	}
	return out
}

// Members returns the metaserver nodes' RPC addresses by raft ID.
func (f *FSM) Members() map[string]string {
	f.mu.RLock()
	defer f.mu.RUnlock()
	out := make(map[string]string, len(f.s.Members))
	for k, v := range f.s.Members {
		out[k] = v
	}
	return out
}

// State returns a deep copy of the whole state.
func (f *FSM) State() *State {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.s.clone()
}

// Snapshot copies the state; Persist writes the copy.
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) {
	return &snapshot{s: f.State()}, nil
}

// Restore replaces the state with a snapshot's.
func (f *FSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	s := newState()
	if err := json.NewDecoder(rc).Decode(s); err != nil {
		return fmt.Errorf("fsm: restore: %w", err)
	}
	if s.Groups == nil {
		s.Groups = map[string]*routing.Group{}
	}
	if s.Topics == nil {
		s.Topics = map[string]*routing.Topic{}
	}
	if s.Members == nil {
		s.Members = map[string]string{}
	}
	if s.NextProducerID == 0 {
		s.NextProducerID = 1 // a snapshot from before producer ids
	}
	if s.Producers == nil {
		s.Producers = map[string]ProducerIdentity{}
	}
	if s.ConsumerGroups == nil {
		s.ConsumerGroups = map[string]*ConsumerGroup{} // a snapshot from before consumer groups
	}
	for name, g := range s.ConsumerGroups {
		if g == nil {
			delete(s.ConsumerGroups, name)
			continue
		}
		g.fill()
	}
	if s.Principals == nil {
		s.Principals = map[string]*PrincipalRecord{} // a snapshot from before the ACL
	}
	for name, p := range s.Principals {
		if p == nil {
			delete(s.Principals, name)
		}
	}
	if s.Txns == nil {
		s.Txns = map[TxnKey]*TxnRecord{} // a snapshot from before transaction decisions
	}
	for k, r := range s.Txns {
		if r == nil {
			delete(s.Txns, k)
		}
	}
	for _, g := range s.Groups {
		migrateSlaves(g)
		if g.Epoch == 0 && g.Master.ID != "" {
			// A snapshot from before epochs: its master leads epoch 1.
			g.Epoch = 1
			g.History = []routing.EpochRecord{{Epoch: 1, Master: g.Master.ID, At: g.ChangedAt}}
		}
	}
	f.mu.Lock()
	f.s = s
	f.aclVersion.Store(s.ACLVersion)
	f.aclTable.Store(nil)
	f.mu.Unlock()
	return nil
}

type snapshot struct{ s *State }

func (s *snapshot) Persist(sink raft.SnapshotSink) error {
	if err := json.NewEncoder(sink).Encode(s.s); err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("fsm: persist snapshot: %w", err)
	}
	return sink.Close()
}

func (s *snapshot) Release() {}
