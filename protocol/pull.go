package protocol

import (
	"encoding/binary"
	"fmt"
)

// PullRequest asks for the stored messages of one queue from an offset.
//
//	topic      u16 length + bytes
//	queue      u32
//	offset     i64, the first queue offset wanted
//	max bytes  u32, a soft cap on the messages returned (at least one is
//	           returned if any is there)
//	epoch      u32, the group epoch the reader's route names (0: unknown);
//	           a master that sees a newer one stops taking writes
//	wait ms    u32, how long the broker may hold a PULL that finds nothing
//	           at offset, answering as soon as a message arrives (a long
//	           poll; 0 answers at once)
//
// and then, all three or none (none: an anonymous reader of every message):
//
//	filter     u16 length + bytes: the reader's consumer group's filter
//	           (Filter; "": every message), at most MaxFilterLen bytes;
//	           the broker answers only the messages it matches, and its
//	           next offset passes the others
//	group      u16 length + bytes: the reader's consumer group ("": none),
//	           at most MaxTopicLen bytes
//	member     u16 length + bytes: the member reading, in the group, at
//	           most MaxTopicLen bytes (both as the reader says: nothing
//	           checks them against the registry)
//	[flags]    u8, only when not 0 (and then after the three above): bit
//	           0x01, read uncommitted: messages of open transactions too
//
// A reader of committed messages (the default) reads a queue only up to
// the first record of its oldest open transaction, and never a record of
// an aborted one; a reader of uncommitted messages reads to the end and
// skips aborted records only.
// The broker keeps a short record of which member of which group read
// which offsets (a message's journey).
type PullRequest struct {
	Topic      string
	Queue      uint32
	Offset     int64
	MaxBytes   uint32
	Epoch      uint32
	WaitMillis uint32
	Filter     string
	Group      string
	Member     string
	// ReadUncommitted reads messages of open transactions too.
	ReadUncommitted bool
}

// pullUncommitted is the flags bit of ReadUncommitted.
const pullUncommitted = 0x01

// AppendPullRequest appends p's encoding.
func AppendPullRequest(dst []byte, p *PullRequest) []byte {
	dst = appendStr16(dst, clip16(p.Topic))
	dst = appendU32(dst, p.Queue)
	dst = appendI64(dst, p.Offset)
	dst = appendU32(dst, p.MaxBytes)
	dst = appendU32(dst, p.Epoch)
	dst = appendU32(dst, p.WaitMillis)
	if p.Filter != "" || p.Group != "" || p.Member != "" || p.ReadUncommitted {
		dst = appendStr16(dst, clip16(p.Filter))
		dst = appendStr16(dst, clip16(p.Group))
		dst = appendStr16(dst, clip16(p.Member))
	}
	if p.ReadUncommitted {
		dst = appendU8(dst, pullUncommitted)
	}
	return dst
}

// DecodePullRequest decodes a PULL request body.
func DecodePullRequest(b []byte) (PullRequest, error) {
	var p PullRequest
	r := reader{b: b}
	p.Topic = r.str16("topic")
	p.Queue = r.u32("queue")
	p.Offset = r.i64("offset")
	p.MaxBytes = r.u32("max bytes")
	p.Epoch = r.u32("epoch")
	p.WaitMillis = r.u32("wait millis")
	if len(r.b) > 0 {
		if n := r.u16("filter"); int(n) > MaxFilterLen {
			r.fail(fmt.Sprintf("filter of %d bytes over the cap %d", n, MaxFilterLen))
		} else {
			p.Filter = string(r.span(int(n), "filter"))
		}
		p.Group = r.str16("group")
		p.Member = r.str16("member")
		if len(r.b) > 0 {
			if f := r.u8("flags"); f != pullUncommitted {
				r.fail(fmt.Sprintf("pull flags %#x (want 0x01, or none)", f))
			}
			p.ReadUncommitted = true
		}
		switch {
		case r.err != nil:
		case p.Filter == "" && p.Group == "" && p.Member == "" && !p.ReadUncommitted:
			r.fail("an empty filter, group and member (leave them out)")
		case len(p.Group) > MaxTopicLen || len(p.Member) > MaxTopicLen:
			r.fail(fmt.Sprintf("group or member name over %d bytes", MaxTopicLen))
		}
	}
	if err := r.done("pull request"); err != nil {
		return PullRequest{}, err
	}
	if p.Offset < 0 {
		return PullRequest{}, fmt.Errorf("%w: negative offset %d", ErrMalformed, p.Offset)
	}
	return p, nil
}

// StoredMessage is a message as read back from a queue.
type StoredMessage struct {
	QueueOffset int64
	LogOffset   int64
	StoreTime   int64 // unix ms when the broker stored it
	Message     Message
}

// PullResponse carries the messages found and where the next pull starts.
//
//	next offset  i64: the queue offset after the last message returned (the
//	             request's offset when none was)
//	min offset   i64: the queue's oldest available offset
//	max offset   i64: the queue's next offset to be written
//	epoch        u32: the group epoch of the broker's log (a reader names
//	             it in its next PULLs, so that after a failover a new
//	             master can tell whether the reader read past where the
//	             new epoch took the queue up)
//	count        u32, then per message: queue offset i64, log offset i64,
//	             store time i64 (unix ms), the message's encoding
type PullResponse struct {
	NextOffset int64
	MinOffset  int64
	MaxOffset  int64
	Epoch      uint32
	Messages   []StoredMessage
}

// AppendPullResponse appends p's encoding.
func AppendPullResponse(dst []byte, p *PullResponse) []byte {
	dst = AppendPullResponseHeader(dst, p.NextOffset, p.MinOffset, p.MaxOffset, p.Epoch, len(p.Messages))
	for i := range p.Messages {
		dst = AppendStoredMessage(dst, p.Messages[i].QueueOffset, p.Messages[i].LogOffset, p.Messages[i].StoreTime, &p.Messages[i].Message)
	}
	return dst
}

// AppendPullResponseHeader appends the part of a PULL response before its
// messages; the caller then appends count entries with AppendStoredMessage
// or AppendStoredRaw. It lets a broker copy stored encodings without decoding them.
func AppendPullResponseHeader(dst []byte, next, minOff, maxOff int64, epoch uint32, count int) []byte {
	dst = appendI64(dst, next)
	dst = appendI64(dst, minOff)
	dst = appendI64(dst, maxOff)
	dst = appendU32(dst, epoch)
	return appendU32(dst, uint32(count))
}

// AppendStoredMessage appends one entry of a PULL response.
func AppendStoredMessage(dst []byte, queueOffset, logOffset, storeTime int64, m *Message) []byte {
	return AppendMessage(appendStoredHeader(dst, queueOffset, logOffset, storeTime), m)
}

// AppendStoredRaw appends one entry of a PULL response whose message is
// already encoded (as AppendMessage wrote it).
func AppendStoredRaw(dst []byte, queueOffset, logOffset, storeTime int64, encoded []byte) []byte {
	return append(appendStoredHeader(dst, queueOffset, logOffset, storeTime), encoded...)
}

// appendStoredHeader appends the part of a PULL response's entry before
// its message.
func appendStoredHeader(dst []byte, queueOffset, logOffset, storeTime int64) []byte {
	dst = appendI64(dst, queueOffset)
	dst = appendI64(dst, logOffset)
	return appendI64(dst, storeTime)
}

// DecodePullResponse decodes a PULL response body. Message bodies alias b.
func DecodePullResponse(b []byte) (PullResponse, error) {
	var d PullDecoder
	return d.Decode(b)
}

// A PullDecoder decodes PULL response bodies, reusing its memory from one
// to the next: a reader that turns each answer's messages into its own
// values before it reads the next (a consumer's fetcher) allocates, per
// answer, one string for all its messages' ids, and nothing else when they
// are of one topic and without properties (DecodePullResponse made a slice
// of the answer's entries and a string per id). The zero value is ready; it
// is not safe for concurrent use.
type PullDecoder struct {
	msgs  []StoredMessage
	used  int      // the entries of msgs the last answer filled
	ids   []byte   // the ids of the messages decoded, end to end
	lens  []uint16 // and their lengths
	topic string   // the last message's topic, shared by the next ones of that topic
	tags  []string // tags met, shared by the next messages with one of them
}

// Decode decodes a PULL response body. Message bodies alias b; the
// messages' ids are pieces of one string. The answer's Messages are the
// decoder's: valid until its next Decode.
func (d *PullDecoder) Decode(b []byte) (PullResponse, error) {
	var p PullResponse
	r := reader{b: b, skipID: true, lastTopic: d.topic, tags: d.tags}
	p.NextOffset = r.i64("next offset")
	p.MinOffset = r.i64("min offset")
	p.MaxOffset = r.i64("max offset")
	p.Epoch = r.u32("epoch")
	n := r.count("message count", 24+minMessageSize)
	if n > 0 {
		if cap(d.msgs) < n {
			d.msgs = make([]StoredMessage, n)
		}
		p.Messages = d.msgs[:n]
		ids, lens := d.ids[:0], d.lens[:0]
		for i := 0; i < n && r.err == nil; i++ {
			sm := &p.Messages[i]
			sm.QueueOffset = r.i64("queue offset")
			sm.LogOffset = r.i64("log offset")
			sm.StoreTime = r.i64("store time")
			// message skips the id (skipID): its bytes are copied here,
			// to become one string once all are read.
			idLen := 0
			if len(r.b) >= 2 {
				idLen = int(binary.BigEndian.Uint16(r.b))
				if len(r.b) >= 2+idLen {
					ids = append(ids, r.b[2:2+idLen]...)
				}
			}
			lens = append(lens, uint16(idLen))
			r.message(&sm.Message)
		}
		d.ids, d.lens, d.topic, d.tags = ids, lens, r.lastTopic, r.tags
		if r.err == nil {
			all := string(ids)
			for i, l := range lens {
				p.Messages[i].Message.ID, all = all[:l], all[l:]
			}
		}
	}
	// What an earlier, longer answer left past this one's refers to its
	// bodies: let them go.
	if d.used > n {
		clear(d.msgs[n:d.used])
	}
	d.used = n
	if err := r.done("pull response"); err != nil {
		return PullResponse{}, err
	}
	return p, nil
}
