package fsm

import (
	"encoding/json"
	"fmt"

	"github.com/ferrymq/ferrymq/routing"
)

// CommandType is the first byte of an encoded command.
type CommandType uint8

// IgnoreUnknown marks a command type that a node not knowing it may skip.
const IgnoreUnknown CommandType = 0x80

// Command types.
const (
	TypeRegisterBroker  CommandType = 1
	TypeSetGroupReasons CommandType = 2
	TypeCreateTopic     CommandType = 3
	TypeAddQueues       CommandType = 4
	TypeRemoveGroup     CommandType = 5
	TypeRemoveBroker    CommandType = 6
	TypeSetMember       CommandType = 7 | IgnoreUnknown
	TypeRemoveMember    CommandType = 8 | IgnoreUnknown
	// TypeInitProducer has no IgnoreUnknown bit: a node that skipped an
	// allocation would hand the same id out again once it led.
	TypeInitProducer CommandType = 9
	// TypePromote has no IgnoreUnknown bit: a node that skipped a promotion
	// would route writes to a fenced master once it led.
	TypePromote CommandType = 10
	// TypeSetEpochStart has no IgnoreUnknown bit: a node that skipped it
	// would tell a rejoining broker to cut more than it must (harmless,
	// but the nodes would disagree).
	TypeSetEpochStart CommandType = 11
	// The consumer group commands have no IgnoreUnknown bit: a node that
	// skipped one would disagree on generations, assignments and offsets,
	// and once it led would fence members wrongly or lose commits.
	TypeJoinGroup     CommandType = 12
	TypeLeaveGroup    CommandType = 13
	TypeCommitOffsets CommandType = 14
	TypeResetOffsets  CommandType = 15
	// The ACL commands (acl.go) have no IgnoreUnknown bit: a node that
	// skipped a RemovePrincipal would go on letting a revoked principal
	// in once it led or served checks, one that skipped a SetPrincipal
	// would refuse a granted one, and its ACL version would differ from
	// the others', so servers polling it by version could miss a change.
	// Who may do what must be the same on every node: every node must
	// know the commands before any leader proposes one.
	TypeSetPrincipal    CommandType = 16
	TypeRemovePrincipal CommandType = 17
)

// Command is implemented by every command.
type Command interface {
	Type() CommandType
}

// RegisterBroker adds a broker to its group (creating the group, writable)
// or updates its addresses. A broker the group already names keeps its
// role whatever Role says: roles are the registry's, and Role is only the
// broker's preference when it first joins (it gets the other slot if the
// preferred one is taken, and CONFLICT if both are). A broker that takes
// the master slot starts a new epoch at LogEnd. Registering what is already
// there changes nothing, so retries are harmless.
type RegisterBroker struct {
	Group  string         `json:"group"`
	Role   routing.Role   `json:"role"`
	Broker routing.Broker `json:"broker"`
	LogEnd int64          `json:"log_end"`
	At     int64          `json:"at"` // unix ms, stamped by the leader
	// Pending, stamped by a leader that admits groups by hand, makes a
	// group this registration creates wait for AdmitGroup before it takes
	// queues (groups.go). It never changes an existing group.
	Pending bool `json:"pending,omitempty"`
	// MoreSlaves, stamped by leaders that know groups of several slaves,
	// makes a newcomer that prefers to be a slave join a group that has a
	// slave already as one more (up to routing.MaxSlaves), even while the
	// group has no master, instead of taking the master's place. (Entries
	// written before it replay as they were applied.)
	MoreSlaves bool `json:"more_slaves,omitempty"`
}

// Promote makes one of a group's slaves its master in a new epoch: Epoch
// must be the group's current epoch, Master its master's id and Slave one
// of its slaves' (else CONFLICT: the decision was made on a state that has
// moved). The new epoch is Epoch+1, starting at Start, the slave's log
// end; the old master leaves the group (it rejoins as a slave when it
// comes back); the other slaves stay, in the sync set if they were (its
// version moves); heartbeat-lost and slave-lag are cleared, the admin
// reason is kept.
type Promote struct {
	Group  string `json:"group"`
	Epoch  uint32 `json:"epoch"`
	Master string `json:"master"`
	Slave  string `json:"slave"`
	Start  int64  `json:"start"`
	At     int64  `json:"at"`
}

// SetGroupReasons adds and removes read-only reasons of a group.
type SetGroupReasons struct {
	Group         string          `json:"group"`
	Set           routing.Reasons `json:"set"`
	Clear         routing.Reasons `json:"clear"`
	ExpectVersion uint64          `json:"expect_version"` // 0: any
	At            int64           `json:"at"`
}

// CreateTopic creates a topic whose queue i lives on Queues[i].
type CreateTopic struct {
	Name   string   `json:"name"`
	Queues []string `json:"queues"`
}

// AddQueues appends queues, living on Groups, to a topic.
//
// Every consumer group subscribed to the topic moves to its next generation
// with a new assignment, in the same Apply.
type AddQueues struct {
	Topic         string   `json:"topic"`
	Groups        []string `json:"groups"`
	ExpectVersion uint64   `json:"expect_version"` // 0: any
	At            int64    `json:"at,omitempty"`   // unix ms, stamped by the leader (the groups' new generation)
}

// RemoveGroup removes a group no topic uses.
type RemoveGroup struct {
	Group         string `json:"group"`
	ExpectVersion uint64 `json:"expect_version"` // 0: any
}

// RemoveBroker removes the master or the slave of a group.
type RemoveBroker struct {
	Group string       `json:"group"`
	Role  routing.Role `json:"role"`
}

// SetMember records the RPC address of a metaserver node by its raft ID.
type SetMember struct {
	ID      string `json:"id"`
	RPCAddr string `json:"rpc_addr"`
}

// RemoveMember forgets a metaserver node.
type RemoveMember struct {
	ID string `json:"id"`
}

// InitProducer allocates a producer identity. An empty Name is an anonymous
// producer: a fresh id at epoch 0, nothing stored. A named producer keeps
// its id and gets the next epoch, which fences its earlier instances; when
// the epoch would pass 65535 it gets a fresh id at epoch 0. The Result's
// Producer carries the identity. Retrying it is harmless but not idempotent:
// a retry allocates again (an id or an epoch is skipped, never repeated).
type InitProducer struct {
	Name string `json:"name,omitempty"`
}

func (RegisterBroker) Type() CommandType  { return TypeRegisterBroker }
func (SetGroupReasons) Type() CommandType { return TypeSetGroupReasons }
func (CreateTopic) Type() CommandType     { return TypeCreateTopic }
func (AddQueues) Type() CommandType       { return TypeAddQueues }
func (RemoveGroup) Type() CommandType     { return TypeRemoveGroup }
func (RemoveBroker) Type() CommandType    { return TypeRemoveBroker }
func (SetMember) Type() CommandType       { return TypeSetMember }
func (RemoveMember) Type() CommandType    { return TypeRemoveMember }

// SetEpochStart is the command of earlier metaservers that moved the start
// of a group's current epoch up to a master's reported log end at every
// takeover, restarts included (which could move it past records written in
// the epoch). No metaserver proposes it any more; entries already in a Raft
// log apply as they did, so that nodes of both versions agree, and only
// to a start that is not fixed (FixEpochStart). Read as a decision record:
// docs/decisions/epoch-start-fixed.md.
type SetEpochStart struct {
	Group string `json:"group"`
	Epoch uint32 `json:"epoch"`
	Start int64  `json:"start"`
}

func (InitProducer) Type() CommandType  { return TypeInitProducer }
func (SetEpochStart) Type() CommandType { return TypeSetEpochStart }
func (Promote) Type() CommandType       { return TypePromote }

// Encode returns a command's log entry: its type byte and JSON body.
func Encode(c Command) ([]byte, error) {
	body, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("fsm: encode %T: %w", c, err)
	}
	return append([]byte{byte(c.Type())}, body...), nil
}

// Decode parses a log entry. It returns (nil, nil) for an unknown type that
// may be ignored.
func Decode(b []byte) (Command, error) {
	if len(b) == 0 {
		return nil, fmt.Errorf("fsm: empty command")
	}
	var c Command
	switch CommandType(b[0]) {
	case TypeRegisterBroker:
		c = &RegisterBroker{}
	case TypeSetGroupReasons:
		c = &SetGroupReasons{}
	case TypeCreateTopic:
		c = &CreateTopic{}
	case TypeAddQueues:
		c = &AddQueues{}
	case TypeRemoveGroup:
		c = &RemoveGroup{}
	case TypeRemoveBroker:
		c = &RemoveBroker{}
	case TypeSetMember:
		c = &SetMember{}
	case TypeRemoveMember:
		c = &RemoveMember{}
	case TypeInitProducer:
		c = &InitProducer{}
	case TypePromote:
		c = &Promote{}
	case TypeSetEpochStart:
		c = &SetEpochStart{}
	case TypeFixEpochStart:
		c = &FixEpochStart{}
	case TypeResyncBroker:
		c = &ResyncBroker{}
	case TypeResyncDone:
		c = &ResyncDone{}
	case TypeJoinMember:
		c = &JoinMember{}
	case TypeLeaveMember:
		c = &LeaveMember{}
	case TypeCommitHeld:
		c = &CommitHeld{}
	case TypeReleaseQueues:
		c = &ReleaseQueues{}
	case TypeSettleGroup:
		c = &SettleGroup{}
	case TypeDeleteGroup:
		c = &DeleteGroup{}
	case TypeSetGroupFilter:
		c = &SetGroupFilter{}
	case TypeJoinGroup:
		c = &JoinGroup{}
	case TypeLeaveGroup:
		c = &LeaveGroup{}
	case TypeCommitOffsets:
		c = &CommitOffsets{}
	case TypeResetOffsets:
		c = &ResetOffsets{}
	case TypeSetPrincipal:
		c = &SetPrincipal{}
	case TypeRemovePrincipal:
		c = &RemovePrincipal{}
	case TypeAdmitGroup:
		c = &AdmitGroup{}
	case TypeRetireGroup:
		c = &RetireGroup{}
	case TypeRecordQueueEnds:
		c = &RecordQueueEnds{}
	case TypeJoinSlave:
		c = &JoinSlave{}
	case TypeAlterSyncSet:
		c = &AlterSyncSet{}
	case TypeSetGroupPolicy:
		c = &SetGroupPolicy{}
	case TypeRemoveGroupBroker:
		c = &RemoveGroupBroker{}
	case TypeTxnDecide:
		c = &TxnDecide{}
	case TypeTxnDone:
		c = &TxnDone{}
	case TypeTxnExpire:
		c = &TxnExpire{}
	case TypeAuditExpire:
		c = &AuditExpire{}
	case TypeAuditNote:
		c = &AuditNote{}
	default:
		if CommandType(b[0])&IgnoreUnknown != 0 {
			return nil, nil
		}
		return nil, fmt.Errorf("fsm: unknown command type %d", b[0])
	}
	if err := json.Unmarshal(b[1:], c); err != nil {
		return nil, fmt.Errorf("fsm: decode command type %d: %w", b[0], err)
	}
	return c, nil
}
