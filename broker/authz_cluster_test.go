package broker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/broker"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/producer"
	"github.com/ferrymq/ferrymq/protocol"

	tc "github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/sdk"
)

// authCluster is a metaserver and a group (master and slave) with
// authorization on, and an admin client.
type authCluster struct {
	*tc.Cluster
	adminTok, clusterTok string
	admin                *client.Client
}

func startAuthCluster(t *testing.T) *authCluster {
	t.Helper()
	ac := &authCluster{adminTok: auth.NewToken(), clusterTok: auth.NewToken()}
	ac.Cluster = tc.Start(t, tc.Opts{Groups: []string{"g1"}, Slaves: true,
		MetaEdit: func(c *metaserver.Config) {
			tc.SteadyMeta(c)
			c.ClusterToken = ac.clusterTok
			c.Auth.Admin = auth.HashToken(ac.adminTok)
		},
		BrokerEdit: func(c *broker.Config) {
			tc.SteadyBroker(c)
			c.ClusterToken = ac.clusterTok
		},
	})
	var err error
	if ac.admin, err = client.New(client.Config{Addrs: ac.Meta.Addrs(), Token: ac.adminTok}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ac.admin.Close() })
	return ac
}

// addPrincipal makes a principal with a fresh token and returns the token.
func (ac *authCluster) addPrincipal(t *testing.T, name string, perms ...string) string {
	t.Helper()
	tok := auth.NewToken()
	if _, err := ac.admin.SetPrincipal(context.Background(), api.ACLSetRequest{Name: name,
		TokenSHA256: auth.HashToken(tok).String(), Permissions: perms}); err != nil {
		t.Fatal(err)
	}
	return tok
}

// ports are one peer's connections to the three kinds of port.
type ports struct{ meta, data, ha *transport.Client }

func (ac *authCluster) dial(t *testing.T, token string) ports {
	dial := func(addr string) *transport.Client {
		c := transport.NewClient(addr, transport.ClientConfig{Login: auth.TokenLogin(token), CallTimeout: 5 * time.Second})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	m := ac.Master("g1")
	return ports{meta: dial(ac.MetaAddr()), data: dial(m.Addr()), ha: dial(m.HAAddr())}
}

func js(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

// request is one request of a code, sent where that code is served, that
// changes nothing the test depends on.
type request struct {
	port func(ports) *transport.Client
	body []byte
}

func onMeta(p ports) *transport.Client { return p.meta }
func onData(p ports) *transport.Client { return p.data }
func onHA(p ports) *transport.Client   { return p.ha }

func requests() map[protocol.Code]request {
	msg := tc.Msg("orders", 0, protocol.Normal, "x")
	return map[protocol.Code]request{
		protocol.CodeIdentify: {onMeta, nil},
		protocol.CodeAuth:     {onMeta, nil}, // sent with the peer's own token below
		protocol.CodeSend:     {onData, protocol.AppendSendRequest(nil, 0, []protocol.Message{msg})},
		protocol.CodePull:     {onData, protocol.AppendPullRequest(nil, &protocol.PullRequest{Topic: "orders", MaxBytes: 1024})},
		// Past the log's end: NOT_FOUND once the principal may send to (or
		// describe) some topic; the record's own topic is checked after.
		protocol.CodeDelayedCancel: {onData, js(protocol.DelayedRef{Offset: 1 << 40})},
		protocol.CodeDelayedState:  {onData, js(protocol.DelayedRef{Offset: 1 << 40})},
		protocol.CodeDelayedList:   {onData, js(protocol.DelayedListRequest{})},
		protocol.CodeQueueCount:    {onData, js(protocol.QueueCountRequest{Topic: "orders", To: 10, Filter: "A"})},
		protocol.CodeLookup:        {onData, []byte(`{"offset":0}`)},
		// A transaction with nothing here: who may send to some topic
		// decides it (a mark fences its late records).
		protocol.CodeTxnEnd:            {onData, js(protocol.TxnEndRequest{Producer: 1, Epoch: 1, Number: 1})},
		protocol.CodeTxnList:           {onData, js(protocol.TxnListRequest{})},
		protocol.CodeHAFetch:           {onHA, protocol.AppendHAFetchRequest(nil, &protocol.HAFetchRequest{BrokerID: "nobody", MaxBytes: 1024})},
		protocol.CodeHAAck:             {onHA, protocol.AppendHAAck(nil, &protocol.HAAck{BrokerID: "nobody"})},
		protocol.CodeRecover:           {onHA, protocol.AppendRecoverRequest(nil, &protocol.RecoverRequest{Epoch: 99, BrokerID: "nobody"})},
		protocol.CodeHeartbeat:         {onMeta, js(api.Heartbeat{})}, // INVALID once allowed
		protocol.CodeRouteLookup:       {onMeta, []byte("orders")},
		protocol.CodeRouteGet:          {onMeta, []byte("orders")},
		protocol.CodeInitProducer:      {onMeta, js(api.InitProducerRequest{})},
		protocol.CodeRouteWatch:        {onMeta, js(api.RouteWatch{Group: "g9", BrokerID: "nobody"})}, // answered at once (no wait)
		protocol.CodeAdminGroups:       {onMeta, js(struct{}{})},
		protocol.CodeAdminTopics:       {onMeta, js(struct{}{})},
		protocol.CodeAdminCreateTopic:  {onMeta, js(api.CreateTopicRequest{Name: "orders", Queues: 1, IfMissing: true})},
		protocol.CodeAdminAddQueues:    {onMeta, js(api.AddQueuesRequest{Topic: "orders"})}, // INVALID (0 queues)
		protocol.CodeAdminSetGroupMode: {onMeta, js(api.SetGroupModeRequest{Group: "no-such-group"})},
		protocol.CodeAdminResync:       {onMeta, js(api.ResyncBrokerRequest{Broker: "no-such-broker"})},
		protocol.CodeAdminRaftStatus:   {onMeta, js(struct{}{})},
		protocol.CodeAdminAddVoter:     {onMeta, js(api.VoterRequest{})}, // INVALID
		protocol.CodeAdminRemoveVoter:  {onMeta, js(api.VoterRequest{})}, // INVALID
		protocol.CodeAdminApply:        {onMeta, js(struct{}{})},         // served by no one: UNKNOWN_CODE
		protocol.CodeConsumerHeartbeat: {onMeta, js(api.ConsumerHeartbeat{Group: "billing", Member: "m", Topics: []string{"orders"}, Leave: true})},
		protocol.CodeCommitOffsets:     {onMeta, js(api.CommitRequest{Group: "billing", Member: "m", Offsets: []api.QueueOffset{{Topic: "orders"}}})},
		protocol.CodeConsumerGroups:    {onMeta, js(api.ConsumerGroupsRequest{Group: "billing"})},
		protocol.CodeResetOffsets:      {onMeta, js(api.ResetOffsetsRequest{Group: "no-such-group"})},
		protocol.CodeDeleteGroup:       {onMeta, js(api.DeleteGroupRequest{Group: "no-such-group"})},
		protocol.CodeSetGroupFilter:    {onMeta, js(api.SetGroupFilterRequest{Group: "billing", Filter: "A ||"})}, // INVALID
		protocol.CodeAdminACLSet:       {onMeta, js(api.ACLSetRequest{})},                                         // INVALID (no name)
		protocol.CodeAdminACLRemove:    {onMeta, js(api.ACLRemoveRequest{Name: "absent"})},
		protocol.CodeAdminACLList:      {onMeta, js(struct{}{})},
		protocol.CodeACLGet:            {onMeta, js(struct{}{})},
		protocol.CodeAdminAdmitGroup:   {onMeta, js(api.AdmitGroupRequest{Group: "g1"})},
		protocol.CodeAdminRetireGroup:  {onMeta, js(api.RetireGroupRequest{Group: "g1", DryRun: true})},
		protocol.CodeAlterSyncSet:      {onMeta, js(api.AlterSyncSetRequest{Group: "no-such-group"})},
		protocol.CodeTxnDecide: {onMeta, js(api.TxnDecideRequest{Producer: 1, Epoch: 1, Number: 1, By: protocol.TxnByTimeout,
			Groups: []string{"g1"}})},
		protocol.CodeTxnDone:          {onMeta, js(api.TxnDoneRequest{Producer: 1, Epoch: 1, Number: 1, Groups: []string{"g1"}})},
		protocol.CodeTxnDecisions:     {onMeta, js(api.TxnDecisionsRequest{})},
		protocol.CodeAuditList:        {onMeta, js(api.AuditListRequest{})},
		protocol.CodeAdminGroupPolicy: {onMeta, js(api.GroupPolicyRequest{Group: "no-such-group"})},
		protocol.CodeAdminRemoveSlave: {onMeta, js(api.RemoveSlaveRequest{Group: "no-such-group", Broker: "nobody"})},
	}
}

func namedCodes() []protocol.Code {
	var out []protocol.Code
	for c := range 1 << 16 {
		if code := protocol.Code(c); !strings.HasPrefix(code.String(), "CODE(") {
			out = append(out, code)
		}
	}
	return out
}

// call sends one request; a oneway-like code the server may leave
// unanswered when it allows it (HA_ACK) gets a short deadline.
func call(p ports, code protocol.Code, r request, token string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if code == protocol.CodeHAAck {
		ctx, cancel = context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
	}
	body := r.body
	if code == protocol.CodeAuth {
		body = []byte(token)
	}
	_, err := r.port(p).Call(ctx, code, body)
	return err
}

// refusedFor reports whether err is a permission refusal of principal.
func refusedFor(err error, principal string) bool {
	var pe *protocol.Error
	return errors.As(err, &pe) && pe.Status == protocol.StatusNotAuthorized &&
		strings.Contains(pe.Message, fmt.Sprintf("principal %q lacks ", principal))
}

// TestEveryCodeThroughTheServers: each permission allows exactly what it
// names, through the real servers with authorization on: for every request
// code and every kind of principal, the code is served (whatever the
// handler then answers) or refused NOT_AUTHORIZED naming the principal, the
// permission it lacks and the request.
func TestEveryCodeThroughTheServers(t *testing.T) {
	ac := startAuthCluster(t)
	ctx := context.Background()
	if _, err := ac.admin.CreateTopic(ctx, api.CreateTopicRequest{Name: "orders", Queues: 1, Groups: []string{"g1"}}); err != nil {
		t.Fatal(err)
	}
	tokens := map[string]string{
		"admin":   ac.adminTok,
		"cluster": ac.clusterTok,
		"desc":    ac.addPrincipal(t, "desc", "describe"),
		"prod":    ac.addPrincipal(t, "prod", "produce:orders"),
		"cons":    ac.addPrincipal(t, "cons", "consume:orders:billing"),
		"other":   ac.addPrincipal(t, "other", "produce:payments", "consume:payments:*"),
		"none":    ac.addPrincipal(t, "none"),
	}
	all := []string{"admin", "cluster", "desc", "prod", "cons", "other", "none"}
	allowed := map[protocol.Code][]string{
		protocol.CodeIdentify:          all,
		protocol.CodeAuth:              all,
		protocol.CodeSend:              {"admin", "prod"},
		protocol.CodePull:              {"admin", "cons"},
		protocol.CodeDelayedCancel:     {"admin", "prod", "other"},
		protocol.CodeDelayedState:      {"admin", "desc", "prod", "other"},
		protocol.CodeDelayedList:       {"admin", "desc"},
		protocol.CodeQueueCount:        {"admin", "cluster", "desc", "cons"}, // cluster: the console's charts
		protocol.CodeLookup:            {"admin", "cons", "other"},
		protocol.CodeTxnEnd:            {"admin", "prod", "other"},
		protocol.CodeTxnList:           {"admin", "desc", "prod", "other"},
		protocol.CodeHAFetch:           {"admin", "cluster"},
		protocol.CodeHAAck:             {"admin", "cluster"},
		protocol.CodeRecover:           {"admin", "cluster"},
		protocol.CodeHeartbeat:         {"admin", "cluster"},
		protocol.CodeRouteLookup:       {"admin", "prod", "cons"},
		protocol.CodeRouteGet:          {"admin", "cluster", "desc", "prod", "cons"},
		protocol.CodeInitProducer:      {"admin", "prod", "other"},
		protocol.CodeRouteWatch:        {"admin", "cluster"},
		protocol.CodeAdminGroups:       {"admin", "cluster", "desc"},
		protocol.CodeAdminTopics:       {"admin", "desc"},
		protocol.CodeAdminRaftStatus:   {"admin", "desc"},
		protocol.CodeAdminCreateTopic:  {"admin", "cluster"},
		protocol.CodeAdminAddQueues:    {"admin"},
		protocol.CodeAdminSetGroupMode: {"admin"},
		protocol.CodeAdminResync:       {"admin"},
		protocol.CodeAdminAddVoter:     {"admin"},
		protocol.CodeAdminRemoveVoter:  {"admin"},
		protocol.CodeAdminApply:        all, // no handler: UNKNOWN_CODE, checked below
		protocol.CodeConsumerHeartbeat: {"admin", "cons"},
		protocol.CodeCommitOffsets:     {"admin", "cons"},
		protocol.CodeConsumerGroups:    {"admin", "cluster", "desc", "cons", "other"}, // other: consume:payments:* names every group
		protocol.CodeResetOffsets:      {"admin"},
		protocol.CodeDeleteGroup:       {"admin"},
		protocol.CodeSetGroupFilter:    {"admin"},
		protocol.CodeAdminACLSet:       {"admin"},
		protocol.CodeAdminACLRemove:    {"admin"},
		protocol.CodeAdminACLList:      {"admin"},
		protocol.CodeACLGet:            {"admin", "cluster"},
		protocol.CodeAdminAdmitGroup:   {"admin"},
		protocol.CodeAdminRetireGroup:  {"admin"},
		protocol.CodeAlterSyncSet:      {"admin", "cluster"},
		protocol.CodeTxnDecide:         {"admin", "cluster", "prod", "other"},
		protocol.CodeTxnDone:           {"admin", "cluster", "prod", "other"},
		protocol.CodeTxnDecisions:      {"admin", "desc"},
		protocol.CodeAuditList:         {"admin", "desc"},
		protocol.CodeAdminGroupPolicy:  {"admin"},
		protocol.CodeAdminRemoveSlave:  {"admin"},
	}
	reqs := requests()
	peers := map[string]ports{}
	for _, name := range all {
		peers[name] = ac.dial(t, tokens[name])
	}
	// The brokers learn the principals within a heartbeat.
	testwait.For(t, 10*time.Second, "the broker to know prod", func() bool {
		return call(peers["prod"], protocol.CodeSend, reqs[protocol.CodeSend], "") == nil
	})
	for _, code := range namedCodes() {
		r, ok := reqs[code]
		who, ok2 := allowed[code]
		if !ok || !ok2 {
			t.Errorf("request code %v has no case in this test", code)
			continue
		}
		for _, name := range all {
			err := call(peers[name], code, r, tokens[name])
			want := slices.Contains(who, name)
			switch {
			case want && refusedFor(err, name):
				t.Errorf("%v by %s: refused: %v", code, name, err)
			case !want && !refusedFor(err, name):
				t.Errorf("%v by %s: %v, want NOT_AUTHORIZED naming %q", code, name, err, name)
			case !want && !strings.Contains(err.Error(), code.String()):
				t.Errorf("%v by %s: the refusal %q does not name the request", code, name, err)
			case code == protocol.CodeAdminApply && !errors.Is(err, protocol.ErrUnknownCode):
				t.Errorf("ADMIN_APPLY by %s: %v, want UNKNOWN_CODE (no server serves it)", name, err)
			}
		}
	}
}

// A SEND batch with one topic its principal may not produce to is refused
// whole: nothing of it is stored, and the producer SDK fails the message at
// once (NOT_AUTHORIZED is not retried), saying which permission is missing.
func TestSendBatchIsAllOrNothing(t *testing.T) {
	ac := startAuthCluster(t)
	ctx := context.Background()
	for _, topic := range []string{"orders", "payments"} {
		if _, err := ac.admin.CreateTopic(ctx, api.CreateTopicRequest{Name: topic, Queues: 1, Groups: []string{"g1"}}); err != nil {
			t.Fatal(err)
		}
	}
	tok := ac.addPrincipal(t, "app1", "produce:orders")
	p := ac.dial(t, tok)
	send := func(topics ...string) error {
		var msgs []protocol.Message
		for _, topic := range topics {
			msgs = append(msgs, tc.Msg(topic, 0, protocol.Normal, "x"))
		}
		_, err := p.data.Call(ctx, protocol.CodeSend, protocol.AppendSendRequest(nil, 0, msgs))
		return err
	}
	testwait.For(t, 10*time.Second, "the broker to know app1", func() bool { return send("orders") == nil })
	master := ac.Master("g1")
	end := master.Store().EndOffset()
	err := send("orders", "orders", "payments", "orders")
	if !refusedFor(err, "app1") || !strings.Contains(err.Error(), "lacks produce:payments (SEND to topics \"orders\", \"payments\", \"orders\")") {
		t.Fatalf("a batch with a refused topic: %v", err)
	}
	if got := master.Store().EndOffset(); got != end {
		t.Fatalf("the refused batch moved the log end from %d to %d", end, got)
	}

	prod, err := producer.New(sdk.MetaAddrs(ac.MetaAddr()), sdk.Token(tok))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	if _, err := prod.Send(ctx, &producer.Message{Topic: "orders", Body: []byte("ok")}); err != nil {
		t.Fatalf("a permitted send through the SDK: %v", err)
	}
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	_, err = prod.Send(sctx, &producer.Message{Topic: "payments", Body: []byte("no")})
	if !errors.Is(err, protocol.ErrNotAuthorized) || !strings.Contains(err.Error(), `principal "app1" lacks produce:payments`) {
		t.Fatalf("a refused send through the SDK: %v", err)
	}
	if sctx.Err() != nil {
		t.Fatal("the refused send was retried until its deadline")
	}
}

// A peer that presents nothing gets nothing but NOT_AUTHORIZED
// "authenticate first" on the data, HA and metaserver ports (IDENTIFY
// aside); with an empty table only the bootstrap admin (and the servers'
// cluster token) get in; a token nobody has is refused by name.
func TestStrangersGetNothing(t *testing.T) {
	ac := startAuthCluster(t)
	stranger := ac.dial(t, "")
	for _, port := range []func(ports) *transport.Client{onMeta, onData, onHA} {
		for code, r := range requests() {
			if code == protocol.CodeIdentify || code == protocol.CodeAuth {
				continue
			}
			r.port = port
			err := call(stranger, code, r, "")
			if !errors.Is(err, protocol.ErrNotAuthorized) || !strings.Contains(err.Error(), "authenticate first") {
				t.Errorf("%v to %s without a token: %v", code, port(stranger).Addr(), err)
			}
		}
	}
	if n := len(ac.Meta.Nodes[0].FSM().Principals()); n != 0 {
		t.Fatalf("the registry holds %d principals", n)
	}
	ctx := context.Background()
	if _, err := ac.admin.Topics(ctx); err != nil {
		t.Fatalf("the bootstrap admin with an empty table: %v", err)
	}
	for _, port := range []func(ports) *transport.Client{onMeta, onData, onHA} {
		c := port(ac.dial(t, auth.NewToken()))
		_, err := c.Call(ctx, protocol.CodeIdentify, nil)
		if want := "transport: AUTH to " + c.Addr() + ": ferrymq: NOT_AUTHORIZED: token not recognised"; err == nil || err.Error() != want {
			t.Errorf("a token nobody has at %s: %v\nwant %s", c.Addr(), err, want)
		}
	}
}

// A principal removed is refused on its next request at the metaserver,
// and at the broker within about a heartbeat (the broker's copy follows
// the registry's ACL version); its connections are closed meanwhile, so a
// call may first fail with the connection lost, and then its AUTH on a
// new connection with "token not recognised".
func TestRevocation(t *testing.T) {
	ac := startAuthCluster(t)
	ctx := context.Background()
	if _, err := ac.admin.CreateTopic(ctx, api.CreateTopicRequest{Name: "orders", Queues: 1, Groups: []string{"g1"}}); err != nil {
		t.Fatal(err)
	}
	tok := ac.addPrincipal(t, "app1", "produce:orders")
	p := ac.dial(t, tok)
	reqs := requests()
	testwait.For(t, 10*time.Second, "the broker to know app1", func() bool {
		return call(p, protocol.CodeSend, reqs[protocol.CodeSend], "") == nil
	})
	if err := call(p, protocol.CodeRouteLookup, reqs[protocol.CodeRouteLookup], ""); err != nil {
		t.Fatal(err)
	}
	if _, err := ac.admin.RemovePrincipal(ctx, api.ACLRemoveRequest{Name: "app1"}); err != nil {
		t.Fatal(err)
	}
	// The metaserver refuses at once (it closed the connection, too).
	err := call(p, protocol.CodeRouteLookup, reqs[protocol.CodeRouteLookup], "")
	if errors.Is(err, transport.ErrConnLost) {
		err = call(p, protocol.CodeRouteLookup, reqs[protocol.CodeRouteLookup], "")
	}
	if !errors.Is(err, protocol.ErrNotAuthorized) || !strings.Contains(err.Error(), "token not recognised") {
		t.Fatalf("a route lookup after the removal: %v", err)
	}
	testwait.For(t, 10*time.Second, "the broker to refuse the removed principal", func() bool {
		err := call(p, protocol.CodeSend, reqs[protocol.CodeSend], "")
		return errors.Is(err, protocol.ErrNotAuthorized) && strings.Contains(err.Error(), "token not recognised")
	})
}

// TestNewPrincipalAtOnce: a principal made a moment ago is taken by a
// broker at its first AUTH, without waiting for the heartbeat that would
// tell the broker of the new ACL version (here an hour away): an unknown
// token makes the broker fetch the table once before it refuses.
func TestNewPrincipalAtOnce(t *testing.T) {
	adminTok, clusterTok := auth.NewToken(), auth.NewToken()
	c := tc.Start(t, tc.Opts{Groups: []string{"g1"},
		MetaEdit: func(c *metaserver.Config) {
			c.ClusterToken = clusterTok
			c.Auth.Admin = auth.HashToken(adminTok)
		},
		BrokerEdit: func(c *broker.Config) {
			c.ClusterToken = clusterTok
			c.HeartbeatInterval, c.SessionTimeout = time.Hour, 3*time.Hour
		},
	})
	admin, err := client.New(client.Config{Addrs: c.Meta.Addrs(), Token: adminTok})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	identify := func(token string) error {
		tcl := transport.NewClient(c.Master("g1").Addr(), transport.ClientConfig{Login: auth.TokenLogin(token), CallTimeout: 5 * time.Second})
		defer tcl.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := tcl.Call(ctx, protocol.CodeIdentify, nil)
		return err
	}
	testwait.For(t, 10*time.Second, "the broker to load its first table", func() bool { return identify(adminTok) == nil })

	tok := auth.NewToken()
	if _, err := admin.SetPrincipal(context.Background(), api.ACLSetRequest{Name: "app1",
		TokenSHA256: auth.HashToken(tok).String(), Permissions: []string{"produce:orders"}}); err != nil {
		t.Fatal(err)
	}
	if err := identify(tok); err != nil {
		t.Fatalf("AUTH of a principal made before it: %v", err)
	}
	// A token the registry does not know either is still refused.
	if err := identify(auth.NewToken()); !errors.Is(err, protocol.ErrNotAuthorized) || !strings.Contains(err.Error(), "token not recognised") {
		t.Fatalf("AUTH of an unknown token: %v, want NOT_AUTHORIZED token not recognised", err)
	}
}
