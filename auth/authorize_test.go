package auth

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/ferrymq/ferrymq/protocol"
)

// principals are the test's principals by name, one per permission kind and
// pattern shape, and a few mixes.
var principals = map[string][]string{
	"admin":       {"admin"},
	"cluster":     {"cluster"},
	"describe":    {"describe"},
	"prodExact":   {"produce:orders"},
	"prodPrefix":  {"produce:orders.*"},
	"prodAll":     {"produce:*"},
	"consBilling": {"consume:orders:billing"},
	"consPrefix":  {"consume:orders.*:bill*"},
	"consAll":     {"consume:*:*"},
	"consBoth":    {"consume:orders:billing", "consume:orders.*:bill*"},
	"mixed":       {"produce:orders", "consume:orders.*:bill*"}, // kinds never stand in for each other
	"none":        {},
}

func principal(t *testing.T, name string) Principal {
	t.Helper()
	perms, err := ParsePermissions(principals[name])
	if err != nil {
		t.Fatal(err)
	}
	return Principal{Name: name, Permissions: perms}
}

// allow is one request's target and the principals allowed it; every other
// principal of the test must be refused.
type allow struct {
	target Target
	who    []string
}

var (
	producers     = []string{"prodExact", "prodPrefix", "prodAll", "mixed"}
	consumers     = []string{"consBilling", "consPrefix", "consAll", "consBoth", "mixed"}
	everyone      = []string{"admin", "cluster", "describe", "prodExact", "prodPrefix", "prodAll", "consBilling", "consPrefix", "consAll", "consBoth", "mixed", "none"}
	clusterOnly   = []allow{{Target{}, []string{"admin", "cluster"}}, {Topic("orders"), []string{"admin", "cluster"}}}
	adminOnly     = []allow{{Target{}, []string{"admin"}}, {Target{Topics: []string{"orders"}, Group: "billing"}, []string{"admin"}}}
	describeOnly  = []allow{{Target{}, []string{"admin", "describe"}}}
	consumerGroup = []allow{
		{Target{Topics: []string{"orders"}, Group: "billing"}, []string{"admin", "consBilling", "consAll", "consBoth"}},
		{Target{Topics: []string{"orders.eu"}, Group: "billing"}, []string{"admin", "consPrefix", "consAll", "consBoth", "mixed"}},
		{Target{Topics: []string{"orders.eu"}, Group: "other"}, []string{"admin", "consAll"}},
		{Target{Topics: []string{"orders"}, Group: "other"}, []string{"admin", "consAll"}},
		// Every topic must be allowed with the group; by one permission
		// or several.
		{Target{Topics: []string{"orders", "orders.eu"}, Group: "billing"}, []string{"admin", "consAll", "consBoth"}},
		// A member leaving names no topics: a permission for the group.
		{Target{Group: "billing"}, append([]string{"admin"}, consumers...)},
		{Target{Topics: []string{"orders"}}, []string{"admin"}}, // no group: nothing matches
	}
)

// expect holds, by request code name, what each principal may do. Every
// request code protocol names must be here (TestEveryCodeHasARule).
var expect = map[string][]allow{
	"IDENTIFY": {{Target{}, everyone}},
	"AUTH":     {{Target{}, everyone}},
	"SEND": {
		{Topic("orders"), []string{"admin", "prodExact", "prodAll", "mixed"}},
		{Topic("orders.eu"), []string{"admin", "prodPrefix", "prodAll"}},
		{Topic("payments"), []string{"admin", "prodAll"}},
		{Target{Topics: []string{"orders.eu", "orders.eu", "orders.us"}}, []string{"admin", "prodPrefix", "prodAll"}},
		// All or nothing: one topic not allowed refuses the batch.
		{Target{Topics: []string{"orders", "orders.eu"}}, []string{"admin", "prodAll"}},
		{Target{}, append([]string{"admin"}, producers...)},
	},
	// Who may send to a topic cancels its delayed messages; they and
	// describe look one up; describe lists them.
	"DELAYED_CANCEL": {
		{Topic("orders"), []string{"admin", "prodExact", "prodAll", "mixed"}},
		{Topic("payments"), []string{"admin", "prodAll"}},
	},
	"DELAYED_STATE": {
		{Topic("orders"), []string{"admin", "describe", "prodExact", "prodAll", "mixed"}},
		{Topic("payments"), []string{"admin", "describe", "prodAll"}},
	},
	"DELAYED_LIST": describeOnly,
	"PULL": {
		{Topic("orders"), []string{"admin", "consBilling", "consAll", "consBoth"}},
		{Topic("orders.eu"), []string{"admin", "consPrefix", "consAll", "consBoth", "mixed"}},
		{Topic("payments"), []string{"admin", "consAll"}},
	},
	// Counting what a filter takes of a queue: describe, or a reader, or
	// the cluster (the console's charts).
	"QUEUE_COUNT": {
		{Topic("orders"), []string{"admin", "cluster", "describe", "consBilling", "consAll", "consBoth"}},
		{Topic("payments"), []string{"admin", "cluster", "describe", "consAll"}},
	},
	"LOOKUP": {
		{Topic("orders"), []string{"admin", "consBilling", "consAll", "consBoth"}},
		{Target{}, append([]string{"admin"}, consumers...)},
	},
	"TXN_END": {
		{Target{Topics: []string{"orders", "payments"}}, []string{"admin", "prodAll"}},
		{Topic("orders"), []string{"admin", "prodExact", "prodAll", "mixed"}},
	},
	"TXN_LIST": {
		{Target{}, []string{"admin", "describe", "prodExact", "prodPrefix", "prodAll", "mixed"}},
		{Topic("payments"), []string{"admin", "describe", "prodAll"}},
	},
	"HA_FETCH":  clusterOnly,
	"HA_ACK":    clusterOnly,
	"HEARTBEAT": clusterOnly,
	// A group's master changes its sync set.
	"ALTER_SYNC_SET": clusterOnly,
	// A transaction's decision names no topic: any producer, a broker
	// (cluster), or admin; consumers and describe may not decide.
	"TXN_DECIDE":    {{Target{}, []string{"admin", "cluster", "prodExact", "prodPrefix", "prodAll", "mixed"}}},
	"TXN_DONE":      {{Target{}, []string{"admin", "cluster", "prodExact", "prodPrefix", "prodAll", "mixed"}}},
	"TXN_DECISIONS": describeOnly,
	"ROUTE_LOOKUP": {
		{Topic("orders"), []string{"admin", "prodExact", "prodAll", "consBilling", "consAll", "consBoth", "mixed"}},
		{Topic("orders.eu"), []string{"admin", "prodPrefix", "prodAll", "consPrefix", "consAll", "consBoth", "mixed"}},
		{Topic("payments"), []string{"admin", "prodAll", "consAll"}},
	},
	"ROUTE_GET": {
		{Topic("orders"), []string{"admin", "cluster", "describe", "prodExact", "prodAll", "consBilling", "consAll", "consBoth", "mixed"}},
		{Topic("payments"), []string{"admin", "cluster", "describe", "prodAll", "consAll"}},
	},
	"INIT_PRODUCER":        {{Target{}, append([]string{"admin"}, producers...)}},
	"ADMIN_GROUPS":         {{Target{}, []string{"admin", "cluster", "describe"}}}, // the cluster: the console's charts
	"ADMIN_TOPICS":         describeOnly,
	"ADMIN_RAFT_STATUS":    describeOnly,
	"ADMIN_CREATE_TOPIC":   {{Topic("orders"), []string{"admin", "cluster"}}},
	"ADMIN_ADD_QUEUES":     adminOnly,
	"ADMIN_SET_GROUP_MODE": adminOnly,
	"ADMIN_ADD_VOTER":      adminOnly,
	"ADMIN_REMOVE_VOTER":   adminOnly,
	"ADMIN_APPLY":          clusterOnly,
	"CONSUMER_HEARTBEAT":   consumerGroup,
	"COMMIT_OFFSETS":       consumerGroup,
	"CONSUMER_GROUPS": {
		{Target{Group: "billing"}, []string{"admin", "cluster", "describe", "consBilling", "consPrefix", "consAll", "consBoth", "mixed"}},
		{Target{Group: "other"}, []string{"admin", "cluster", "describe", "consAll"}},
		{Target{}, []string{"admin", "cluster", "describe"}}, // every group; the cluster: the console's charts
	},
	"RESET_OFFSETS":    adminOnly,
	"ADMIN_ACL_SET":    adminOnly,
	"ADMIN_ACL_REMOVE": adminOnly,
	"ADMIN_ACL_LIST":   adminOnly,
	"ACL_GET":          clusterOnly,
	"ROUTE_WATCH":      clusterOnly,
	"RECOVER":          clusterOnly,
	"DELETE_GROUP":     adminOnly,
	"SET_GROUP_FILTER": adminOnly,
	"ADMIN_RESYNC":     adminOnly,

	"ADMIN_ADMIT_GROUP":  adminOnly,
	"ADMIN_RETIRE_GROUP": adminOnly,
	"ADMIN_GROUP_POLICY": adminOnly,
	"ADMIN_REMOVE_SLAVE": adminOnly,

	"AUDIT_LIST": describeOnly,
}

// namedCodes returns every request code protocol gives a name.
func namedCodes() []protocol.Code {
	var out []protocol.Code
	for c := range 1 << 16 {
		code := protocol.Code(c)
		if !strings.HasPrefix(code.String(), "CODE(") {
			out = append(out, code)
		}
	}
	return out
}

// TestEveryCodeHasARule: a request code added to protocol without a rule
// here (and an expectation in this test) fails, so that no request is
// forgotten by the checks.
func TestEveryCodeHasARule(t *testing.T) {
	codes := namedCodes()
	if len(codes) < 20 {
		t.Fatalf("found only %d named request codes", len(codes))
	}
	for _, c := range codes {
		if !HasRule(c) {
			t.Errorf("request code %v (%d) has no rule in auth.rules", c, c)
		}
		if _, ok := expect[c.String()]; !ok {
			t.Errorf("request code %v (%d) has no expectation in this test", c, c)
		}
	}
}

// TestAuthorizeEveryCode asserts, for every request code and every
// principal, exactly which requests are allowed; a refusal is
// NOT_AUTHORIZED naming the principal and the request.
func TestAuthorizeEveryCode(t *testing.T) {
	for _, code := range namedCodes() {
		for _, a := range expect[code.String()] {
			for _, name := range everyone {
				p := principal(t, name)
				err := Authorize(p, code, a.target)
				want := slices.Contains(a.who, name)
				switch {
				case want && err != nil:
					t.Errorf("%v %+v by %v %s: refused: %v", code, a.target, p.Permissions, name, err)
				case !want && err == nil:
					t.Errorf("%v %+v by %v %s: allowed", code, a.target, p.Permissions, name)
				case !want:
					var pe *protocol.Error
					if !errors.As(err, &pe) || pe.Status != protocol.StatusNotAuthorized {
						t.Errorf("%v by %s: refused with %v, not NOT_AUTHORIZED", code, name, err)
					} else if !strings.Contains(pe.Message, `principal "`+name+`" lacks `) || !strings.Contains(pe.Message, code.String()) {
						t.Errorf("%v by %s: refusal %q names neither the principal nor the request", code, name, pe.Message)
					}
				}
			}
		}
	}
}

func TestAuthorizeCodeWithoutRule(t *testing.T) {
	code := protocol.Code(999)
	if HasRule(code) {
		t.Fatal("code 999 has a rule")
	}
	if err := Authorize(principal(t, "admin"), code, Target{}); err != nil {
		t.Fatalf("admin refused a code without a rule: %v", err)
	}
	for _, name := range everyone[1:] {
		err := Authorize(principal(t, name), code, Target{})
		if !errors.Is(err, protocol.ErrNotAuthorized) || !strings.Contains(err.Error(), "lacks admin (CODE(999), which only admin may make)") {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestRefusalNamesThePermission: the messages a user reads.
func TestRefusalNamesThePermission(t *testing.T) {
	app := Principal{Name: "app1", Permissions: []Permission{Produce("orders.*"), Consume("orders.*", "billing")}}
	cases := []struct {
		code   protocol.Code
		target Target
		want   string
	}{
		{protocol.CodeSend, Topic("payments"), `principal "app1" lacks produce:payments (SEND to topic "payments")`},
		{protocol.CodeSend, Target{Topics: []string{"orders.eu", "payments", "x"}},
			`principal "app1" lacks produce:payments (SEND to topics "orders.eu", "payments", "x")`},
		{protocol.CodePull, Topic("payments"), `principal "app1" lacks consume:payments:<group> (PULL of topic "payments")`},
		{protocol.CodeCommitOffsets, Target{Topics: []string{"orders.eu"}, Group: "audit"},
			`principal "app1" lacks consume:orders.eu:audit (COMMIT_OFFSETS of group "audit" on topic "orders.eu")`},
		{protocol.CodeRouteLookup, Topic("payments"),
			`principal "app1" lacks produce:payments or consume:payments:<group> (ROUTE_LOOKUP of topic "payments")`},
		{protocol.CodeHeartbeat, Target{}, `principal "app1" lacks cluster (HEARTBEAT)`},
		{protocol.CodeAdminCreateTopic, Topic("orders.new"), `principal "app1" lacks admin (ADMIN_CREATE_TOPIC of topic "orders.new")`},
		{protocol.CodeAdminRemoveVoter, Target{}, `principal "app1" lacks admin (ADMIN_REMOVE_VOTER)`},
		{protocol.CodeAdminTopics, Target{}, `principal "app1" lacks describe (ADMIN_TOPICS)`},
		{protocol.CodeConsumerGroups, Target{Group: "audit"}, `principal "app1" lacks consume:<topic>:audit or describe (CONSUMER_GROUPS of group "audit")`},
	}
	for _, c := range cases {
		err := Authorize(app, c.code, c.target)
		var pe *protocol.Error
		if !errors.As(err, &pe) || pe.Status != protocol.StatusNotAuthorized || pe.Message != c.want {
			t.Errorf("%v %+v:\n got %v\nwant %s", c.code, c.target, err, c.want)
		}
	}
}

// TestAuthorizeAllocatesNothing: the check runs per request; an allowed
// one costs no allocation.
func TestAuthorizeAllocatesNothing(t *testing.T) {
	p := principal(t, "consBoth")
	target := Target{Topics: []string{"orders", "orders.eu", "orders.eu"}, Group: "billing"}
	allocs := testing.AllocsPerRun(100, func() {
		if err := Authorize(p, protocol.CodeCommitOffsets, target); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per allowed check", allocs)
	}
}
