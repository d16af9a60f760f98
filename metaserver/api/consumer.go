package api

// Consumer groups. A member heartbeats the metaserver leader every interval
// (CONSUMER_HEARTBEAT); its first heartbeat joins the group, and a heartbeat
// with Leave set leaves it at once. The leader keeps members' sessions in
// memory, like brokers'; membership, the assignment of queues to members
// and the committed offsets live in the Raft-replicated registry, so they
// survive leader changes. Every change of membership, or of the queues of a
// subscribed topic, starts a new generation with a new assignment, sticky:
// a member keeps its queues when another joins.
//
// A member works in the generation of its last reply. Commits name it, and a
// commit in an older generation, or for a queue not assigned to the member
// in it, is refused with STALE_GENERATION: the member heartbeats and takes
// its new assignment.

// ConsumerHeartbeat is a member's heartbeat.
type ConsumerHeartbeat struct {
	Group string `json:"group"`
	// Member is the member's id, unique in the group (the SDK makes one per
	// instance).
	Member string `json:"member"`
	// Topics the member subscribes to. Every member of a group should name
	// the same topics; a queue goes only to members that subscribe to its
	// topic.
	Topics []string `json:"topics"`
	// Generation is the generation the member works in (0 when joining).
	Generation uint64 `json:"generation"`
	// SessionMillis is how long the leader waits without a heartbeat before
	// the member leaves the group (0: the metaserver's default).
	SessionMillis int64 `json:"session_ms,omitempty"`
	// Leave leaves the group now (Close): the member's queues go to the
	// other members without waiting for its session to run out.
	Leave bool `json:"leave,omitempty"`
}

// ConsumerHeartbeatReply is the member's assignment in the group's current
// generation.
type ConsumerHeartbeatReply struct {
	Generation uint64            `json:"generation"`
	Assignment []QueueAssignment `json:"assignment"`
	// SessionMillis is the session the leader applies to this member.
	SessionMillis int64 `json:"session_ms"`
}

// QueueAssignment is one queue a member consumes in a generation, with the
// group's committed offset for it (-1 when nothing was committed: the
// member starts where its options say, earliest or latest).
type QueueAssignment struct {
	Topic     string `json:"topic"`
	Queue     uint32 `json:"queue"`
	Committed int64  `json:"committed"`
	// CommittedEpoch is the broker group epoch in which the committed offset
	// was read (0: unknown). The member names it in its first PULLs, so a
	// broker of a later epoch can send it back if a failover cut the queue
	// below the offset.
	CommittedEpoch uint32 `json:"committed_epoch,omitempty"`
	// EpochGroup is the broker group CommittedEpoch is of (the queue's
	// group when the assignment was made): an epoch means nothing to
	// another group, so a member whose route shows the queue on another
	// group does not name it.
	EpochGroup string `json:"epoch_group,omitempty"`
}

// QueueOffset is a queue's offset: the next offset to consume.
type QueueOffset struct {
	Topic  string `json:"topic"`
	Queue  uint32 `json:"queue"`
	Offset int64  `json:"offset"`
	// Epoch (commits) is the broker group epoch in which the member read up
	// to Offset; 0 when unknown.
	Epoch uint32 `json:"epoch,omitempty"`
	// EpochGroup (commits) is the broker group Epoch is of: a commit read
	// in a group the queue has since left records no epoch.
	EpochGroup string `json:"epoch_group,omitempty"`
}

// CommitRequest commits offsets for queues the member holds in Generation.
// A commit is all or nothing.
type CommitRequest struct {
	Group      string        `json:"group"`
	Member     string        `json:"member"`
	Generation uint64        `json:"generation"`
	Offsets    []QueueOffset `json:"offsets"`
}

// CommitReply acknowledges a commit once it is in the registry.
type CommitReply struct {
	Generation uint64 `json:"generation"`
}

// ConsumerGroupsRequest asks for one group (Group set) or all.
type ConsumerGroupsRequest struct {
	Group string `json:"group,omitempty"`
}

// ConsumerGroupInfo is a consumer group as the registry and the leader see
// it.
type ConsumerGroupInfo struct {
	Name       string               `json:"name"`
	Generation uint64               `json:"generation"`
	Topics     []string             `json:"topics"`
	Members    []ConsumerMemberInfo `json:"members"`
	// Offsets are the committed offsets, by topic and queue.
	Offsets []QueueOffset `json:"offsets"`
}

// ConsumerMemberInfo is one member of a group.
type ConsumerMemberInfo struct {
	ID     string   `json:"id"`
	Topics []string `json:"topics"`
	// Queues are the member's queues in the current generation.
	Queues []QueueOffset `json:"queues"`
	// HeartbeatAgeMillis is the age of its last heartbeat as the leader saw
	// it, -1 if none since this leader took over.
	HeartbeatAgeMillis int64 `json:"heartbeat_age_ms"`
}

// ResetOffsetsRequest sets a group's committed offsets. It is refused with
// GROUP_ACTIVE while the group has members; ferryctl computes the offsets
// (earliest, latest, an offset, a time) from the brokers.
type ResetOffsetsRequest struct {
	Group   string        `json:"group"`
	Offsets []QueueOffset `json:"offsets"`
}
