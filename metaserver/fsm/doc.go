// Package fsm is the metaserver's pure, deterministic state machine: typed
// commands in (register a broker, set a group's state, create a topic, add
// queues, remove a broker or a group, record a member's address, allocate a
// producer identity, join or leave a consumer group, commit or reset a
// consumer group's offsets), routing state, producer identities and
// consumer groups out.
//
// # Contract
//
// hashicorp/raft calls Apply, Snapshot and Restore from its FSM goroutine,
// one at a time; readers (route lookups, the judge, the admin API) call the
// read methods from any goroutine, under a read lock. Apply is a function of
// the state and the command only: it reads no clock, draws no random number
// and does no I/O. The leader stamps times into the commands, so every node
// that applies the same log reaches the same state. A test fails if this
// package imports time, randomness, os or net.
//
// Snapshot copies the state (cheap: the registry is small); Persist encodes
// the copy to the sink on raft's snapshot goroutine.
//
// # Commands
//
// An encoded command is one type byte followed by its JSON body. A type
// byte with the IgnoreUnknown bit set may be skipped by a node that does not
// know it (a rolling upgrade adding an optional command); an unknown type
// without the bit is a broken invariant and panics, as raft requires.
//
// Each command carries a precondition where a retry or a stale decision
// could do harm: SetGroupReasons and RemoveGroup name the group version they
// were decided on, AddQueues the topic version, CreateTopic requires the
// topic not to exist. A command whose precondition fails changes nothing and
// returns a CONFLICT error through the apply future's Response.
//
// The consumer group commands (consumers.go) have their own preconditions:
// a retried JoinGroup with the member's topics changes nothing, LeaveGroup
// may name the generation it was decided in, CommitOffsets must name the
// current generation and only queues assigned to its member in it
// (STALE_GENERATION otherwise), and ResetOffsets needs a group without
// members (GROUP_ACTIVE otherwise). Assignment (AssignQueues) is a pure
// function of the previous assignment and the members. None of them moves
// the registry Version.
//
// InitProducer is the one command that is not harmless to repeat by
// design: each application allocates (a fresh id, or the next epoch of a
// name). A retry after an unknown outcome therefore skips an id or an
// epoch, and never hands one out twice, which is all uniqueness and
// fencing need. Its type has no IgnoreUnknown bit: a node that skipped an
// allocation could hand the same id out again once it led, so every node
// must know the command before any leader proposes it.
//
// The broker group commands (groups.go) admit a pending or retired group
// (AdmitGroup), move every queue of a group to other admitted groups and
// retire it (RetireGroup: its moves must name exactly the group's queues,
// CONFLICT otherwise; each queue continues at a base past every offset the
// registry knows of it), and record the queue ends masters report
// (RecordQueueEnds: only upwards, only for the reporting group's queues,
// without moving the registry Version). CreateTopic and AddQueues refuse a
// group that is not admitted.
//
// The ACL commands (acl.go) keep the principals: SetPrincipal (create or
// replace a principal's token hash and permissions) and RemovePrincipal.
// Every permission is parsed in Apply (auth.ParsePermissions): a command
// with one that does not parse, a bad or reserved name, or a token another
// principal has is refused whole. Either may name the ACL version it was
// decided on (CONFLICT otherwise); the version grows at every change, and
// does not move the registry Version. The registry holds only tokens'
// SHA-256.
//
// The transaction commands (txns.go) record the decisions of transactions
// on several broker groups: TxnDecide records a commit or an abort unless
// the transaction has one (the first decision wins, and a later decide
// answers it, changing nothing), committing a consumer group member's
// offsets with it through the same checks as CommitOffsets and CommitHeld
// (a refused commit records nothing); TxnDone removes the groups that
// applied the decision, and the record once none is left; TxnExpire
// deletes records decided before a time the leader stamps. None moves the
// registry Version.
package fsm
