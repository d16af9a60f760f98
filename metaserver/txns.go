package metaserver

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/fsm"
	"github.com/ferrymq/ferrymq/protocol"
)

// The registry's transaction decisions (fsm/txns.go): TXN_DECIDE records a
// transaction's decision with one Raft write, the first winning;
// TXN_DONE reports the broker groups that applied it; TXN_DECISIONS lists
// what is held. All three are leader requests: a follower answers
// NOT_LEADER naming the leader, and the client asks it.

// txnExpiryInterval is how often the leader looks for decisions older
// than fsm.TxnRetentionMillis (it proposes an expiry only when it finds
// one).
const txnExpiryInterval = time.Minute

func (s *Server) txnRoutes() {
	handle(s, protocol.CodeTxnDecide, true, s.txnDecide)
	handle(s, protocol.CodeTxnDone, true, s.txnDone)
	handle(s, protocol.CodeTxnDecisions, true, s.txnDecisions)
}

// txnDecide serves TXN_DECIDE: one Raft write, answered once applied with
// the transaction's decision (this one, or the one recorded before).
func (s *Server) txnDecide(ctx context.Context, req api.TxnDecideRequest) (api.TxnDecision, error) {
	cmd := &fsm.TxnDecide{Producer: req.Producer, Epoch: req.Epoch, Number: req.Number, Commit: req.Commit, By: req.By,
		Groups: req.Groups, At: s.cfg.Clock.Now().UnixMilli(), Principal: principalOf(ctx)}
	if err := s.mayDecideAs(ctx, req.By); err != nil {
		return api.TxnDecision{}, s.refuseTxn(err)
	}
	if o := req.Offsets; o != nil {
		off, err := s.txnOffsets(ctx, *o)
		if err != nil {
			return api.TxnDecision{}, s.refuseTxn(err)
		}
		cmd.Offsets = off
	}
	if err := cmd.Check(); err != nil {
		return api.TxnDecision{}, s.refuseTxn(err)
	}
	res, err := s.apply(ctx, cmd)
	if err != nil {
		return api.TxnDecision{}, s.refuseTxn(err)
	}
	if res.Changed {
		outcome := "abort"
		if res.Txn.Committed {
			outcome = "commit"
		}
		s.txnm.decisions.WithLabelValues(outcome).Inc()
		if req.Offsets != nil {
			s.consumers.commits.Add(1)
			s.consumers.noteRedelivered(req.Offsets.Group, req.Offsets.Member, req.Offsets.Redelivered)
		}
		s.log.Debug("transaction decided", "txn", cmd.Key().ID(), "outcome", outcome, "by", req.By, "groups", len(req.Groups))
	}
	return txnDecision(cmd.Key(), *res.Txn), nil
}

// reporter is who a TXN_DONE is from, as the record checks it: "" for a
// broker or an operator (cluster, admin), who report any decision applied;
// else the principal, who reports only its own decisions.
func (s *Server) reporter(ctx context.Context) string {
	p, _ := ctx.Value(principalKey{}).(auth.Principal)
	for _, q := range p.Permissions {
		if q.Kind == auth.KindCluster || q.Kind == auth.KindAdmin {
			return ""
		}
	}
	return p.Name
}

// mayDecideAs refuses a decision made as an operator by a principal
// without admin, and one made as a master's timeout by one without the
// cluster permission (a broker's).
func (s *Server) mayDecideAs(ctx context.Context, by string) error {
	if !s.cfg.AuthEnabled() || by != protocol.TxnByAdmin && by != protocol.TxnByTimeout {
		return nil
	}
	p, _ := ctx.Value(principalKey{}).(auth.Principal)
	want := auth.KindAdmin
	if by == protocol.TxnByTimeout {
		want = auth.KindCluster
	}
	for _, q := range p.Permissions {
		if q.Kind == want || q.Kind == auth.KindAdmin {
			return nil
		}
	}
	return &protocol.Error{Status: protocol.StatusNotAuthorized,
		Message: fmt.Sprintf("principal %q may not decide a transaction as %q (that needs %s)", p.Name, by, want)}
}

// txnOffsets checks the offsets a decision commits as COMMIT_OFFSETS
// checks a commit before its write, the permission included: who may
// decide a transaction must also be allowed to commit the consumer
// group's offsets of every topic named (COMMIT_OFFSETS's rule).
func (s *Server) txnOffsets(ctx context.Context, o api.CommitRequest) (*fsm.TxnOffsets, error) {
	if err := validateMember(o.Group, o.Member); err != nil {
		return nil, err
	}
	if err := checkOffsets("commit", o.Offsets); err != nil {
		return nil, err
	}
	if len(o.Redelivered) > api.MaxRedelivered {
		return nil, invalid("a commit reports at most %d redeliveries, got %d", api.MaxRedelivered, len(o.Redelivered))
	}
	if s.cfg.AuthEnabled() {
		p, ok := ctx.Value(principalKey{}).(auth.Principal)
		if !ok {
			return nil, &protocol.Error{Status: protocol.StatusNotAuthorized, Message: "TXN_DECIDE with offsets: no principal"}
		}
		if err := auth.Authorize(p, protocol.CodeCommitOffsets, auth.Target{Topics: offsetTopics(o.Offsets), Group: o.Group}); err != nil {
			return nil, err
		}
	}
	return &fsm.TxnOffsets{Group: o.Group, Member: o.Member, Generation: o.Generation, Incarnation: o.Incarnation,
		Offsets: toFSMOffsets(o.Offsets), Principal: principalOf(ctx)}, nil
}

// refuseTxn counts a refused TXN_DECIDE by its status and returns err.
func (s *Server) refuseTxn(err error) error {
	status := protocol.StatusInternal
	var pe *protocol.Error
	if errors.As(err, &pe) {
		status = pe.Status
	}
	s.txnm.refused.WithLabelValues(status.String()).Inc()
	return err
}

// txnDone serves TXN_DONE. A report that changes nothing the leader's
// registry holds (no such record, or none of the groups pending) is
// answered without a write: a decision is applied here before it is
// answered, so a report can only be about a record already held.
func (s *Server) txnDone(ctx context.Context, req api.TxnDoneRequest) (empty, error) {
	cmd := &fsm.TxnDone{Producer: req.Producer, Epoch: req.Epoch, Number: req.Number, Groups: req.Groups, Principal: s.reporter(ctx)}
	if err := fsm.CheckTxnKey(cmd.Key()); err != nil {
		return empty{}, err
	}
	if err := fsm.CheckTxnGroups(req.Groups); err != nil {
		return empty{}, err
	}
	r, ok := s.fsm.Txn(cmd.Key())
	if !ok || !slices.ContainsFunc(r.Pending, func(g string) bool { return slices.Contains(req.Groups, g) }) {
		return empty{}, nil
	}
	if _, err := s.apply(ctx, cmd); err != nil {
		return empty{}, err
	}
	return empty{}, nil
}

// txnDecisions serves TXN_DECISIONS from this node's registry.
func (s *Server) txnDecisions(_ context.Context, req api.TxnDecisionsRequest) (api.TxnDecisions, error) {
	limit := req.Limit
	switch {
	case limit < 0:
		return api.TxnDecisions{}, invalid("limit %d: want 0 (the default, %d) to %d", limit, api.DefaultTxnDecisions, api.MaxTxnDecisions)
	case limit == 0:
		limit = api.DefaultTxnDecisions
	case limit > api.MaxTxnDecisions:
		limit = api.MaxTxnDecisions
	}
	entries, more := s.fsm.TxnDecisions(req.Producer, limit)
	out := api.TxnDecisions{Records: make([]api.TxnDecision, len(entries)), More: more}
	for i, e := range entries {
		out.Records[i] = txnDecision(e.Key, e.TxnRecord)
	}
	return out, nil
}

func txnDecision(k fsm.TxnKey, r fsm.TxnRecord) api.TxnDecision {
	return api.TxnDecision{Producer: k.Producer, Epoch: k.Epoch, Number: k.Number, Committed: r.Committed, By: r.By, At: r.At,
		Groups: slices.Clone(r.Groups), Pending: slices.Clone(r.Pending), Offsets: r.Offsets}
}

// expireTxns deletes, at most once a txnExpiryInterval, the decisions
// older than fsm.TxnRetentionMillis by the leader's clock: the judge calls
// it at the end of each round (so it stops with the leader's work, and a
// test moving a fake clock waits for it with WaitJudged).
func (s *Server) expireTxns(ctx context.Context, now time.Time) {
	if !s.txnsCheckedAt.IsZero() && now.Sub(s.txnsCheckedAt) < txnExpiryInterval {
		return
	}
	s.txnsCheckedAt = now
	before := now.UnixMilli() - fsm.TxnRetentionMillis
	if !s.fsm.TxnsDecidedBefore(before) {
		return
	}
	res, err := s.apply(ctx, &fsm.TxnExpire{Before: before})
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("expiring transaction decisions failed", "error", err)
		}
		return
	}
	s.txnm.expired.Add(float64(res.Expired))
	s.log.Info("transaction decisions expired: some of their broker groups never reported done",
		"decisions", res.Expired, "decided-before", before)
}
