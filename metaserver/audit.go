package metaserver

import (
	"bytes"
	"context"
	"crypto/hmac"
	"encoding/json"
	"fmt"
	"time"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/metaserver/fsm"
	"github.com/ferrymq/ferrymq/protocol"
)

// The audit trail (fsm/audit.go): apply stamps every entry it proposes with
// the principal of the request it serves (an actor's, for the console) and
// the leader's clock; the FSM keeps a record of the commands that change
// the registry; AUDIT_LIST reads them; the judge's rounds expire them
// after Config.AuditRetention.

// Audit retention: the default and the bounds of Config.AuditRetention.
const (
	DefaultAuditRetention = 30 * 24 * time.Hour
	MinAuditRetention     = time.Hour
	MaxAuditRetention     = 3650 * 24 * time.Hour
)

const (
	// auditExpiryInterval is how often the leader looks for records older
	// than the retention (it proposes an expiry only when it finds one).
	auditExpiryInterval = time.Minute
	// auditScan is the most records one AUDIT_LIST looks at, so that a
	// filter matching few of 100,000 records answers in bounded time (with
	// a cursor to go on).
	auditScan = 20_000
	// maxAuditFilter is the longest principal or kind a filter names.
	maxAuditFilter = 200
	// viaConsole is the stamp's Via of a request the console made for a
	// certificate session.
	viaConsole = "console"
)

func (s *Server) auditRoutes() {
	handle(s, protocol.CodeAuditList, true, s.auditList)
}

// auditList serves AUDIT_LIST.
func (s *Server) auditList(_ context.Context, req api.AuditListRequest) (api.AuditList, error) {
	if len(req.Principal) > maxAuditFilter || len(req.Kind) > maxAuditFilter {
		return api.AuditList{}, invalid("AUDIT_LIST filters are at most %d bytes", maxAuditFilter)
	}
	if req.Limit < 0 || req.Limit > api.MaxAuditPage {
		return api.AuditList{}, invalid("AUDIT_LIST limit is 1 to %d, got %d", api.MaxAuditPage, req.Limit)
	}
	if req.Limit == 0 {
		req.Limit = 100
	}
	recs, next := s.fsm.AuditRecords(fsm.AuditQuery{Principal: req.Principal, Kind: req.Kind, Below: req.Below,
		Limit: req.Limit, Scan: auditScan})
	out := api.AuditList{Records: make([]api.AuditRecord, len(recs)), Next: next, Held: s.fsm.AuditLen()}
	for i, r := range recs {
		out.Records[i] = api.AuditRecord{Index: r.Index, AtMillis: r.At, Principal: r.Principal, Via: r.Via, Kind: r.Kind,
			Summary: r.Summary, Applied: r.Applied, Refusal: r.Refusal}
	}
	return out, nil
}

// expireAudit drops, at most once an auditExpiryInterval, the records
// older than the retention by the leader's clock: the judge calls it at
// the end of each round.
func (s *Server) expireAudit(ctx context.Context, now time.Time) {
	if !s.auditCheckedAt.IsZero() && now.Sub(s.auditCheckedAt) < auditExpiryInterval {
		return
	}
	s.auditCheckedAt = now
	before := now.Add(-s.cfg.AuditRetention).UnixMilli()
	if !s.fsm.OldestAuditBefore(before) {
		return
	}
	res, err := s.apply(ctx, &fsm.AuditExpire{Before: before})
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("expiring audit records failed", "error", err)
		}
		return
	}
	s.log.Info("audit records expired", "records", res.Expired, "before", before)
}

// noteAudit records an act made outside the state machine (a voter
// change); a failure is logged, the act stands.
func (s *Server) noteAudit(ctx context.Context, kind string, args any) {
	b, _ := json.Marshal(args)
	if _, err := s.apply(ctx, &fsm.AuditNote{Kind: kind, Summary: string(b)}); err != nil {
		s.log.Warn("recording an audit note failed", "kind", kind, "error", err)
	}
}

// stampKey is the context key of the audit stamp of the request a handler
// serves (requestContext).
type stampKey struct{}

// stampOf is the stamp apply puts on the entries proposed in ctx: the
// request's principal, or the leader's own when ctx serves no request.
func (s *Server) stampOf(ctx context.Context) fsm.Stamp {
	st, ok := ctx.Value(stampKey{}).(fsm.Stamp)
	if !ok {
		st = fsm.Stamp{Principal: auth.ClusterName, Via: "leader " + s.cfg.ID}
	}
	st.At = s.cfg.Clock.Now().UnixMilli()
	return st
}

// actAsKey is how a request body names an actor (client.Config.ActAs).
var actAsKey = []byte(`"` + client.ActAsField + `"`)

// actorOf returns the principal a JSON request is made for, when its body
// names one (client.Config.ActAs), else nil. Only a principal holding the
// cluster permission (the console, with the servers' token) may name one:
// anyone else is refused NOT_AUTHORIZED. The actor must be a registry
// principal (who a certificate names). With authorization off nothing is
// checked and the field is ignored.
func (s *Server) actorOf(r *transport.Request) (*auth.Principal, error) {
	if !s.cfg.AuthEnabled() || !bytes.Contains(r.Body, actAsKey) {
		return nil, nil
	}
	var named struct {
		ActAs    string `json:"act_as"`
		ActProof string `json:"act_proof"`
	}
	if err := json.Unmarshal(r.Body, &named); err != nil || named.ActAs == "" {
		return nil, nil // the handler's decoding says what is wrong
	}
	t := s.ACL()
	p, err := auth.Resolve(r, t)
	if err != nil {
		return nil, err
	}
	// The cluster token is every server's, brokers' too: acting for
	// another also needs the proof only a raft secret's holder can make.
	if !p.Has(auth.Cluster) || s.cfg.RaftSecret == "" ||
		!hmac.Equal([]byte(named.ActProof), []byte(auth.ActorProof(s.cfg.RaftSecret, named.ActAs))) {
		return nil, &protocol.Error{Status: protocol.StatusNotAuthorized,
			Message: fmt.Sprintf("principal %q may not act for another principal (only a metaserver's console may)", p.Name)}
	}
	actor, ok := t.Lookup(named.ActAs)
	if !ok {
		return nil, &protocol.Error{Status: protocol.StatusNotAuthorized,
			Message: fmt.Sprintf("principal %q, acted for, is not known", protocol.Clip(named.ActAs))}
	}
	return &actor, nil
}
