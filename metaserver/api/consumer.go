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
//
// A member that names its Incarnation (the SDK does) gets one owner at a
// time (fsm/handover.go): a reply lists only the queues it holds; a queue
// that moved to it from another member comes once that member released it
// (Released in its heartbeat, after its last handler call of the queue
// returned and it committed) or left; its commits are accepted for the
// queues it holds, whatever the generation; a newer incarnation of the same
// member id fences the older (MEMBER_FENCED).

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
	// Incarnation identifies this instance of the member (the SDK's start
	// time in unix nanoseconds; 0: a member that does not hand queues over,
	// from before one owner at a time).
	Incarnation uint64 `json:"incarnation,omitempty"`
	// Released are queues the member was asked to let go and stopped: its
	// last handler call of each returned and its offset was committed.
	Released []QueueRef `json:"released,omitempty"`
	// Filter is the filter (protocol.Filter) the member asks for when it
	// joins ("": none, it takes the group's). A joining member asking for
	// another filter than the group's is refused INVALID, unless the group
	// has none yet and no other member: then it becomes the group's.
	Filter string `json:"filter,omitempty"`
}

// QueueRef names one queue of a topic.
type QueueRef struct {
	Topic string `json:"topic"`
	Queue uint32 `json:"queue"`
}

// ConsumerHeartbeatReply is the member's assignment in the group's current
// generation.
type ConsumerHeartbeatReply struct {
	Generation uint64            `json:"generation"`
	Assignment []QueueAssignment `json:"assignment"`
	// SessionMillis is the session the leader applies to this member.
	SessionMillis int64 `json:"session_ms"`
	// Waiting counts queues the member owns that another member still
	// holds (it takes them once they are released): the member heartbeats
	// again soon.
	Waiting int `json:"waiting,omitempty"`
	// JoinWindowMillis is how long the group's join window stays open (0:
	// closed): members joining meanwhile share the first assignment.
	JoinWindowMillis int64 `json:"join_window_ms,omitempty"`
	// Release are the queues this member instance still holds for others:
	// it stops them (or, if it never took them, has nothing to stop) and
	// reports them Released.
	Release []QueueRef `json:"release,omitempty"`
	// Filter is the group's filter, which the member names in its PULLs
	// ("": every message). It can change between heartbeats (set-filter).
	Filter string `json:"filter,omitempty"`
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
	// Rewound (commits) says the broker sent the member below the
	// committed offset (the queue's log ends before it): the registry
	// takes the lower offset from the queue's holder.
	Rewound bool `json:"rewound,omitempty"`
}

// CommitRequest commits offsets for queues the member holds in Generation.
// A commit is all or nothing.
type CommitRequest struct {
	Group      string        `json:"group"`
	Member     string        `json:"member"`
	Generation uint64        `json:"generation"`
	Offsets    []QueueOffset `json:"offsets"`
	// Incarnation, when not 0, commits the queues this member instance
	// holds, whatever the generation; an offset below the committed one is
	// refused (STALE_GENERATION) unless read in a later broker epoch.
	Incarnation uint64 `json:"incarnation,omitempty"`
	// Redelivered are messages the member handled since its last commit
	// after more than one delivery (at most MaxRedelivered): the leader
	// keeps the latest of each group in memory for a message's journey.
	Redelivered []Redelivery `json:"redelivered,omitempty"`
}

// MaxRedelivered bounds the redeliveries one commit reports.
const MaxRedelivered = 256

// Redelivery is a message a member handled (or dead-lettered) after
// Deliveries deliveries, at At (unix ms, the member's clock).
type Redelivery struct {
	Topic      string `json:"topic"`
	Queue      uint32 `json:"queue"`
	Offset     int64  `json:"offset"`
	Deliveries int    `json:"deliveries"`
	Member     string `json:"member,omitempty"` // filled by the leader
	At         int64  `json:"at"`
}

// DeleteGroupRequest removes a consumer group with no member, and its
// committed offsets.
type DeleteGroupRequest struct {
	Group string `json:"group"`
}

// SetGroupFilterRequest sets the filter (protocol.Filter; "*": every
// message) of the messages a consumer group receives, creating the group
// if it does not exist. Its members take it from their next heartbeat.
type SetGroupFilterRequest struct {
	Group  string `json:"group"`
	Filter string `json:"filter"`
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
	// Filter is the group's filter in canonical form ("": every message),
	// and FilterBy who set it (see fsm.ConsumerGroup).
	Filter   string `json:"filter,omitempty"`
	FilterBy string `json:"filter_by,omitempty"`
	// Redelivered are the latest redeliveries the group's members reported
	// to this leader (memory: a new leader starts with none).
	Redelivered []Redelivery `json:"redelivered,omitempty"`
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
	// Waiting are the queues it owns that another member still holds.
	Waiting []QueueRef `json:"waiting,omitempty"`
}

// ResetOffsetsRequest sets a group's committed offsets. It is refused with
// GROUP_ACTIVE while the group has members; ferryctl computes the offsets
// (earliest, latest, an offset, a time) from the brokers.
type ResetOffsetsRequest struct {
	Group   string        `json:"group"`
	Offsets []QueueOffset `json:"offsets"`
	// Create makes the group if it does not exist; without it such a group
	// is refused NOT_FOUND, so a mistyped name makes no group.
	Create bool `json:"create,omitempty"`
}
