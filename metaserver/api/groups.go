package api

import "github.com/ferrymq/ferrymq/routing"

// Broker group admission (ADMIN_ADMIT_GROUP) and retirement
// (ADMIN_RETIRE_GROUP), both for an admin, on the leader.

// AdmitGroupRequest admits a pending or retired broker group: from now on
// topic creation, add-queues and retirements may place queues on it.
type AdmitGroupRequest struct {
	Group string `json:"group"`
}

// RetireGroupRequest moves every queue of a broker group to the other
// admitted, writable groups and retires it. It is refused while a broker of
// the group has heartbeated within the session (or the leader has led for
// less than a session, so it cannot tell), unless Force; DryRun plans and
// changes nothing, and skips that check.
type RetireGroupRequest struct {
	Group  string `json:"group"`
	Force  bool   `json:"force,omitempty"`
	DryRun bool   `json:"dry_run,omitempty"`
}

// MovedQueue is one queue of a retirement: where it goes and from which
// offset its new group takes it up.
type MovedQueue struct {
	Topic string `json:"topic"`
	Queue uint32 `json:"queue"`
	To    string `json:"to"`
	// Base is the queue offset the new group's first message of the queue
	// gets: the highest of KnownEnd and Committed.
	Base int64 `json:"base"`
	// KnownEnd is the highest end of the queue its group's master reported
	// in its heartbeats; messages the old group stored past it are on its
	// disk only.
	KnownEnd int64 `json:"known_end"`
	// Committed is the highest offset a consumer group committed for the
	// queue (-1: none).
	Committed int64 `json:"committed"`
}

// RetireGroupReply is the group after the retirement (before it, for a dry
// run) and the queues moved (or that would be).
type RetireGroupReply struct {
	Group  routing.Group `json:"group"`
	Moved  []MovedQueue  `json:"moved"`
	DryRun bool          `json:"dry_run,omitempty"`
}

// AlterSyncSetRequest (ALTER_SYNC_SET, a group's master, on the leader)
// replaces the group's sync set: the master of Epoch, with the set at
// ExpectVersion, names the slaves it waits for. The answer is the group as
// the registry has it after the change; CONFLICT when the epoch, the master
// or the version moved (the master re-reads the group from its heartbeat).
type AlterSyncSetRequest struct {
	Group         string   `json:"group"`
	Epoch         uint32   `json:"epoch"`
	Master        string   `json:"master"`
	ExpectVersion uint64   `json:"expect_version"`
	InSync        []string `json:"in_sync"`
}

// GroupPolicyRequest (ADMIN_GROUP_POLICY, an admin, on the leader) sets how
// many copies a HIGH message of the group needs: MinInSync (0: the default,
// 2) below which HIGH is refused, and AckQuorum (0: every member of the sync
// set) at which it is answered. The answer is the group.
type GroupPolicyRequest struct {
	Group     string `json:"group"`
	MinInSync int    `json:"min_in_sync"`
	AckQuorum int    `json:"ack_quorum"`
}

// RemoveSlaveRequest (ADMIN_REMOVE_SLAVE, an admin, on the leader) removes a
// slave from its group and from the sync set. The answer is the group.
type RemoveSlaveRequest struct {
	Group  string `json:"group"`
	Broker string `json:"broker"`
}

// QueueEnd is one queue's next offset in a master's commit log, as its
// heartbeat reports it.
type QueueEnd struct {
	Topic string `json:"topic"`
	Queue uint32 `json:"queue"`
	End   int64  `json:"end"`
}
