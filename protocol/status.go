package protocol

import (
	"errors"
	"fmt"
	"strings"
)

// Status is the outcome of a request or of one message in a batch. It crosses
// the wire as a u16; on either end a non-OK status is a Go error (*Error).
type Status uint16

// The status codes. The table below gives each its name and how a producer
// treats it: whether it may retry it (on another broker group), whether it
// counts as a fault of the group for latency-fault avoidance, and whether it
// means the producer's cached route is stale.
const (
	StatusOK               Status = 0
	StatusReadOnly         Status = 1  // the broker group is read-only
	StatusNotMaster        Status = 2  // this broker is not its group's master
	StatusSlaveLagging     Status = 3  // a HIGH message while the slave is absent or behind
	StatusSlaveSyncTimeout Status = 4  // the slave did not confirm a HIGH message in time; it may be stored
	StatusFlushTimeout     Status = 5  // the flush did not finish in time; the message may be stored
	StatusNoRoute          Status = 6  // the queue is not routed to this broker group
	StatusMessageTooLarge  Status = 7  // a message over MaxMessageSize, or a frame over MaxFrameSize
	StatusInvalid          Status = 8  // a malformed request or message
	StatusStoreError       Status = 9  // the commit log failed (disk full, I/O error)
	StatusBusy             Status = 10 // too much in flight; try later or elsewhere
	StatusNotLeader        Status = 11 // a metaserver follower; the body names the leader
	StatusDuplicate        Status = 12 // already stored: the result carries the original offsets (-1 when the broker no longer knows them)
	StatusUnknownCode      Status = 13 // the server has no handler for the request code
	StatusUnknownTopic     Status = 14 // the topic does not exist and auto-create is off
	StatusTimeout          Status = 15 // the request's deadline passed
	StatusConflict         Status = 16 // a precondition (expected version) failed
	StatusNotFound         Status = 17 // the named object does not exist
	StatusShuttingDown     Status = 18 // the server is closing
	StatusInternal         Status = 19 // a bug or an unexpected failure on the server
	// StatusOutOfOrderSequence: the message's producer sequence would leave
	// a gap in its queue (an earlier message of the producer is missing);
	// nothing was stored.
	StatusOutOfOrderSequence Status = 20
	// StatusProducerFenced: a later instance of the producer (a higher
	// epoch) has written to the queue; this one must stop.
	StatusProducerFenced Status = 21
	// StatusLeaseLost: the broker stopped being its group's writable master
	// (its write lease ran out, or it saw a newer group epoch) after it took
	// the message and before it could acknowledge it. The message may be in
	// this broker's log, but it is not acknowledged: after a failover it is
	// cut from the old master's log when that rejoins as the slave.
	StatusLeaseLost Status = 22
	// StatusNotAuthorized: the peer may not do this (for example an HA fetch
	// from a broker that is not the group's slave in the current epoch).
	StatusNotAuthorized Status = 23
	// StatusStaleGeneration: a consumer group member acted in a generation
	// that is no longer the group's (its queues may be another member's
	// now): nothing was done; it must rejoin (heartbeat) and take its new
	// assignment.
	StatusStaleGeneration Status = 24
	// StatusGroupActive: an operation that needs a consumer group with no
	// live members (resetting its offsets) found members, or one that needs
	// a broker group with no live broker (retiring it) heard one.
	StatusGroupActive Status = 25
	// StatusLogDiverged: a slave's log is not a prefix of its master's (the
	// record it names as its last is not the master's record there): it
	// cannot follow without an operator setting its log aside (resync).
	StatusLogDiverged Status = 26
	// StatusMemberFenced: a newer instance of this consumer group member
	// (the same member id, a later incarnation) has joined: this one must
	// stop.
	StatusMemberFenced Status = 27
	// StatusNotEnoughReplicas: a HIGH message while the group's sync set,
	// with the master, holds fewer copies than its MinInSync: refused
	// before it was stored.
	StatusNotEnoughReplicas Status = 28
	// StatusNotEnoughReplicasAfterAppend: the sync set shrank below the
	// group's MinInSync while a HIGH message waited for it: the message is
	// stored on the master and may be on some slaves.
	StatusNotEnoughReplicasAfterAppend Status = 29
	// StatusDelayQuota: the topic's pending delayed messages on this broker
	// group reached the group's quota: nothing was stored.
	StatusDelayQuota Status = 30
	// StatusTxnFenced: the message's transaction is decided, or its
	// producer has begun a newer one on this group: nothing was stored
	// (a late write cannot join a decided transaction or a newer one).
	StatusTxnFenced Status = 31
	// StatusTxnLimit: the message would take its transaction, or its
	// producer's open transactions, past the broker's limits: nothing was
	// stored.
	StatusTxnLimit Status = 32
	// StatusTxnIncomplete: a commit refused because messages of the
	// transaction its producer was told were stored are not in the group's
	// log (a failover lost the old master's tail): the transaction stays
	// open, and its producer must abort it.
	StatusTxnIncomplete Status = 33
)

// statusFlags are the columns of the status table.
type statusFlags uint8

const (
	// retry: a producer may retry the message, on another broker group if
	// there is one.
	retry statusFlags = 1 << iota
	// fault: the broker group failed or is overloaded; latency-fault
	// avoidance counts it like a failed send and steers away from the group
	// for a while.
	fault
	// refresh: the producer's route is stale (the group is read-only, the
	// broker is not master, the queue is not routed there): refresh it at
	// once (rate-limited).
	refresh
	// maybe: the message may have been stored (the outcome is unknown: a
	// deadline passed or a sync failed after the write). An idempotent
	// producer retries it on the same queue with the same sequence, so the
	// broker answers the retry from its deduplication state.
	maybe
)

type statusInfo struct {
	name  string
	flags statusFlags
}

// statusTable is the one table of status codes, indexed by status (an
// array: producers read it once per message). A status with no name is
// unknown.
var statusTable = [...]statusInfo{
	StatusOK:               {"OK", 0},
	StatusReadOnly:         {"READ_ONLY", retry | refresh},
	StatusNotMaster:        {"NOT_MASTER", retry | refresh},
	StatusSlaveLagging:     {"SLAVE_LAGGING", retry},
	StatusSlaveSyncTimeout: {"SLAVE_SYNC_TIMEOUT", retry | fault | maybe},
	StatusFlushTimeout:     {"FLUSH_TIMEOUT", retry | fault | maybe},
	StatusNoRoute:          {"NO_ROUTE", retry | refresh}, // also while a broker's route cache refreshes
	StatusMessageTooLarge:  {"MESSAGE_TOO_LARGE", 0},
	StatusInvalid:          {"INVALID", 0},
	StatusStoreError:       {"STORE_ERROR", retry | fault | maybe}, // a failed sync leaves the record in the log
	StatusBusy:             {"BUSY", retry | fault},
	StatusNotLeader:        {"NOT_LEADER", retry},
	StatusDuplicate:        {"DUPLICATE", 0},
	StatusUnknownCode:      {"UNKNOWN_CODE", 0},
	StatusUnknownTopic:     {"UNKNOWN_TOPIC", 0},
	StatusTimeout:          {"TIMEOUT", retry | fault | maybe},
	StatusConflict:         {"CONFLICT", 0},
	StatusNotFound:         {"NOT_FOUND", 0},
	StatusShuttingDown:     {"SHUTTING_DOWN", retry | fault},
	StatusInternal:         {"INTERNAL", fault | maybe},
	// OUT_OF_ORDER_SEQUENCE: nothing was stored; the producer resends from
	// the missing sequence (or starts a new producer id when the broker lost
	// what it had).
	StatusOutOfOrderSequence: {"OUT_OF_ORDER_SEQUENCE", retry},
	StatusProducerFenced:     {"PRODUCER_FENCED", 0},
	StatusLeaseLost:          {"LEASE_LOST", retry | refresh | maybe},
	StatusNotAuthorized:      {"NOT_AUTHORIZED", 0},
	StatusStaleGeneration:    {"STALE_GENERATION", 0},
	StatusGroupActive:        {"GROUP_ACTIVE", 0},
	StatusLogDiverged:        {"LOG_DIVERGED", 0},
	StatusMemberFenced:       {"MEMBER_FENCED", 0},

	StatusNotEnoughReplicas:            {"NOT_ENOUGH_REPLICAS", retry},
	StatusNotEnoughReplicasAfterAppend: {"NOT_ENOUGH_REPLICAS_AFTER_APPEND", retry | fault | maybe},
	StatusDelayQuota:                   {"DELAY_QUOTA", 0},
	StatusTxnFenced:                    {"TXN_FENCED", 0},
	StatusTxnLimit:                     {"TXN_LIMIT", 0},
	StatusTxnIncomplete:                {"TXN_INCOMPLETE", 0},
}

// String returns the status's name, e.g. "READ_ONLY".
func (s Status) String() string {
	if i := s.info(); i.name != "" {
		return i.name
	}
	return fmt.Sprintf("STATUS(%d)", uint16(s))
}

// info is s's row of the table; an unknown status has the zero row.
func (s Status) info() statusInfo {
	if int(s) < len(statusTable) {
		return statusTable[s]
	}
	return statusInfo{}
}

// Retriable reports whether a producer may retry a message that got s.
// Unknown statuses are not retriable.
func (s Status) Retriable() bool { return s.info().flags&retry != 0 }

// Fault reports whether s counts as a fault of the broker group that
// answered it, for latency-fault avoidance (a failed send: the group is
// avoided for a while). Statuses that blame the message (INVALID,
// MESSAGE_TOO_LARGE) or the route (READ_ONLY, NOT_MASTER, NO_ROUTE) are not
// faults. Unknown statuses are not.
func (s Status) Fault() bool { return s.info().flags&fault != 0 }

// RefreshesRoute reports whether s means the sender's cached route is stale
// and should be refreshed at once (READ_ONLY, NOT_MASTER, NO_ROUTE).
// Unknown statuses do not.
func (s Status) RefreshesRoute() bool { return s.info().flags&refresh != 0 }

// MaybeStored reports whether a message answered s may nevertheless have
// been stored (SLAVE_SYNC_TIMEOUT, FLUSH_TIMEOUT, TIMEOUT, STORE_ERROR,
// INTERNAL). A retry of such a message goes to the same queue with the same
// producer sequence; moving it elsewhere could store it twice. Every other
// non-OK status means the message was not stored.
func (s Status) MaybeStored() bool { return s.info().flags&maybe != 0 }

// Known reports whether s is in the table.
func (s Status) Known() bool { return s.info().name != "" }

// Error is a non-OK status as a Go error. Two Errors match with errors.Is
// when their statuses are equal, whatever their messages, so callers write
// errors.Is(err, protocol.ErrReadOnly).
type Error struct {
	Status  Status
	Message string // optional detail from the side that raised it
}

// Error is "ferrymq: STATUS: message", naming the status once: a message
// that begins with the status's own name (the text of another error of the
// same status, or an answer from a peer that put the name into its text)
// has it cut (TrimStatus).
func (e *Error) Error() string {
	msg := TrimStatus(e.Status, e.Message)
	if msg == "" {
		return "ferrymq: " + e.Status.String()
	}
	return "ferrymq: " + e.Status.String() + ": " + msg
}

// TrimStatus cuts from the front of msg the name of s, as "ferrymq: NAME: "
// or "NAME: ", as many times as it is repeated, so that an error's text
// built from another error of the same status names the status once.
func TrimStatus(s Status, msg string) string {
	name := s.String()
	for {
		rest, ok := strings.CutPrefix(strings.TrimPrefix(msg, "ferrymq: "), name)
		if !ok || rest != "" && !strings.HasPrefix(rest, ": ") {
			return msg
		}
		msg = strings.TrimPrefix(rest, ": ")
	}
}

// Is matches another *Error with the same status.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Status == e.Status
}

// Retriable reports whether the status may be retried.
func (e *Error) Retriable() bool { return e.Status.Retriable() }

// Sentinels, one per status, for errors.Is.
var (
	ErrReadOnly         = &Error{Status: StatusReadOnly}
	ErrNotMaster        = &Error{Status: StatusNotMaster}
	ErrSlaveLagging     = &Error{Status: StatusSlaveLagging}
	ErrSlaveSyncTimeout = &Error{Status: StatusSlaveSyncTimeout}
	ErrFlushTimeout     = &Error{Status: StatusFlushTimeout}
	ErrNoRoute          = &Error{Status: StatusNoRoute}
	ErrMessageTooLarge  = &Error{Status: StatusMessageTooLarge}
	ErrInvalid          = &Error{Status: StatusInvalid}
	ErrStoreError       = &Error{Status: StatusStoreError}
	ErrBusy             = &Error{Status: StatusBusy}
	ErrNotLeader        = &Error{Status: StatusNotLeader}
	ErrDuplicate        = &Error{Status: StatusDuplicate}
	ErrUnknownCode      = &Error{Status: StatusUnknownCode}
	ErrUnknownTopic     = &Error{Status: StatusUnknownTopic}
	ErrTimeout          = &Error{Status: StatusTimeout}
	ErrConflict         = &Error{Status: StatusConflict}
	ErrNotFound         = &Error{Status: StatusNotFound}
	ErrShuttingDown     = &Error{Status: StatusShuttingDown}
	ErrInternal         = &Error{Status: StatusInternal}
	ErrLeaseLost        = &Error{Status: StatusLeaseLost}
	ErrNotAuthorized    = &Error{Status: StatusNotAuthorized}
	ErrStaleGeneration  = &Error{Status: StatusStaleGeneration}
	ErrGroupActive      = &Error{Status: StatusGroupActive}
	ErrLogDiverged      = &Error{Status: StatusLogDiverged}
	ErrMemberFenced     = &Error{Status: StatusMemberFenced}

	ErrNotEnoughReplicas            = &Error{Status: StatusNotEnoughReplicas}
	ErrNotEnoughReplicasAfterAppend = &Error{Status: StatusNotEnoughReplicasAfterAppend}
	ErrDelayQuota                   = &Error{Status: StatusDelayQuota}

	// ErrFrameTooLarge marks a frame or header over its cap. It is also a
	// MESSAGE_TOO_LARGE status when it crosses the wire.
	ErrFrameTooLarge = errors.New("protocol: frame too large")
)

// ErrorForStatus returns the error for s, or nil for StatusOK. msg is the
// detail, usually an answer's text; a copy of the status's name at its
// front is cut (TrimStatus), so a peer whose text names the status (an
// older server's did) does not make the error name it twice.
func ErrorForStatus(s Status, msg string) error {
	if s == StatusOK {
		return nil
	}
	return &Error{Status: s, Message: TrimStatus(s, msg)}
}

// StatusOf maps an error to the status that carries it across the wire:
// a *Error anywhere in the chain gives its status, ErrMalformed gives
// INVALID, ErrFrameTooLarge gives MESSAGE_TOO_LARGE, anything else INTERNAL.
func StatusOf(err error) Status {
	if err == nil {
		return StatusOK
	}
	var pe *Error
	switch {
	case errors.As(err, &pe):
		return pe.Status
	case errors.Is(err, ErrMalformed):
		return StatusInvalid
	case errors.Is(err, ErrFrameTooLarge):
		return StatusMessageTooLarge
	default:
		return StatusInternal
	}
}

// IsRetriable reports whether err carries a retriable status.
func IsRetriable(err error) bool {
	var pe *Error
	return errors.As(err, &pe) && pe.Status.Retriable()
}
