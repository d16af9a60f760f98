package protocol

import (
	"fmt"
	"strconv"
	"strings"
)

// Handle names one stored record: the broker group whose log holds it and
// its log offset there. A delayed message's SEND result gives the handle of
// its pending record, with its due time: DELAYED_STATE tells whether and
// where it was released, DELAYED_CANCEL cancels it, and the due time lets
// both find it after retention moved it and deleted the segment the
// offset names.
type Handle struct {
	Group  string
	Offset int64
	DueAt  int64 // a delayed message's due time, unix milliseconds; 0: not given
}

// String is the handle as users write it: "GROUP@OFFSET", and a delayed
// message's "GROUP@OFFSET/DUE" (DUE in unix milliseconds).
func (h Handle) String() string {
	s := h.Group + "@" + strconv.FormatInt(h.Offset, 10)
	if h.DueAt > 0 {
		s += "/" + strconv.FormatInt(h.DueAt, 10)
	}
	return s
}

// ParseHandle parses "GROUP@OFFSET" and "GROUP@OFFSET/DUE".
func ParseHandle(s string) (Handle, error) {
	i := strings.LastIndexByte(s, '@')
	if i <= 0 {
		return Handle{}, fmt.Errorf("protocol: handle %q: want GROUP@OFFSET or GROUP@OFFSET/DUE", s)
	}
	offs, dues, hasDue := strings.Cut(s[i+1:], "/")
	off, err := strconv.ParseInt(offs, 10, 64)
	if err != nil || off < 0 {
		return Handle{}, fmt.Errorf("protocol: handle %q: the offset must be a log offset (a number >= 0)", s)
	}
	h := Handle{Group: s[:i], Offset: off}
	if hasDue {
		if h.DueAt, err = strconv.ParseInt(dues, 10, 64); err != nil || h.DueAt <= 0 {
			return Handle{}, fmt.Errorf("protocol: handle %q: the due time must be unix milliseconds (a number > 0)", s)
		}
	}
	return h, nil
}

// DelayedRef is the body of DELAYED_CANCEL and DELAYED_STATE: the log
// offset of a pending record in the broker's group.
type DelayedRef struct {
	Offset int64 `json:"offset"`
	DueAt  int64 `json:"due_at,omitempty"` // the handle's due time: finds a record retention moved
}

// The states of a delayed message.
const (
	DelayPending   = "pending"   // waiting for its time
	DelayReleased  = "released"  // appended to its target queue (Released says where)
	DelayCancelled = "cancelled" // cancelled before its time
	// DelayMoved: retention was about to delete its segment, so the pending
	// record was appended again (MovedTo is its new log offset; the handle
	// follows it).
	DelayMoved = "moved"
)

// DelayedState is what a broker knows of one delayed message.
type DelayedState struct {
	Offset int64  `json:"offset"` // the pending record's log offset
	Topic  string `json:"topic"`  // the target topic and queue
	Queue  uint32 `json:"queue"`
	ID     string `json:"id"`
	DueAt  int64  `json:"due_at"` // unix milliseconds
	State  string `json:"state"`
	// Released is where the message went, once released.
	Released *DelayedRelease `json:"released,omitempty"`
	// MovedTo is the record's new log offset when State is DelayMoved.
	MovedTo int64 `json:"moved_to,omitempty"`
	// By is what decided this answer to a cancel: "cancel" when this
	// request cancelled it; "" otherwise.
	By string `json:"by,omitempty"`
}

// DelayedRelease is where a delayed message was released.
type DelayedRelease struct {
	QueueOffset int64 `json:"queue_offset"`
	LogOffset   int64 `json:"log_offset"`
	At          int64 `json:"at"` // unix milliseconds: its store time
}

// DelayedListRequest is the body of DELAYED_LIST.
type DelayedListRequest struct {
	Topic string `json:"topic,omitempty"` // "": every topic
	// BucketMillis is the width of the due-time buckets (default 60000).
	BucketMillis int64 `json:"bucket_millis,omitempty"`
	Limit        int   `json:"limit,omitempty"` // buckets at most (default 100)
}

// DelayedList is a broker group's pending delayed messages: how many, when
// the next is due, and how many are due per bucket of due time (the
// earliest buckets first).
type DelayedList struct {
	Group   string               `json:"group"`
	Pending int64                `json:"pending"`
	NextDue int64                `json:"next_due"` // unix milliseconds; 0: none pending
	Buckets []DelayedBucket      `json:"buckets"`
	Topics  []DelayedTopicCounts `json:"topics"`
	Now     int64                `json:"now"` // the broker's clock, unix milliseconds
}

// DelayedBucket counts the pending messages due in [Start, Start+width).
type DelayedBucket struct {
	Start   int64 `json:"start"`
	Pending int64 `json:"pending"`
}

// DelayedTopicCounts is one topic's pending delayed messages and quota.
type DelayedTopicCounts struct {
	Topic   string `json:"topic"`
	Pending int64  `json:"pending"`
	Quota   int64  `json:"quota"`
}

// DelayedOriginProperty is the property a pending record retention moved
// carries: the log offset of the message's first pending record (its
// handle's), kept by every later move and by its release, so that the
// handle finds the message however often it moved and a consumer's
// DelayedHandle is the producer's.
const DelayedOriginProperty = "%delayed-origin"

// DelayedOrigin returns the DelayedOriginProperty of m, or -1.
func DelayedOrigin(m *Message) int64 {
	for _, p := range m.Properties {
		if p.Key == DelayedOriginProperty {
			if v, err := strconv.ParseInt(p.Value, 10, 64); err == nil && v >= 0 {
				return v
			}
		}
	}
	return -1
}
