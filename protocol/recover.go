package protocol

import "fmt"

// RECOVER (code 22, on the HA port, the cluster's permission) is a broker
// handing its group's master the records a failover cut from its log: the
// NORMAL messages it acknowledged as master that its slave never copied
// (and those in flight then). The master appends each again, once, as a
// recovered record, unless it holds it already (by stamp or message id).

// RecoverRequest carries whole commit-log records, as the sender's side
// file holds them.
//
//	epoch      u32: the group epoch the sender follows; only its master in
//	           that epoch takes the records
//	broker id  u16 length + bytes: the sender
//	from       i64: the log offset of the first record (where its log was
//	           cut, for the first batch of a cut)
//	cut        i64: where the cut began: the master looks for copies of the
//	           messages in its log from there on
//	records    u32 length + bytes: whole records, at most MaxFrameSize
type RecoverRequest struct {
	Epoch    uint32
	BrokerID string
	From     int64
	Cut      int64
	Records  []byte
}

// AppendRecoverRequest appends q's encoding.
func AppendRecoverRequest(dst []byte, q *RecoverRequest) []byte {
	dst = appendU32(dst, q.Epoch)
	dst = appendStr16(dst, clip16(q.BrokerID))
	dst = appendI64(dst, q.From)
	dst = appendI64(dst, q.Cut)
	return appendBytes32(dst, q.Records)
}

// DecodeRecoverRequest decodes a RECOVER request body; Records aliases b.
func DecodeRecoverRequest(b []byte) (RecoverRequest, error) {
	var q RecoverRequest
	r := reader{b: b}
	q.Epoch = r.u32("epoch")
	q.BrokerID = r.str16("broker id")
	q.From = r.i64("from")
	q.Cut = r.i64("cut")
	q.Records = r.bytes32("records", MaxFrameSize)
	if err := r.done("recover request"); err != nil {
		return RecoverRequest{}, err
	}
	if q.From < 0 || q.Cut < 0 || q.Cut > q.From {
		return RecoverRequest{}, fmt.Errorf("%w: recover from %d, cut at %d", ErrMalformed, q.From, q.Cut)
	}
	return q, nil
}

// RecoverResponse says what the master did with a RECOVER's records.
//
//	stored      u32: appended again, as recovered records
//	duplicates  u32: held already (by stamp or by message id): not appended
//	end         i64: the master's log end after the append: the sender keeps
//	            its side file until its own log reaches it
type RecoverResponse struct {
	Stored     uint32
	Duplicates uint32
	End        int64
}

// AppendRecoverResponse appends p's encoding.
func AppendRecoverResponse(dst []byte, p *RecoverResponse) []byte {
	dst = appendU32(dst, p.Stored)
	dst = appendU32(dst, p.Duplicates)
	return appendI64(dst, p.End)
}

// DecodeRecoverResponse decodes a RECOVER answer.
func DecodeRecoverResponse(b []byte) (RecoverResponse, error) {
	var p RecoverResponse
	r := reader{b: b}
	p.Stored = r.u32("stored")
	p.Duplicates = r.u32("duplicates")
	p.End = r.i64("end")
	if err := r.done("recover response"); err != nil {
		return RecoverResponse{}, err
	}
	if p.End < 0 {
		return RecoverResponse{}, fmt.Errorf("%w: negative log end %d", ErrMalformed, p.End)
	}
	return p, nil
}
