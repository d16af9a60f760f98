package metaserver

import (
	"context"
	"slices"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/fsm"
	"github.com/ferrymq/ferrymq/protocol"
)

// Authorization on the RPC port (Config.ClusterToken turns it on). The
// transport serves an unauthenticated connection nothing but AUTH and
// IDENTIFY (its gate, auth.Gate: admissionGate); every other request is
// checked here against this node's table (ACL), before its handler: the
// generic handle() with the request's target (targetOf), the route lookups
// with their topic. A refusal is NOT_AUTHORIZED naming the permission
// missing; nothing of the request is applied.

// admissionGate is what a connection to the RPC port may do before it
// authenticates (transport.ServerConfig.Gate): with authorization on,
// AUTH and IDENTIFY only, within auth's default caps, shares, deadlines
// and AUTH backoff; off, no gate.
func (s *Server) admissionGate() transport.Gate {
	if !s.cfg.AuthEnabled() {
		return nil
	}
	s.gate = auth.NewGate(auth.GateConfig{Logger: s.log.Named("rpc")})
	return s.gate
}

// AuthFailures is how many AUTHs failed on the RPC port (the
// ferrymq_metaserver_auth_failures_total metric); 0 with authorization off.
func (s *Server) AuthFailures() int64 {
	if s.gate == nil {
		return 0
	}
	return s.gate.AuthFailures()
}

// authRoutes registers AUTH and the ACL's requests.
func (s *Server) authRoutes() {
	s.rpc.Handle(protocol.CodeAuth, func(r *transport.Request) {
		if !s.cfg.AuthEnabled() {
			_ = r.Reply(protocol.AppendAuthReply(nil, &protocol.AuthReply{}))
			return
		}
		if auth.BeginLogin(r) { // else in its backoff: answered later
			auth.AnswerLogin(r, r.Body, s.ACL(), s.ACL)
		}
	})
	handle(s, protocol.CodeAdminACLSet, true, s.aclSet)
	handle(s, protocol.CodeAdminACLRemove, true, func(ctx context.Context, req api.ACLRemoveRequest) (api.ACLChangeReply, error) {
		ch, err := s.RemovePrincipal(ctx, req.Name, req.ExpectVersion)
		return api.ACLChangeReply{Changed: ch.Changed, Version: ch.Version}, err
	})
	handle(s, protocol.CodeAdminACLList, true, s.aclList)
	handle(s, protocol.CodeACLGet, true, s.aclGet)
}

// aclGet serves ACL_GET, the brokers' copy of the table: the principals'
// names and permissions, and of the token hashes asked, whose each is. No
// principal reads every token hash this way: a broker asks about the
// tokens presented to it (docs/decisions/broker-token-checks.md).
func (s *Server) aclGet(_ context.Context, req api.ACLGetRequest) (api.ACL, error) {
	if len(req.TokenSHA256) > api.MaxACLGetTokens {
		return api.ACL{}, invalid("ACL_GET asks about at most %d tokens, got %d", api.MaxACLGetTokens, len(req.TokenSHA256))
	}
	t := s.ACL()
	out := api.ACL{Version: t.Version(), Principals: []api.ACLPrincipal{}}
	for _, p := range t.Principals() {
		out.Principals = append(out.Principals, api.ACLPrincipal{Name: p.Name, Permissions: auth.Strings(p.Permissions)})
	}
	for _, text := range req.TokenSHA256 {
		var h auth.TokenHash
		if err := h.UnmarshalText([]byte(text)); err != nil {
			return api.ACL{}, invalid("ACL_GET: %v", err)
		}
		p, ok := t.AuthenticateHash(h)
		switch {
		case !ok:
		case !p.BuiltIn:
			if out.Tokens == nil {
				out.Tokens = map[string]string{}
			}
			out.Tokens[h.String()] = p.Name
		case p.IsAdmin():
			out.AdminSHA256 = h.String()
		}
	}
	return out, nil
}

func (s *Server) aclSet(ctx context.Context, req api.ACLSetRequest) (api.ACLChangeReply, error) {
	var h auth.TokenHash
	if err := h.UnmarshalText([]byte(req.TokenSHA256)); err != nil {
		return api.ACLChangeReply{}, invalid("principal %q: %v", req.Name, err)
	}
	ch, err := s.SetPrincipal(ctx, req.Name, h, req.Permissions, req.ExpectVersion)
	return api.ACLChangeReply{Changed: ch.Changed, Version: ch.Version}, err
}

func (s *Server) aclList(context.Context, empty) (api.ACL, error) {
	t := s.fsm.ACL()
	out := api.ACL{Version: t.Version(), Principals: []api.ACLPrincipal{}}
	for _, p := range t.Principals() {
		out.Principals = append(out.Principals, api.ACLPrincipal{Name: p.Name, TokenSHA256: p.TokenHash.String(),
			Permissions: auth.Strings(p.Permissions)})
	}
	return out, nil
}

// authorize checks the request r of code with target against this node's
// table; nil when authorization is off.
func (s *Server) authorize(r *transport.Request, code protocol.Code, target auth.Target) error {
	if !s.cfg.AuthEnabled() {
		return nil
	}
	return auth.Check(r, s.ACL(), code, target)
}

// principalKey is the context key of the principal making a request
// (requestContext).
type principalKey struct{}

// requestContext is the context a handler of r runs in: with
// authorization on it carries r's principal, or the actor the request is
// made for (actorOf), (principalOf, describesTopic), and always the audit
// stamp of the commands it proposes (stampOf).
func (s *Server) requestContext(r *transport.Request, actor *auth.Principal) context.Context {
	ctx := context.Background()
	if !s.cfg.AuthEnabled() {
		return context.WithValue(ctx, stampKey{}, fsm.Stamp{})
	}
	if actor != nil {
		ctx = context.WithValue(ctx, principalKey{}, *actor)
		return context.WithValue(ctx, stampKey{}, fsm.Stamp{Principal: actor.Name, Via: viaConsole})
	}
	p, err := auth.Resolve(r, s.ACL())
	if err == nil {
		ctx = context.WithValue(ctx, principalKey{}, p)
	}
	return context.WithValue(ctx, stampKey{}, fsm.Stamp{Principal: p.Name})
}

// principalOf is the name of the principal making the request a handler
// serves ("": authorization is off).
func principalOf(ctx context.Context) string {
	p, _ := ctx.Value(principalKey{}).(auth.Principal)
	return p.Name
}

// describesTopic returns what a CONSUMER_GROUPS answer about group may show
// the principal making the request: every topic for admin and describe
// (and with authorization off), else only the topics one of its consume
// permissions matches together with the group, so that a consumer of a
// group does not read the group's offsets of topics it may not consume.
func describesTopic(ctx context.Context, group string) func(topic string) bool {
	p, ok := ctx.Value(principalKey{}).(auth.Principal)
	if !ok || auth.Authorize(p, protocol.CodeConsumerGroups, auth.Target{}) == nil {
		return nil // every topic
	}
	return func(topic string) bool {
		return auth.Authorize(p, protocol.CodeCommitOffsets, auth.Target{Topics: []string{topic}, Group: group}) == nil
	}
}

// authorizeTopic checks a route lookup (ROUTE_LOOKUP or ROUTE_GET) of
// topic.
func (s *Server) authorizeTopic(r *transport.Request, topic string) error {
	return s.authorize(r, r.Code, auth.Topic(topic))
}

// targetOf is what a decoded request names, as far as permissions go.
func targetOf(req any) auth.Target {
	switch q := req.(type) {
	case api.CreateTopicRequest:
		return auth.Topic(q.Name)
	case api.AddQueuesRequest:
		return auth.Topic(q.Topic)
	case api.ConsumerHeartbeat:
		return auth.Target{Topics: sortedTopics(q.Topics), Group: q.Group}
	case api.CommitRequest:
		return auth.Target{Topics: offsetTopics(q.Offsets), Group: q.Group}
	case api.ResetOffsetsRequest:
		return auth.Target{Topics: offsetTopics(q.Offsets), Group: q.Group}
	case api.ConsumerGroupsRequest:
		return auth.Target{Group: q.Group}
	case api.SetGroupFilterRequest:
		return auth.Target{Group: q.Group}
	}
	return auth.Target{}
}

func sortedTopics(topics []string) []string {
	out := slices.Clone(topics)
	slices.Sort(out)
	return slices.Compact(out)
}

func offsetTopics(offs []api.QueueOffset) []string {
	out := make([]string, len(offs))
	for i, o := range offs {
		out[i] = o.Topic
	}
	return sortedTopics(out)
}

// clusterClient is the transport config of this node's own connections to
// the other nodes: TLS, and the cluster token when authorization is on.
func (s *Server) clusterClient() transport.ClientConfig {
	return transport.ClientConfig{TLS: s.cfg.TLSClient, Login: auth.TokenLogin(s.cfg.ClusterToken)}
}
