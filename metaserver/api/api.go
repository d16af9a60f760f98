package api

import "github.com/ferrymq/ferrymq/routing"

// Heartbeat is what a broker sends to the metaserver leader every interval.
type Heartbeat struct {
	Group    string       `json:"group"`
	Role     routing.Role `json:"role"`
	BrokerID string       `json:"broker_id"`
	Addr     string       `json:"addr"`
	HAAddr   string       `json:"ha_addr,omitempty"`
	// LogEnd is the broker's commit-log end offset.
	LogEnd int64 `json:"log_end"`
	// LogStart is where the commit log starts (retention moves it): the
	// log holds LogEnd-LogStart bytes on disk.
	LogStart int64 `json:"log_start,omitempty"`
	// RetentionBytes is the broker's -retention-bytes (0: it keeps
	// everything).
	RetentionBytes int64 `json:"retention_bytes,omitempty"`
	// Epoch is the group epoch the broker last learned (0: none yet).
	Epoch uint32 `json:"epoch,omitempty"`
	// Slave only: the master's log end in the last fetch answer, so the
	// leader knows how far behind the slave is even without the master.
	MasterEnd int64 `json:"master_end,omitempty"`
	// EpochStart (master only) is where the broker's log began the epoch it
	// leads: its log end when it took the epoch over, kept on its disk. The
	// leader fixes the epoch's start to it once (fsm.FixEpochStart). nil
	// while the broker leads no epoch.
	EpochStart *int64 `json:"epoch_start,omitempty"`
	// Broken says why the broker cannot follow its master because of its
	// own log ("" if it can): the judge neither promotes it nor counts its
	// lag against the group, and an operator resyncs it.
	Broken string `json:"broken,omitempty"`
	// Waiting says why a slave does not follow yet for a reason that will
	// pass by itself (say the new master has not confirmed where its epoch
	// began); "" if it does not wait.
	Waiting string `json:"waiting,omitempty"`
	// ResyncDone is the Seq of the last resync order the broker carried
	// out (routing.Group.Resync).
	ResyncDone uint64 `json:"resync_done,omitempty"`
	// LastCut is the broker's last truncation on rejoining as slave.
	LastCut *Cut `json:"last_cut,omitempty"`
	// Master only: the slowest member of the sync set as the master sees
	// it (or the slowest slave when the set is empty): whether it is
	// connected, what it acknowledged, how far behind it is in bytes and
	// how long it has not been caught up (0 if it is).
	SlaveConnected bool  `json:"slave_connected"`
	SlaveAckOffset int64 `json:"slave_ack_offset"`
	LagBytes       int64 `json:"lag_bytes"`
	LagMillis      int64 `json:"lag_millis"`
	// HighAcked (master only) bounds every HIGH message the master has
	// answered OK in its epoch: each ends at or below it. A slave promoted
	// in its place must hold at least that much.
	HighAcked int64 `json:"high_acked,omitempty"`
	// Replicas (master only) is every slave as the master sees it.
	Replicas []ReplicaStatus `json:"replicas,omitempty"`
	// Producers is how many (producer, queue) pairs the broker's dedupe
	// state tracks.
	Producers int `json:"producers,omitempty"`
	// Duplicates is how many duplicate sends the broker absorbed since it
	// started.
	Duplicates int64 `json:"duplicates,omitempty"`
	// QueueEnds (master only) is the next offset of every queue of its
	// commit log whose end moved since its last heartbeat (of every queue,
	// every 5th heartbeat): the registry records them, so that a queue
	// moved off the group when it is dead continues past them.
	QueueEnds []QueueEnd `json:"queue_ends,omitempty"`
}

// ReplicaStatus is one slave as its master sees it.
type ReplicaStatus struct {
	ID        string `json:"id"`
	Connected bool   `json:"connected"` // it fetched within its fetch wait and a margin
	AckOffset int64  `json:"ack_offset"`
	LagBytes  int64  `json:"lag_bytes"`
	LagMillis int64  `json:"lag_millis"` // how long it has not been caught up (0 if it is)
	InSync    bool   `json:"in_sync"`    // the master waits for it (the committed set, or an addition on its way)
}

// Cut is what a former master cut from its log when it rejoined its group
// as the slave of Epoch: the NORMAL messages a failover lost.
type Cut struct {
	Epoch    uint32 `json:"epoch"`
	Bytes    int64  `json:"bytes"`
	Records  int    `json:"records"`
	SideFile string `json:"side_file"`
}

// HeartbeatReply carries the group as the registry has it; the broker
// enforces its state.
type HeartbeatReply struct {
	Group routing.Group `json:"group"`
	// SessionMillis is the metaserver's session: a broker's write lease
	// lasts no longer than it (nor than the broker's own session), so the
	// leader's wait before a promotion always outlasts the old master's lease.
	SessionMillis int64 `json:"session_ms"`
	// ACLVersion is the registry's ACL version: a broker whose copy of the
	// permission table is older fetches the ACL (ACL_GET).
	ACLVersion uint64 `json:"acl_version,omitempty"`
	// LagTimeMillis is the metaserver's -lag-time: a member of a sync set
	// not caught up this long leaves it (one setting for the cluster, as
	// the session is). 0: the broker's own default.
	LagTimeMillis int64 `json:"lag_time_ms,omitempty"`
	// ReadableEnd (to a slave) is the log offset every member of its
	// group's sync set held at its master's last report in this epoch: a
	// slave serves reads up to it, so a consumer never reads a message a
	// failover to another member would not have. nil: no limit (an empty
	// set, or no word from the master in this epoch).
	ReadableEnd *int64 `json:"readable_end,omitempty"`
	// NowMillis is the leader's clock when it answered (unix
	// milliseconds): a broker compares it with its own (the clock that
	// decides when delayed messages are due) and exports the difference.
	NowMillis int64 `json:"now_ms,omitempty"`
}

// GroupInfo is a group with what only the leader knows: its heartbeats.
type GroupInfo struct {
	routing.Group
	State   string `json:"state"`   // RW or RO
	Reason  string `json:"reason"`  // e.g. "heartbeat-lost,slave-lag"
	Holders int    `json:"holders"` // queues routed to the group
	// MasterHeartbeatAgeMillis is the age of the last heartbeat from the
	// master, -1 if none was seen since this leader took over.
	MasterHeartbeatAgeMillis int64     `json:"master_heartbeat_age_ms"`
	SlaveHeartbeatAgeMillis  int64     `json:"slave_heartbeat_age_ms"`
	Last                     Heartbeat `json:"last_master_heartbeat"`
	LastSlave                Heartbeat `json:"last_slave_heartbeat"`
	// Failover says why the group's slave is not being promoted while its
	// master is lost, or what the last promotion did ("" if nothing).
	Failover string `json:"failover,omitempty"`
	// Members is each broker as the leader's heartbeats show it: the
	// master, every slave, and then the former masters that a failover took
	// out of the group (Role "former-master") that this leader heard, so a
	// dead master stays in view with the age of its last heartbeat.
	Members []BrokerStatus `json:"members"`
	// LeaderForMillis is how long the answering leader has led: heartbeats
	// are kept only in the leader's memory, so it knows none older.
	LeaderForMillis int64 `json:"leader_for_ms"`
	// SessionMillis is the leader's session: a broker unheard for longer
	// is lost.
	SessionMillis int64 `json:"session_ms"`
	// ACLVersion is the registry's ACL version: a broker whose copy of the
	// permission table is older fetches the ACL (ACL_GET).
	ACLVersion uint64 `json:"acl_version,omitempty"`
}

// Broker roles in BrokerStatus besides the registry's master and slave.
const (
	// RoleFormerMaster is a master that a failover took out of its group;
	// it joins again as the slave when it comes back.
	RoleFormerMaster = "former-master"
)

// BrokerStatus is one broker of a group as the leader's heartbeats show it.
type BrokerStatus struct {
	ID   string `json:"id"`
	Addr string `json:"addr"`
	// Role is the registry's ("master" or "slave"), or RoleFormerMaster.
	Role string `json:"role"`
	// Heard is whether this leader has taken a heartbeat from the broker
	// since it took over (LeaderForMillis ago).
	Heard bool `json:"heard"`
	// LastHeartbeatAgeMillis is the age of the broker's last heartbeat, in
	// whatever role it sent it; -1 if it sent none since this leader took
	// over (an earlier leader may have heard it: ask the age of this
	// leadership, LeaderForMillis).
	LastHeartbeatAgeMillis int64 `json:"last_heartbeat_age_ms"`
	// Alive is true when the broker was heard within the session.
	Alive bool `json:"alive"`
	// Lost is true when the broker has been silent for more than the
	// session (counted from this leader's takeover when it has not been
	// heard since). A broker neither alive nor lost is one that a new
	// leader has not heard yet, within its first session.
	Lost bool `json:"lost"`
	// ReplacedAtEpoch is, for a former master, the epoch whose promotion
	// replaced it.
	ReplacedAtEpoch uint32 `json:"replaced_at_epoch,omitempty"`
	// ReplacedBy is, for a former master, the broker promoted over it.
	ReplacedBy string `json:"replaced_by,omitempty"`
	// For a slave: whether it is in the group's committed sync set, and
	// how its master last saw it (its Replicas entry; zero when the
	// master has not reported it): what it acknowledged, how far behind
	// it is in bytes, and how long it has not been caught up (0 if it is).
	InSync    bool  `json:"in_sync,omitempty"`
	AckOffset int64 `json:"ack_offset,omitempty"`
	LagBytes  int64 `json:"lag_bytes,omitempty"`
	LagMillis int64 `json:"lag_millis,omitempty"`
	// Reported is whether the master's last heartbeat reported the slave
	// (AckOffset and the lags are its).
	Reported bool `json:"reported,omitempty"`
	// For a slave, from its own last heartbeat: why it cannot follow its
	// master (Broken, it needs an operator's resync) or what it waits for
	// before it can (Waiting); "" when nothing.
	Broken  string `json:"broken,omitempty"`
	Waiting string `json:"waiting,omitempty"`
	// Eligible (a slave) is whether a failover could promote it now, were
	// its master lost (the margin, the loss limit and the quorum rule
	// aside); else NotEligible says why, as a word (IneligibleReason, the
	// failover refusal metric's reason) and a sentence.
	Eligible         bool   `json:"eligible,omitempty"`
	IneligibleReason string `json:"ineligible_reason,omitempty"`
	NotEligible      string `json:"not_eligible,omitempty"`
}

// InitProducerRequest asks the metaserver leader for a producer identity.
// An empty Name is an anonymous producer: a fresh id at epoch 0 every
// time. A named producer (1 to 255 bytes of letters, digits, '.', '_', '-')
// keeps its id across instances and gets the next epoch, which fences the
// earlier instances; past epoch 65535 it gets a fresh id at epoch 0.
type InitProducerRequest struct {
	Name string `json:"name,omitempty"`
}

// InitProducerReply is a producer identity, unique in the cluster: no other
// producer has ever been given this ID, and for a named producer no earlier
// instance had this Epoch.
type InitProducerReply struct {
	ID    uint64 `json:"id"`
	Epoch uint16 `json:"epoch"`
}

// CreateTopicRequest creates a topic with Queues queues spread over the
// writable groups (or exactly on Groups if given).
type CreateTopicRequest struct {
	Name   string   `json:"name"`
	Queues int      `json:"queues"`
	Groups []string `json:"groups,omitempty"`
	// IfMissing makes creating an existing topic return it instead of an error.
	IfMissing bool `json:"if_missing,omitempty"`
}

// AddQueuesRequest adds Count queues to a topic, spread over writable groups.
type AddQueuesRequest struct {
	Topic string `json:"topic"`
	Count int    `json:"count"`
}

// SetGroupModeRequest marks a group read-only or writable as an admin.
type SetGroupModeRequest struct {
	Group    string `json:"group"`
	ReadOnly bool   `json:"read_only"`
}

// VoterRequest adds or removes a metaserver node.
type VoterRequest struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_addr,omitempty"`
	RPCAddr  string `json:"rpc_addr,omitempty"`
}

// RaftMember is one node of the metaserver cluster.
type RaftMember struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_addr"`
	RPCAddr  string `json:"rpc_addr"`
	Suffrage string `json:"suffrage"`
	Leader   bool   `json:"leader"`
}

// RaftStatus is one node's view of the Raft cluster.
type RaftStatus struct {
	Node         string `json:"node"`
	State        string `json:"state"`
	LeaderID     string `json:"leader_id"`
	LeaderAddr   string `json:"leader_rpc_addr"`
	Term         uint64 `json:"term"`
	LastIndex    uint64 `json:"last_index"`
	CommitIndex  uint64 `json:"commit_index"`
	AppliedIndex uint64 `json:"applied_index"`
	// LastContactMillis is how long ago this node last heard from the
	// leader, by its raft stats: 0 on the leader itself, -1 if never.
	LastContactMillis int64        `json:"last_contact_ms"`
	Members           []RaftMember `json:"members"`
}

// MemberStatus is one member of the Raft configuration as it answered for
// itself when asked directly at its RPC address.
type MemberStatus struct {
	RaftMember
	// Reachable is whether the member answered; Error is why not.
	Reachable bool   `json:"reachable"`
	Error     string `json:"error,omitempty"`
	// State is the member's own word: Leader, Follower, Candidate ("" if
	// it did not answer).
	State        string `json:"state"`
	Term         uint64 `json:"term"`
	LastIndex    uint64 `json:"last_index"`
	CommitIndex  uint64 `json:"commit_index"`
	AppliedIndex uint64 `json:"applied_index"`
	// LastContactMillis is how long ago the member last heard from the
	// leader: 0 on the leader, -1 if never or unreachable.
	LastContactMillis int64 `json:"last_contact_ms"`
	// AppliedBehind is the leader's applied index less this member's; -1
	// if either did not answer.
	AppliedBehind int64 `json:"applied_behind"`
}

// MetaStatus is the metaserver cluster with every member asked for its own
// view. The leader is the member that says it leads (at the highest term);
// Term and the indexes are its own (LeaderID is "" and they are 0 when no
// reachable member leads). Members is the Raft configuration as the node
// that answered first (Node) has it.
type MetaStatus struct {
	Node         string         `json:"node"`
	LeaderID     string         `json:"leader_id"`
	LeaderAddr   string         `json:"leader_rpc_addr"`
	Term         uint64         `json:"term"`
	LastIndex    uint64         `json:"last_index"`
	CommitIndex  uint64         `json:"commit_index"`
	AppliedIndex uint64         `json:"applied_index"`
	Members      []MemberStatus `json:"members"`
}

// ResyncBrokerRequest orders a broker that is not its group's master to set
// its log aside and copy it again from the master.
type ResyncBrokerRequest struct {
	Broker string `json:"broker"`
}
