package protocol

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Reliability is a message's delivery guarantee.
type Reliability uint8

const (
	// Normal messages are answered after the master's append (and flush,
	// when the broker flushes synchronously).
	Normal Reliability = 0
	// High messages are answered only after the slave confirmed them.
	High Reliability = 1
)

func (r Reliability) String() string {
	switch r {
	case Normal:
		return "NORMAL"
	case High:
		return "HIGH"
	}
	return fmt.Sprintf("RELIABILITY(%d)", uint8(r))
}

// ParseReliability parses "normal" or "high" (any case).
func ParseReliability(s string) (Reliability, error) {
	switch strings.ToLower(s) {
	case "normal":
		return Normal, nil
	case "high":
		return High, nil
	}
	return 0, fmt.Errorf("protocol: unknown reliability %q (want normal or high)", s)
}

// Limits on message fields.
const (
	MaxIDLen       = 128 // producer-made message id
	MaxTopicLen    = 255
	MaxProperties  = 256
	MaxPropertyLen = 4096 // key or value
	MaxTagLen      = 64
)

// Property is one key/value of a message's properties. Properties keep their
// order on the wire.
type Property struct {
	Key, Value string
}

// ProducerStamp identifies a message for the broker's deduplication: the
// producer's id (given by the metaserver, unique in the cluster), the
// producer's epoch (a later instance of a named producer has a higher one
// and fences the earlier), and the message's sequence number in its queue
// for that producer (0, 1, 2, ... with no gap). The zero stamp means an
// unstamped message, which the broker stores without deduplication.
type ProducerStamp struct {
	ID    uint64
	Epoch uint16
	Seq   int64
}

// IsZero reports whether the stamp is absent.
func (s ProducerStamp) IsZero() bool { return s.ID == 0 }

// stampedFlag, in the reliability byte, says a producer stamp follows the
// timestamp. Messages of producers without idempotence, and every message
// stored before stamps existed, do not have it.
const stampedFlag = 0x80

// stampSize is the encoding of a stamp: id u64, epoch u16, seq i64.
const stampSize = 8 + 2 + 8

// scheduleFlag, in the reliability byte, says a schedule follows the stamp
// (or the timestamp, without one): kind u8, at i64, ref i64.
const scheduleFlag = 0x40

const scheduleSize = 1 + 8 + 8

// tagFlag, in the reliability byte, says a tag follows the schedule (or
// what comes before it): u8 length (1 to MaxTagLen) + bytes.
const tagFlag = 0x20

// txnFlag, in the reliability byte, says the message belongs to a
// transaction of its producer: the transaction's number (u64, not 0)
// follows the stamp, which such a message always has.
const txnFlag = 0x10

const relFlags = stampedFlag | scheduleFlag | tagFlag | txnFlag

// Message is one message as it crosses the wire and as it is stored.
//
// Wire encoding:
//
//	id          u16 length + bytes
//	topic       u16 length + bytes
//	queue       u32
//	reliability u8; bit 0x80 set: a producer stamp follows the timestamp;
//	            bit 0x40 set: a schedule follows the stamp; bit 0x20: a tag;
//	            bit 0x10: a transaction number follows the stamp
//	timestamp   i64, unix milliseconds
//	[stamp]     producer id u64, epoch u16, sequence i64 (only with bit 0x80)
//	[txn]       transaction number u64 (only with bit 0x10, which needs 0x80)
//	[schedule]  kind u8, at i64 (unix milliseconds), ref i64 (only with bit 0x40)
//	[tag]       u8 length + bytes (only with bit 0x20)
//	properties  u16 count, then per property: u16 length + key, u16 length + value
//	body        u32 length + bytes
//
// The encoding is canonical: bit 0x80 is set exactly when the stamp's
// producer id is not zero, bit 0x40 exactly when the schedule's kind is not
// ScheduleNone, bit 0x20 exactly when the tag is not empty, bit 0x10
// exactly when Txn is not 0.
type Message struct {
	ID          string
	Topic       string
	Queue       uint32
	Reliability Reliability
	Timestamp   int64
	Producer    ProducerStamp
	// Txn is the number of the transaction of Producer (its id and epoch)
	// the message belongs to; 0: none. See TxnID.
	Txn        uint64
	Schedule   Schedule // the zero Schedule: an ordinary message
	Tag        string   // one tag (ValidateTag), which consumer groups filter on; "" none
	Properties []Property
	Body       []byte // aliases the decoded buffer
}

// ScheduleKind says what a message's Schedule makes of it.
type ScheduleKind uint8

const (
	// ScheduleNone: an ordinary message.
	ScheduleNone ScheduleKind = 0
	// ScheduleDelayed: a message for delivery at Schedule.At, stored
	// pending in the internal queue DelayTopic(Topic), Queue of the group
	// that owns its target queue. Ref is -1, or, for a pending record that
	// retention moved, the log offset of the record it replaces.
	ScheduleDelayed ScheduleKind = 1
	// ScheduleReleased: a copy released into its target queue from the
	// pending record at log offset Ref, due at At (its store time is when
	// it was released).
	ScheduleReleased ScheduleKind = 2
	// ScheduleReleaseMark: written in the pending record's internal queue
	// right after its released copy (same append): the record at Ref, due
	// at At, was released; the body is the released record's size (u32).
	ScheduleReleaseMark ScheduleKind = 3
	// ScheduleCancelMark: the pending record at Ref, due at At, was
	// cancelled.
	ScheduleCancelMark ScheduleKind = 4
)

func (k ScheduleKind) String() string {
	switch k {
	case ScheduleNone:
		return "none"
	case ScheduleDelayed:
		return "delayed"
	case ScheduleReleased:
		return "released"
	case ScheduleReleaseMark:
		return "release-mark"
	case ScheduleCancelMark:
		return "cancel-mark"
	}
	return fmt.Sprintf("schedule(%d)", uint8(k))
}

// Schedule is a message's delivery time and its place in the life of a
// delayed message (see ScheduleKind).
type Schedule struct {
	Kind ScheduleKind
	At   int64 // unix milliseconds: when the message is (or was) due
	Ref  int64 // a log offset in the same group's log, or -1 (see the kinds)
}

// DelayTopicPrefix starts the name of every internal topic that holds
// pending delayed messages: DelayTopic(t) holds those for topic t, in the
// queue of the same number, in the group that owns that queue.
const DelayTopicPrefix = "%DELAY%"

// DelayTopic is the internal topic of topic's pending delayed messages.
func DelayTopic(topic string) string { return DelayTopicPrefix + topic }

// IsDelayTopic reports whether topic is an internal topic of pending
// delayed messages, and the topic they are for.
func IsDelayTopic(topic string) (target string, ok bool) {
	return strings.CutPrefix(topic, DelayTopicPrefix)
}

// minMessageSize is the encoding of a message whose strings and body are empty.
const minMessageSize = 2 + 2 + 4 + 1 + 8 + 2 + 4

// EncodedSize is the number of bytes AppendMessage appends.
func (m *Message) EncodedSize() int {
	n := minMessageSize + len(m.ID) + len(m.Topic) + len(m.Body)
	if !m.Producer.IsZero() {
		n += stampSize
	}
	if m.Txn != 0 {
		n += 8
	}
	if m.Schedule.Kind != ScheduleNone {
		n += scheduleSize
	}
	if m.Tag != "" {
		n += 1 + len(m.Tag)
	}
	for _, p := range m.Properties {
		n += 4 + len(p.Key) + len(p.Value)
	}
	return n
}

// Validate reports every problem with m that would make a broker refuse it.
// A body over MaxMessageSize is reported as ErrMessageTooLarge, anything
// else as ErrInvalid.
func (m *Message) Validate() error {
	var errs []error
	if len(m.Body) > MaxMessageSize {
		errs = append(errs, &Error{Status: StatusMessageTooLarge,
			Message: fmt.Sprintf("body of %d bytes over the cap %d", len(m.Body), MaxMessageSize)})
	}
	invalid := func(format string, args ...any) {
		errs = append(errs, &Error{Status: StatusInvalid, Message: fmt.Sprintf(format, args...)})
	}
	if m.ID == "" || len(m.ID) > MaxIDLen {
		invalid("message id must be 1 to %d bytes, got %d", MaxIDLen, len(m.ID))
	}
	if err := ValidateTopic(m.Topic); err != nil {
		invalid("%v", err)
	}
	if m.Reliability != Normal && m.Reliability != High {
		invalid("unknown reliability %d", m.Reliability)
	}
	if !m.Producer.IsZero() && m.Producer.Seq < 0 {
		invalid("negative producer sequence %d", m.Producer.Seq)
	}
	if m.Txn != 0 && m.Producer.IsZero() {
		invalid("a message of a transaction needs its producer's stamp")
	}
	switch m.Schedule.Kind {
	case ScheduleNone:
	case ScheduleDelayed:
		if m.Schedule.At <= 0 {
			invalid("a delayed message needs a delivery time, got %d", m.Schedule.At)
		}
		if m.Schedule.Ref != -1 {
			// Only a broker's move names the record it replaces.
			invalid("a delayed message's schedule reference must be -1, got %d", m.Schedule.Ref)
		}
	default:
		invalid("a producer may send only delayed messages, not %v", m.Schedule.Kind)
	}
	if _, ok := IsDelayTopic(m.Topic); ok {
		invalid("topic %q is internal (its prefix %s is reserved)", m.Topic, DelayTopicPrefix)
	}
	if m.Topic == TxnTopic {
		invalid("topic %q is internal", m.Topic)
	}
	if m.Tag != "" {
		if err := ValidateTag(m.Tag); err != nil {
			invalid("%v", err)
		}
	}
	if len(m.Properties) > MaxProperties {
		invalid("%d properties over the cap %d", len(m.Properties), MaxProperties)
	}
	for _, p := range m.Properties {
		if p.Key == "" || len(p.Key) > MaxPropertyLen || len(p.Value) > MaxPropertyLen {
			invalid("property %.32q: key must be 1 to %d bytes and value at most %d", p.Key, MaxPropertyLen, MaxPropertyLen)
			break
		}
	}
	return errors.Join(errs...)
}

// AppendMessage appends m's encoding. Fields over their u16 length limit are
// the caller's error (Validate catches them); they are truncated here rather
// than corrupting the stream.
func AppendMessage(dst []byte, m *Message) []byte {
	dst = appendStr16(dst, clip16(m.ID))
	dst = appendStr16(dst, clip16(m.Topic))
	dst = appendU32(dst, m.Queue)
	rel := uint8(m.Reliability)
	if !m.Producer.IsZero() {
		rel |= stampedFlag
		if m.Txn != 0 {
			rel |= txnFlag
		}
	}
	if m.Schedule.Kind != ScheduleNone {
		rel |= scheduleFlag
	}
	tag := m.Tag
	if len(tag) > 255 {
		tag = tag[:255]
	}
	if tag != "" {
		rel |= tagFlag
	}
	dst = appendU8(dst, rel)
	dst = appendI64(dst, m.Timestamp)
	if !m.Producer.IsZero() {
		dst = appendU64(dst, m.Producer.ID)
		dst = appendU16(dst, m.Producer.Epoch)
		dst = appendI64(dst, m.Producer.Seq)
		if m.Txn != 0 {
			dst = appendU64(dst, m.Txn)
		}
	}
	if m.Schedule.Kind != ScheduleNone {
		dst = appendU8(dst, uint8(m.Schedule.Kind))
		dst = appendI64(dst, m.Schedule.At)
		dst = appendI64(dst, m.Schedule.Ref)
	}
	if tag != "" {
		dst = appendU8(dst, uint8(len(tag)))
		dst = append(dst, tag...)
	}
	props := m.Properties
	if len(props) > 1<<16-1 {
		props = props[:1<<16-1]
	}
	dst = appendU16(dst, uint16(len(props)))
	for _, p := range props {
		dst = appendStr16(dst, clip16(p.Key))
		dst = appendStr16(dst, clip16(p.Value))
	}
	return appendBytes32(dst, m.Body)
}

func clip16(s string) string {
	if len(s) > 1<<16-1 {
		return s[:1<<16-1]
	}
	return s
}

func (r *reader) message(m *Message) {
	if r.skipID {
		m.ID = ""
		r.span(int(r.u16("message id")), "message id")
	} else {
		m.ID = r.str16("message id")
	}
	if t := r.span(int(r.u16("topic")), "topic"); string(t) == r.lastTopic {
		m.Topic = r.lastTopic
	} else {
		m.Topic = string(t)
		r.lastTopic = m.Topic
	}
	m.Queue = r.u32("queue")
	rel := r.u8("reliability")
	m.Reliability = Reliability(rel &^ relFlags)
	if r.err == nil && m.Reliability != Normal && m.Reliability != High {
		r.fail(fmt.Sprintf("unknown reliability %d", m.Reliability))
	}
	m.Timestamp = r.i64("timestamp")
	m.Producer = ProducerStamp{}
	if rel&stampedFlag != 0 {
		m.Producer.ID = r.u64("producer id")
		m.Producer.Epoch = r.u16("producer epoch")
		m.Producer.Seq = r.i64("producer sequence")
		if r.err == nil && m.Producer.ID == 0 {
			r.fail("a producer stamp with producer id 0")
		}
	}
	m.Txn = 0
	if rel&txnFlag != 0 {
		m.Txn = r.u64("transaction number")
		if r.err == nil && (m.Txn == 0 || rel&stampedFlag == 0) {
			r.fail("a transaction number of 0 or without a producer stamp")
		}
	}
	m.Schedule = Schedule{}
	if rel&scheduleFlag != 0 {
		m.Schedule.Kind = ScheduleKind(r.u8("schedule kind"))
		m.Schedule.At = r.i64("schedule time")
		m.Schedule.Ref = r.i64("schedule reference")
		if r.err == nil && (m.Schedule.Kind == ScheduleNone || m.Schedule.Kind > ScheduleCancelMark) {
			r.fail(fmt.Sprintf("unknown schedule kind %d", m.Schedule.Kind))
		}
	}
	m.Tag = ""
	if rel&tagFlag != 0 {
		t := r.span(int(r.u8("tag length")), "tag")
		if r.err == nil && len(t) == 0 {
			r.fail("an empty tag behind the tag bit")
		}
		m.Tag = r.tag(t)
	}
	n := int(r.u16("property count"))
	m.Properties = nil
	if n > 0 && r.need(4*n, "properties") {
		m.Properties = make([]Property, n)
		for i := range m.Properties {
			m.Properties[i].Key = r.str16("property key")
			m.Properties[i].Value = r.str16("property value")
		}
	}
	m.Body = r.bytes32("body", MaxFrameSize)
}

// DecodeMessage decodes exactly one message from b.
func DecodeMessage(b []byte) (Message, error) {
	var m Message
	r := reader{b: b}
	r.message(&m)
	if err := r.done("message"); err != nil {
		return Message{}, err
	}
	return m, nil
}

// Equal reports whether two messages are the same, field by field.
func (m *Message) Equal(o *Message) bool {
	return m.ID == o.ID && m.Topic == o.Topic && m.Queue == o.Queue && m.Tag == o.Tag &&
		m.Reliability == o.Reliability && m.Timestamp == o.Timestamp && m.Producer == o.Producer && m.Txn == o.Txn && m.Schedule == o.Schedule &&
		slices.Equal(m.Properties, o.Properties) && string(m.Body) == string(o.Body)
}

// head reads an encoded message up to its timestamp, without keeping
// anything, and returns its reliability byte (the flags of what follows).
func (r *reader) head() uint8 {
	r.span(int(r.u16("message id")), "message id")
	r.span(int(r.u16("topic")), "topic")
	r.u32("queue")
	rel := r.u8("reliability")
	r.i64("timestamp")
	return rel
}

// PeekProducerStamp reads the producer stamp of one encoded message (as
// AppendMessage writes it and a broker stores it) without decoding the
// rest. ok is false for an unstamped or malformed message.
func PeekProducerStamp(raw []byte) (s ProducerStamp, ok bool) {
	r := reader{b: raw}
	rel := r.head()
	if r.err != nil || rel&stampedFlag == 0 {
		return ProducerStamp{}, false
	}
	s.ID = r.u64("producer id")
	s.Epoch = r.u16("producer epoch")
	s.Seq = r.i64("producer sequence")
	return s, r.err == nil && s.ID != 0
}

// PeekSchedule reads the schedule of one encoded message without decoding
// the rest; ok is false for a malformed message (the zero Schedule with ok
// true: an ordinary one).
func PeekSchedule(raw []byte) (sc Schedule, ok bool) {
	r := reader{b: raw}
	rel := r.head()
	r.skipStamp(rel)
	if rel&scheduleFlag != 0 {
		sc.Kind = ScheduleKind(r.u8("schedule kind"))
		sc.At = r.i64("schedule time")
		sc.Ref = r.i64("schedule reference")
	}
	return sc, r.err == nil
}

// skipStamp passes the stamp and transaction number that rel says follow.
func (r *reader) skipStamp(rel uint8) {
	if rel&stampedFlag != 0 {
		r.span(stampSize, "producer stamp")
	}
	if rel&txnFlag != 0 {
		r.span(8, "transaction number")
	}
}

// PeekTxn reads the producer stamp and transaction number of one encoded
// message; ok is false for a malformed one (a zero TxnID with ok true: not
// in a transaction).
func PeekTxn(raw []byte) (id TxnID, ok bool) {
	r := reader{b: raw}
	rel := r.head()
	if rel&txnFlag == 0 || rel&stampedFlag == 0 {
		return TxnID{}, r.err == nil
	}
	id.Producer = r.u64("producer id")
	id.Epoch = r.u16("producer epoch")
	r.i64("producer sequence")
	id.Number = r.u64("transaction number")
	return id, r.err == nil
}

// RecoveredProperty is the property a message carries when a new master
// appended it again from the tail a failover cut from its old master's log
// (a NORMAL message the old master acknowledged that its slave never
// copied): "EPOCH@OFFSET", the epoch the old master led and the message's
// log offset there. Such a message lands after what its queue took since
// the failover: the one exception to per-key order.
const RecoveredProperty = "%recovered"

// PeekMessageID reads the message id of one encoded message without
// decoding the rest; ok is false for a malformed one.
func PeekMessageID(raw []byte) (id string, ok bool) {
	r := reader{b: raw}
	b := r.span(int(r.u16("message id")), "message id")
	if r.err != nil || len(b) == 0 {
		return "", false
	}
	return string(b), true
}
