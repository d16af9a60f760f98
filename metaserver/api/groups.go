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

// QueueEnd is one queue's next offset in a master's commit log, as its
// heartbeat reports it.
type QueueEnd struct {
	Topic string `json:"topic"`
	Queue uint32 `json:"queue"`
	End   int64  `json:"end"`
}
