package auth

import (
	"fmt"
	"strings"

	"github.com/ferrymq/ferrymq/protocol"
)

// Target is what a request names, as far as permissions go.
type Target struct {
	// Topics are the topics the request names; every one must be allowed.
	// SEND: the batch's topics (a batch is refused whole if one is not
	// allowed); PULL, ROUTE_LOOKUP, ROUTE_GET: the one topic; CONSUMER_HEARTBEAT:
	// the member's topics; COMMIT_OFFSETS: the offsets' topics. A topic
	// repeated next to itself is checked once, so a batch's topics may be
	// passed message by message.
	Topics []string
	// Group is the consumer group of CONSUMER_HEARTBEAT, COMMIT_OFFSETS and
	// CONSUMER_GROUPS ("" for CONSUMER_GROUPS: every group).
	Group string
}

// Topic is the Target of a request that names one topic.
func Topic(topic string) Target { return Target{Topics: []string{topic}} }

// need is one way a principal may be allowed a request: Authorize allows it
// if any of the rule's needs holds.
type need uint8

const (
	// needCluster: the cluster permission.
	needCluster need = 1 << iota
	// needDescribe: the describe permission.
	needDescribe
	// needProduce: a produce permission matching every topic (with no
	// topics: any produce permission).
	needProduce
	// needConsumeTopics: for every topic, a consume permission matching it,
	// whatever its group pattern (with no topics: any consume permission).
	needConsumeTopics
	// needConsumeGroup: for every topic, a consume permission matching it
	// and the group (with no topics: one matching the group).
	needConsumeGroup
	// needConsumeGroupNamed: a consume permission matching the group, which
	// must be named (any topic).
	needConsumeGroupNamed
	// needAny: any authenticated principal.
	needAny
	// sayAdmin is no need: a refusal names admin rather than the rule's
	// other ways (the cluster may make the request, but a person lacks
	// admin).
	sayAdmin
)

// rules holds every request code's rule. admin is allowed every code (a
// code without a rule too); every other principal is refused a code with
// no rule. auth's tests fail on a request code without a rule.
var rules = map[protocol.Code]need{
	// A peer asking what a server is; it changes nothing.
	protocol.CodeIdentify: needAny,
	// AUTH is how a peer becomes a principal: it is served before one
	// exists (transport lets it through), and a principal may present
	// another token on the same connection.
	protocol.CodeAuth: needAny,

	protocol.CodeSend: needProduce,
	// A delayed message is cancelled by who may send to its topic, and
	// looked up by them or by describe; the pending messages of a group
	// are listed by describe.
	protocol.CodeDelayedCancel: needProduce,
	protocol.CodeDelayedState:  needProduce | needDescribe,
	protocol.CodeDelayedList:   needDescribe,
	// PULL names no group: a consumer of any group may read the topic.
	protocol.CodePull: needConsumeTopics,
	// Counting what a filter takes of a queue (a group's lag) shows no
	// message: describe, or who may read the topic.
	// The cluster principal may read queue ranges, broker groups and
	// consumer groups too (metadata, no message): the console's charts
	// sample them with the cluster token. Refusals name describe only.
	protocol.CodeQueueCount: needDescribe | needConsumeTopics | needCluster | sayAdmin,
	// A lookup finds messages of any topic: a reader of some topic may
	// ask, and sees the messages of the topics it may consume.
	protocol.CodeLookup: needConsumeTopics,
	// A transaction is decided by who may send to every topic it wrote
	// (its producer, or that producer's checker); admin decides any. Open
	// transactions are listed by describe, or by a producer, which sees
	// those that wrote only topics it may send to.
	protocol.CodeTxnEnd:  needProduce,
	protocol.CodeTxnList: needDescribe | needProduce,

	protocol.CodeHAFetch: needCluster,
	protocol.CodeHAAck:   needCluster,
	// A former master hands its cut tail to the new master.
	protocol.CodeRecover: needCluster,

	protocol.CodeHeartbeat: needCluster,
	// ALTER_SYNC_SET: a group's master changes the sync set it waits for.
	protocol.CodeAlterSyncSet: needCluster,
	// The registry's transaction decisions: a producer decides its
	// transactions, a broker aborts one at its timeout (admin decides
	// any); a report that groups applied a decision comes from either.
	// A decision carrying a consumer group's offsets also needs
	// COMMIT_OFFSETS's rule for them, which the metaserver checks.
	// Decisions are listed by describe.
	protocol.CodeTxnDecide:    needProduce | needCluster,
	protocol.CodeTxnDone:      needProduce | needCluster,
	protocol.CodeTxnDecisions: needDescribe,
	// ROUTE_LOOKUP creates the topic when the metaserver auto-creates:
	// produce and consume, not describe.
	protocol.CodeRouteLookup: needProduce | needConsumeTopics,
	// ROUTE_GET never creates: brokers' route cache and a follower asking
	// the leader use it.
	protocol.CodeRouteGet:     needCluster | needDescribe | needProduce | needConsumeTopics,
	protocol.CodeInitProducer: needProduce,
	// ROUTE_WATCH: a broker learns its group's new topics (route push).
	protocol.CodeRouteWatch: needCluster,

	protocol.CodeAdminGroups:     needDescribe | needCluster | sayAdmin,
	protocol.CodeAdminTopics:     needDescribe,
	protocol.CodeAdminRaftStatus: needDescribe,
	// A follower that auto-creates a topic on a route lookup forwards the
	// creation to the leader as ADMIN_CREATE_TOPIC with the cluster's
	// credential.
	protocol.CodeAdminCreateTopic:  needCluster | sayAdmin,
	protocol.CodeAdminAddQueues:    0,
	protocol.CodeAdminSetGroupMode: 0,
	protocol.CodeAdminAddVoter:     0,
	protocol.CodeAdminRemoveVoter:  0,
	protocol.CodeAdminApply:        needCluster,
	// Setting a broker's log aside is an operator's act.
	protocol.CodeAdminResync: 0,

	protocol.CodeConsumerHeartbeat: needConsumeGroup,
	protocol.CodeCommitOffsets:     needConsumeGroup,
	protocol.CodeConsumerGroups:    needDescribe | needConsumeGroupNamed | needCluster | sayAdmin,
	// Moving a group's offsets, deleting it, or changing what it
	// receives is an operator's act.
	protocol.CodeResetOffsets:   0,
	protocol.CodeDeleteGroup:    0,
	protocol.CodeSetGroupFilter: 0,

	// The ACL: only admin changes or lists it; the brokers read it (names
	// and permissions, and whose the tokens presented to them are) for
	// their copy of the table.
	protocol.CodeAdminACLSet:    0,
	protocol.CodeAdminACLRemove: 0,
	protocol.CodeAdminACLList:   0,
	protocol.CodeACLGet:         needCluster,

	// Which broker groups may hold queues, and moving a dead group's
	// queues: an operator's acts.
	protocol.CodeAdminAdmitGroup:  0,
	protocol.CodeAdminRetireGroup: 0,
	// How many copies a group's HIGH messages need, and removing a slave
	// from its group: an operator's acts.
	protocol.CodeAdminGroupPolicy: 0,
	protocol.CodeAdminRemoveSlave: 0,

	// The registry's audit trail (who changed what): describe reads it.
	protocol.CodeAuditList: needDescribe,
}

// HasRule reports whether code has a rule (a code without one is allowed
// to admin only).
func HasRule(code protocol.Code) bool {
	_, ok := rules[code]
	return ok
}

// Authorize returns nil if p may make a request of code naming target,
// else a *protocol.Error of status NOT_AUTHORIZED whose message names the
// principal, the permission it lacks and the request, e.g.
//
//	principal "app1" lacks produce:payments (SEND to topic "payments")
//
// It reads nothing but its arguments: no lock, no allocation when allowed.
func Authorize(p Principal, code protocol.Code, target Target) error {
	if p.IsAdmin() {
		return nil
	}
	rule, ok := rules[code]
	if !ok {
		return refuse(p, "admin", fmt.Sprintf("%v, which only admin may make", code))
	}
	if rule&needAny != 0 ||
		rule&needCluster != 0 && p.Has(Cluster) ||
		rule&needDescribe != 0 && p.Has(Describe) {
		return nil
	}
	// The first topic no way allows is the one the error names.
	missing := ""
	if rule&(needProduce|needConsumeTopics|needConsumeGroup) != 0 {
		if rule&needConsumeGroup != 0 && target.Group == "" {
			missing = "\x00" // a group request without a group: nothing matches
		} else {
			missing = firstDenied(p, rule, target)
		}
		if missing == "" {
			return nil
		}
	}
	if rule&needConsumeGroupNamed != 0 && target.Group != "" && p.any(func(q Permission) bool {
		return q.Kind == KindConsume && q.Group.Match(target.Group)
	}) {
		return nil
	}
	return refuse(p, lacking(rule, missing, target), describeRequest(code, target))
}

// firstDenied returns the first of target's topics that none of rule's
// topic needs allows p, "" if every one is allowed. With no topics the
// needs ask for any permission of their kind; "\x00" stands for the
// missing topic then.
func firstDenied(p Principal, rule need, target Target) string {
	if len(target.Topics) == 0 {
		if p.any(func(q Permission) bool { return allows(rule, q, "", target.Group, false) }) {
			return ""
		}
		return "\x00"
	}
	for i, t := range target.Topics {
		if i > 0 && t == target.Topics[i-1] {
			continue
		}
		if !p.any(func(q Permission) bool { return allows(rule, q, t, target.Group, true) }) {
			return t
		}
	}
	return ""
}

// allows reports whether q allows one topic (any topic when !hasTopic) of
// a request whose rule is rule.
func allows(rule need, q Permission, topic, group string, hasTopic bool) bool {
	topicOK := !hasTopic || q.Topic.Match(topic)
	switch q.Kind {
	case KindProduce:
		return rule&needProduce != 0 && topicOK
	case KindConsume:
		return (rule&needConsumeTopics != 0 || rule&needConsumeGroup != 0 && q.Group.Match(group)) && topicOK
	}
	return false
}

func (p Principal) any(f func(Permission) bool) bool {
	for _, q := range p.Permissions {
		if f(q) {
			return true
		}
	}
	return false
}

// lacking names what p would need: the rule's ways, for the missing topic
// ("\x00": any topic).
func lacking(rule need, missing string, target Target) string {
	topic := missing
	if missing == "\x00" || missing == "" {
		topic = "<topic>"
	}
	group := target.Group
	if group == "" {
		group = "<group>"
	}
	var ways []string
	if rule&needProduce != 0 {
		ways = append(ways, "produce:"+topic)
	}
	if rule&needConsumeTopics != 0 {
		ways = append(ways, "consume:"+topic+":<group>")
	}
	if rule&needConsumeGroup != 0 {
		ways = append(ways, "consume:"+topic+":"+group)
	}
	if rule&needConsumeGroupNamed != 0 && target.Group != "" {
		ways = append(ways, "consume:<topic>:"+group)
	}
	if rule&needDescribe != 0 {
		ways = append(ways, "describe")
	}
	if rule&needCluster != 0 && rule&sayAdmin == 0 {
		ways = append(ways, "cluster")
	}
	if len(ways) == 0 {
		ways = append(ways, "admin")
	}
	return strings.Join(ways, " or ")
}

// describeRequest says what the request was: its code and what it names.
func describeRequest(code protocol.Code, target Target) string {
	var b strings.Builder
	b.WriteString(code.String())
	verb := " of"
	if code == protocol.CodeSend {
		verb = " to"
	}
	if target.Group != "" {
		fmt.Fprintf(&b, "%s group %q", verb, target.Group)
		verb = " on"
	}
	switch n := len(target.Topics); {
	case n == 1:
		fmt.Fprintf(&b, "%s topic %q", verb, target.Topics[0])
	case n > 1:
		fmt.Fprintf(&b, "%s topics %s", verb, quoteList(target.Topics, 5))
	}
	return b.String()
}

// quoteList quotes the first max names, distinct next to each other.
func quoteList(names []string, max int) string {
	var out []string
	for i, n := range names {
		if i > 0 && n == names[i-1] {
			continue
		}
		if len(out) == max {
			out = append(out, "...")
			break
		}
		out = append(out, fmt.Sprintf("%q", n))
	}
	return strings.Join(out, ", ")
}

func refuse(p Principal, lacks, request string) error {
	return &protocol.Error{Status: protocol.StatusNotAuthorized,
		Message: fmt.Sprintf("principal %q lacks %s (%s)", p.Name, lacks, request)}
}
