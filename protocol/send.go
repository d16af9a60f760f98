package protocol

import (
	"encoding/binary"
	"strings"
)

// A SEND request body is a batch of messages, with the group epoch the
// sender's route names:
//
//	epoch u32: the broker group's epoch in the sender's route; 0 when the
//	      sender does not know it. A broker whose own epoch is lower has
//	      been replaced as master: it stops taking writes and answers
//	      NOT_MASTER.
//	count u32, then count messages (see Message)
//
// The response body has one result per message, in the same order:
//
//	count u32, then per message: status u16, queue offset i64, log offset i64

// AppendSendRequest appends a SEND body carrying msgs for a group at epoch.
func AppendSendRequest(dst []byte, epoch uint32, msgs []Message) []byte {
	dst = AppendSendRequestHeader(dst, epoch, len(msgs))
	for i := range msgs {
		dst = AppendMessage(dst, &msgs[i])
	}
	return dst
}

// SendRequestHeaderSize is the size of a SEND body before its messages.
const SendRequestHeaderSize = 8

// AppendSendRequestHeader appends the part of a SEND body before its
// messages; the caller then appends count messages with AppendMessage.
func AppendSendRequestHeader(dst []byte, epoch uint32, count int) []byte {
	dst = appendU32(dst, epoch)
	return appendU32(dst, uint32(count))
}

// DecodeSendRequest decodes a SEND body: its epoch, and its messages
// appended to msgs (pass a reused slice to avoid allocating). Message bodies
// alias b.
func DecodeSendRequest(b []byte, msgs []Message) (uint32, []Message, error) {
	epoch, msgs, _, err := decodeSendRequest(b, msgs, false)
	return epoch, msgs, err
}

// DecodeSendRequestRaw is DecodeSendRequest that also returns each message's
// encoding (as AppendMessage writes it), aliasing b, so a broker can store a
// message without encoding it again. The messages' ids share one string
// (one allocation per batch, not one per message).
func DecodeSendRequestRaw(b []byte) (uint32, []Message, [][]byte, error) {
	return decodeSendRequest(b, nil, true)
}

func decodeSendRequest(b []byte, msgs []Message, wantRaw bool) (uint32, []Message, [][]byte, error) {
	r := reader{b: b, skipID: wantRaw}
	epoch := r.u32("epoch")
	n := r.count("message count", minMessageSize)
	if n == 0 && r.err == nil {
		return epoch, msgs, nil, r.done("send request")
	}
	base := len(msgs)
	msgs = append(msgs, make([]Message, n)...)
	var raws [][]byte
	if wantRaw {
		raws = make([][]byte, n)
	}
	for i := base; i < len(msgs) && r.err == nil; i++ {
		start := r.b
		r.message(&msgs[i])
		if wantRaw && r.err == nil {
			used := len(start) - len(r.b)
			raws[i-base] = start[:used:used]
		}
	}
	if err := r.done("send request"); err != nil {
		return 0, msgs[:base], nil, err
	}
	if wantRaw {
		setIDs(msgs[base:], raws)
	}
	return epoch, msgs, raws, nil
}

// setIDs sets each message's id from its encoding, which starts with the
// id (a u16 length, then its bytes): every id is a piece of one string.
func setIDs(msgs []Message, raws [][]byte) {
	total := 0
	for _, raw := range raws {
		total += int(binary.BigEndian.Uint16(raw))
	}
	var sb strings.Builder
	sb.Grow(total)
	for _, raw := range raws {
		sb.Write(raw[2 : 2+int(binary.BigEndian.Uint16(raw))])
	}
	all, at := sb.String(), 0
	for i, raw := range raws {
		n := int(binary.BigEndian.Uint16(raw))
		msgs[i].ID = all[at : at+n]
		at += n
	}
}

// SendResult is the outcome of one message of a SEND batch.
type SendResult struct {
	Status      Status
	QueueOffset int64 // the message's offset in its queue; valid when Status is OK
	LogOffset   int64 // the message's byte offset in the commit log; valid when Status is OK
}

const sendResultSize = 2 + 8 + 8

// AppendSendResponse appends a SEND response body.
func AppendSendResponse(dst []byte, results []SendResult) []byte {
	dst = appendU32(dst, uint32(len(results)))
	for _, res := range results {
		dst = appendU16(dst, uint16(res.Status))
		dst = appendI64(dst, res.QueueOffset)
		dst = appendI64(dst, res.LogOffset)
	}
	return dst
}

// DecodeSendResponse decodes a SEND response body, appending to results.
func DecodeSendResponse(b []byte, results []SendResult) ([]SendResult, error) {
	r := reader{b: b}
	n := r.count("result count", sendResultSize)
	base := len(results)
	for i := 0; i < n && r.err == nil; i++ {
		results = append(results, SendResult{
			Status:      Status(r.u16("status")),
			QueueOffset: r.i64("queue offset"),
			LogOffset:   r.i64("log offset"),
		})
	}
	if err := r.done("send response"); err != nil {
		return results[:base], err
	}
	return results, nil
}
