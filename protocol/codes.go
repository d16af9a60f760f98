package protocol

import "fmt"

// Code is a request code: what a request asks for. A response echoes it.
type Code uint16

// Request codes. Ranges: 0x any server, 1x broker data path, 2x replication, 3x metaserver
// broker-facing, 4x metaserver admin, 5x consumer groups (metaserver), 6x the access control list
// (metaserver), 7x broker group admission (metaserver admin).
const (
	// CodeIdentify asks a server what it is (an empty body -> Identity).
	// A broker answers it; a metaserver today answers UNKNOWN_CODE. The
	// metaserver client asks it of a server that answered one of its
	// requests UNKNOWN_CODE, to say whom it reached.
	CodeIdentify Code = 1
	// CodeAuth presents a credential: the body is a token (the answer is
	// an AuthReply: the principal it names and its permissions). On a
	// server with authorization on, a connection is served nothing but
	// AUTH and IDENTIFY until it authenticated (by AUTH or by its TLS
	// client certificate); a token that is not recognised is answered
	// NOT_AUTHORIZED and leaves the connection unauthenticated.
	CodeAuth Code = 2

	CodeSend Code = 10 // SEND a batch of messages (SendRequest -> SendResponse)
	CodePull Code = 11 // PULL stored messages of one queue (PullRequest -> PullResponse)
	// The delayed messages of a broker group (JSON bodies, delay.go).
	CodeDelayedCancel Code = 12 // cancel a pending delayed message (DelayedRef -> DelayedState)
	CodeDelayedState  Code = 13 // where a delayed message is: pending, released, cancelled (DelayedRef -> DelayedState)
	CodeDelayedList   Code = 14 // the pending delayed messages by due time (DelayedListRequest -> DelayedList)
	CodeQueueCount    Code = 15 // how many messages of a queue's range a filter can take, by the index (JSON: QueueCountRequest -> QueueCount)
	CodeLookup        Code = 16 // messages of a group by handle, id or key (JSON: LookupRequest -> LookupReply)
	CodeTxnEnd        Code = 17 // commit or abort a transaction on its group's master (JSON: TxnEndRequest -> TxnEndReply)
	CodeTxnList       Code = 18 // a group's open transactions (JSON: TxnListRequest -> TxnList)

	CodeHAFetch Code = 20 // a slave fetches raw log bytes from its master
	CodeHAAck   Code = 21 // oneway: a slave tells its master how far it has appended
	CodeRecover Code = 22 // a broker hands its master the records a failover cut from its log (RecoverRequest)

	CodeHeartbeat    Code = 30 // a broker's heartbeat to the metaserver leader
	CodeRouteLookup  Code = 31 // a route lookup, served by any metaserver node
	CodeRouteGet     Code = 32 // a route lookup that never auto-creates (brokers use it)
	CodeInitProducer Code = 33 // a producer asks the metaserver leader for its id and epoch
	CodeRouteWatch   Code = 34 // a broker's long poll for the topics routed to its group (leader)
	CodeAlterSyncSet Code = 35 // a master changes its group's sync set (leader; JSON, metaserver/api)
	// The registry's transaction decisions (leader; JSON, metaserver/api):
	// a transaction on several broker groups, or carrying a consumer
	// group's offsets, is decided by one Raft write, the first decision
	// winning.
	CodeTxnDecide    Code = 36 // decide a transaction: commit or abort (TxnDecideRequest -> TxnDecision)
	CodeTxnDone      Code = 37 // broker groups applied a decision (TxnDoneRequest)
	CodeTxnDecisions Code = 38 // the decisions the registry holds, for ferryctl (TxnDecisionsRequest -> TxnDecisions)

	CodeAdminGroups       Code = 40
	CodeAdminTopics       Code = 41
	CodeAdminCreateTopic  Code = 42
	CodeAdminAddQueues    Code = 43
	CodeAdminSetGroupMode Code = 44
	CodeAdminRaftStatus   Code = 45
	CodeAdminAddVoter     Code = 46
	CodeAdminRemoveVoter  Code = 47
	CodeAdminApply        Code = 48 // a follower forwards a command to the leader
	CodeAdminResync       Code = 49 // an operator orders a slave to copy its log again from its master

	CodeConsumerHeartbeat Code = 50 // a consumer group member joins, stays, or leaves (metaserver leader)
	CodeCommitOffsets     Code = 51 // a member commits its queues' offsets (metaserver leader)
	CodeConsumerGroups    Code = 52 // the consumer groups: members, assignments, committed offsets
	CodeResetOffsets      Code = 53 // an admin sets a group's offsets; only with no live members
	CodeDeleteGroup       Code = 54 // an admin removes a consumer group with no live members
	CodeSetGroupFilter    Code = 55 // an admin sets the filter of the messages a consumer group receives

	// The access control list (6x, metaserver; JSON bodies, metaserver/api).
	CodeAdminACLSet    Code = 60 // create or replace a principal (leader)
	CodeAdminACLRemove Code = 61 // remove a principal (leader)
	CodeAdminACLList   Code = 62 // the principals, for an admin (leader)
	CodeACLGet         Code = 63 // the principals, for a broker's copy of the table (leader)

	// Broker group admission (7x, metaserver leader; JSON bodies, metaserver/api).
	CodeAdminAdmitGroup  Code = 70 // admit a pending or retired broker group: it may hold queues
	CodeAdminRetireGroup Code = 71 // move a dead broker group's queues to other groups and retire it
	CodeAdminGroupPolicy Code = 72 // set a broker group's min in-sync copies and ack quorum
	CodeAdminRemoveSlave Code = 73 // remove a slave from its broker group
	// The registry's audit trail, newest first (JSON, metaserver/api).
	CodeAuditList Code = 74
)

var codeNames = map[Code]string{
	CodeIdentify:          "IDENTIFY",
	CodeAuth:              "AUTH",
	CodeAdminACLSet:       "ADMIN_ACL_SET",
	CodeAdminACLRemove:    "ADMIN_ACL_REMOVE",
	CodeAdminACLList:      "ADMIN_ACL_LIST",
	CodeACLGet:            "ACL_GET",
	CodeSend:              "SEND",
	CodePull:              "PULL",
	CodeDelayedCancel:     "DELAYED_CANCEL",
	CodeDelayedState:      "DELAYED_STATE",
	CodeDelayedList:       "DELAYED_LIST",
	CodeQueueCount:        "QUEUE_COUNT",
	CodeLookup:            "LOOKUP",
	CodeTxnEnd:            "TXN_END",
	CodeTxnList:           "TXN_LIST",
	CodeHAFetch:           "HA_FETCH",
	CodeHAAck:             "HA_ACK",
	CodeRecover:           "RECOVER",
	CodeHeartbeat:         "HEARTBEAT",
	CodeRouteLookup:       "ROUTE_LOOKUP",
	CodeRouteGet:          "ROUTE_GET",
	CodeInitProducer:      "INIT_PRODUCER",
	CodeRouteWatch:        "ROUTE_WATCH",
	CodeAdminGroups:       "ADMIN_GROUPS",
	CodeConsumerHeartbeat: "CONSUMER_HEARTBEAT",
	CodeCommitOffsets:     "COMMIT_OFFSETS",
	CodeConsumerGroups:    "CONSUMER_GROUPS",
	CodeResetOffsets:      "RESET_OFFSETS",
	CodeDeleteGroup:       "DELETE_GROUP",
	CodeSetGroupFilter:    "SET_GROUP_FILTER",
	CodeAdminTopics:       "ADMIN_TOPICS",
	CodeAdminCreateTopic:  "ADMIN_CREATE_TOPIC",
	CodeAdminAddQueues:    "ADMIN_ADD_QUEUES",
	CodeAdminSetGroupMode: "ADMIN_SET_GROUP_MODE",
	CodeAdminRaftStatus:   "ADMIN_RAFT_STATUS",
	CodeAdminAddVoter:     "ADMIN_ADD_VOTER",
	CodeAdminRemoveVoter:  "ADMIN_REMOVE_VOTER",
	CodeAdminApply:        "ADMIN_APPLY",
	CodeAdminResync:       "ADMIN_RESYNC",
	CodeAdminAdmitGroup:   "ADMIN_ADMIT_GROUP",
	CodeAdminRetireGroup:  "ADMIN_RETIRE_GROUP",
	CodeAdminGroupPolicy:  "ADMIN_GROUP_POLICY",
	CodeAdminRemoveSlave:  "ADMIN_REMOVE_SLAVE",
	CodeAuditList:         "AUDIT_LIST",
	CodeAlterSyncSet:      "ALTER_SYNC_SET",
	CodeTxnDecide:         "TXN_DECIDE",
	CodeTxnDone:           "TXN_DONE",
	CodeTxnDecisions:      "TXN_DECISIONS",
}

func (c Code) String() string {
	if n, ok := codeNames[c]; ok {
		return n
	}
	return fmt.Sprintf("CODE(%d)", uint16(c))
}
