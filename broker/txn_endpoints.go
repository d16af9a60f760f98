package broker

import (
	"encoding/json"
	"fmt"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/protocol"
)

// handleTxnEnd answers TXN_END (protocol.TxnEndRequest): the master
// decides a transaction of its group. The principal must be allowed to
// send to every topic the transaction wrote here; only admin decides as
// TxnByAdmin.
func (b *Broker) handleTxnEnd(r *transport.Request) {
	var q protocol.TxnEndRequest
	if err := json.Unmarshal(r.Body, &q); err != nil {
		r.ReplyError(&protocol.Error{Status: protocol.StatusInvalid, Message: fmt.Sprintf("transaction end request: %v", err)})
		return
	}
	id := q.ID()
	switch {
	case id.Producer == 0 || id.Number == 0:
		r.ReplyError(&protocol.Error{Status: protocol.StatusInvalid, Message: "a transaction's producer id and number must not be 0"})
		return
	case q.By == "":
		q.By = protocol.TxnByProducer
	case q.By != protocol.TxnByProducer && q.By != protocol.TxnByChecker && q.By != protocol.TxnByChecks && q.By != protocol.TxnByAdmin:
		r.ReplyError(&protocol.Error{Status: protocol.StatusInvalid, Message: fmt.Sprintf("a transaction is decided by %q, %q, %q or %q, not %q",
			protocol.TxnByProducer, protocol.TxnByChecker, protocol.TxnByChecks, protocol.TxnByAdmin, q.By)})
		return
	}
	if b.acl != nil {
		if q.By == protocol.TxnByAdmin && !b.acl.holdsOnly(r, auth.KindAdmin) {
			r.ReplyError(&protocol.Error{Status: protocol.StatusNotAuthorized, Message: "only admin decides a transaction as admin"})
			return
		}
		if err := b.acl.check(r, protocol.CodeTxnEnd, auth.Target{Topics: txnTopics(b.txns.queuesOf(id))}); err != nil {
			r.ReplyError(err)
			return
		}
	}
	answer := func(rep protocol.TxnEndReply, err error) {
		if err != nil {
			r.ReplyError(err)
			return
		}
		replyJSON(r, rep)
	}
	if q.Prepare {
		b.txns.prepare(id, q.Seqs, answer)
		return
	}
	b.txns.end(id, q.Commit, q.By, q.Seqs, answer)
}

// txnTopics is the topics a transaction's queues belong to (a delayed
// message's internal topic counts as its target's).
func txnTopics(queues []protocol.TxnQueue) []string {
	var topics []string
	for _, q := range queues {
		t := q.Topic
		if target, ok := protocol.IsDelayTopic(t); ok {
			t = target
		}
		topics = append(topics, t)
	}
	return topics
}

// handleTxnList answers TXN_LIST (protocol.TxnListRequest): the group's
// open transactions, and its recent decisions not made by their producers.
// A principal without describe sees only the open transactions that wrote
// nothing but topics it may send to, and no decisions.
func (b *Broker) handleTxnList(r *transport.Request) {
	var q protocol.TxnListRequest
	if len(r.Body) > 0 {
		if err := json.Unmarshal(r.Body, &q); err != nil {
			r.ReplyError(&protocol.Error{Status: protocol.StatusInvalid, Message: fmt.Sprintf("transaction list request: %v", err)})
			return
		}
	}
	open, decided, err := b.txns.list(q.Producer)
	if err != nil {
		r.ReplyError(&protocol.Error{Status: protocol.StatusStoreError, Message: err.Error()})
		return
	}
	out := protocol.TxnList{Group: b.cfg.Group, Open: []protocol.TxnInfo{}, Decided: decided}
	describe := b.acl == nil || b.acl.holds(r, auth.KindDescribe)
	for _, t := range open {
		if describe || b.acl.check(r, protocol.CodeTxnEnd, auth.Target{Topics: txnTopics(t.Queues)}) == nil {
			out.Open = append(out.Open, t)
		}
	}
	if !describe {
		out.Decided = nil
	}
	replyJSON(r, out)
}
