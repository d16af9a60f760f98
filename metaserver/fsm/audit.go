package fsm

import (
	"encoding/json"
	"fmt"
	"slices"
	"unicode/utf8"

	"github.com/hashicorp/raft"

	"github.com/ferrymq/ferrymq/protocol"
)

// The audit trail: every command that changes the registry on someone's
// behalf (an operator's act, a client's or a server's decision, not the
// traffic of heartbeats, commits and producer inits) leaves a record of who
// made it, when, what it asked and whether it was applied or refused. The
// leader stamps who and when into the log entry (Stamp, carried in
// raft.Log.Extensions), so every node applying the same log keeps the same
// records; they are part of the state, and so of its snapshots. They are
// kept for the leader's retention (AuditExpire) and at most
// MaxAuditRecords of them (the oldest go first, at apply).

// Command types of this file. Both have the IgnoreUnknown bit: a node that
// skips them keeps no audit trail, or a longer one, and routes, admits and
// decides as every other node.
const (
	TypeAuditExpire CommandType = 47 | IgnoreUnknown
	TypeAuditNote   CommandType = 48 | IgnoreUnknown
)

const (
	// MaxAuditRecords is how many records the registry keeps at most:
	// applying one more drops the oldest.
	MaxAuditRecords = 100_000
	// MaxAuditSummary is the longest summary kept, in bytes (a longer
	// one is cut and ends with "...").
	MaxAuditSummary = 512
	// maxRefusal is the longest refusal message kept, in bytes.
	maxRefusal = 256
	// maxStampName is the longest principal or via a stamp keeps.
	maxStampName = 200
)

// Stamp is who proposed a log entry and when, by the leader that appended
// it: the entry's raft.Log.Extensions (EncodeStamp).
type Stamp struct {
	// Principal made the request ("" with authorization off).
	Principal string `json:"p,omitempty"`
	// Via says how: "console" for the console acting for a certificate
	// session, "leader n1" for the leader's own work.
	Via string `json:"v,omitempty"`
	// At is the leader's clock when it proposed the entry (unix ms).
	At int64 `json:"t,omitempty"`
}

// EncodeStamp returns s as a log entry's Extensions.
func EncodeStamp(s Stamp) []byte {
	b, _ := json.Marshal(s) // strings and an integer: never fails
	return b
}

// stampOf reads an entry's stamp. An entry without one (proposed by an
// earlier leader) is stamped with no principal and the time the leader
// appended it.
func stampOf(l *raft.Log) Stamp {
	var s Stamp
	if len(l.Extensions) > 0 && json.Unmarshal(l.Extensions, &s) == nil {
		s.Principal = cut(s.Principal, maxStampName)
		s.Via = cut(s.Via, maxStampName)
		return s
	}
	if !l.AppendedAt.IsZero() {
		s.At = l.AppendedAt.UnixMilli()
	}
	return s
}

// AuditRecord is one change made through the registry. Records are never
// modified once appended, so a clone of the state shares them.
type AuditRecord struct {
	// Index is the entry's Raft index: records are in its order, and it
	// names a record (AUDIT_LIST's cursor).
	Index     uint64 `json:"index"`
	At        int64  `json:"at"` // unix ms, the leader's stamp
	Principal string `json:"principal,omitempty"`
	Via       string `json:"via,omitempty"`
	// Kind names the command (AuditKinds).
	Kind string `json:"kind"`
	// Summary is the command's arguments as JSON, token hashes shortened,
	// cut at MaxAuditSummary bytes.
	Summary string `json:"summary"`
	Applied bool   `json:"applied"`
	// Refusal is why the registry refused it (Applied false).
	Refusal string `json:"refusal,omitempty"`
}

// AuditExpire drops the records older than Before (unix ms): the leader
// proposes it with Before = now - its retention when it holds such records.
type AuditExpire struct {
	Before int64 `json:"before"`
}

// AuditNote records an act made outside the state machine (a Raft voter
// change): it changes nothing but the audit trail.
type AuditNote struct {
	Kind    string `json:"kind"`
	Summary string `json:"summary"`
}

func (AuditExpire) Type() CommandType { return TypeAuditExpire }
func (AuditNote) Type() CommandType   { return TypeAuditNote }

// auditKinds names the audited commands. A command type not here is
// traffic (heartbeats' registrations of what is known, commits, producer
// inits, consumer group membership) or housekeeping, and leaves no record.
var auditKinds = map[CommandType]string{
	TypeRegisterBroker:    "register-broker",
	TypeSetGroupReasons:   "set-group-mode",
	TypeCreateTopic:       "create-topic",
	TypeAddQueues:         "add-queues",
	TypeRemoveGroup:       "remove-group",
	TypeRemoveBroker:      "remove-broker",
	TypeSetMember:         "set-member",
	TypeRemoveMember:      "remove-member",
	TypePromote:           "promote",
	TypeResetOffsets:      "reset-offsets",
	TypeSetPrincipal:      "set-principal",
	TypeRemovePrincipal:   "remove-principal",
	TypeResyncBroker:      "resync",
	TypeResyncDone:        "resync-done",
	TypeDeleteGroup:       "delete-consumer-group",
	TypeSetGroupFilter:    "set-group-filter",
	TypeAdmitGroup:        "admit-group",
	TypeRetireGroup:       "retire-group",
	TypeJoinSlave:         "join-slave",
	TypeAlterSyncSet:      "alter-sync-set",
	TypeSetGroupPolicy:    "set-group-policy",
	TypeRemoveGroupBroker: "remove-slave",
	TypeTxnDecide:         "txn-decide",
}

// AuditKinds lists the kinds of records, sorted (the console's filter).
func AuditKinds() []string {
	out := []string{"add-voter", "remove-voter"}
	for _, k := range auditKinds {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// auditKind is the kind of record c leaves, "" for none: a command of an
// audited type that changed the registry or was refused. Of transaction
// decisions, an operator's and a checker's are recorded; a producer's own
// and the brokers' timeouts are traffic.
func auditKind(c Command, res any) string {
	if r, ok := res.(*Result); ok && !r.Changed {
		return ""
	}
	switch c := c.(type) {
	case *AuditNote:
		return c.Kind
	case *TxnDecide:
		if c.By != protocol.TxnByAdmin && c.By != protocol.TxnByChecker {
			return ""
		}
	}
	return auditKinds[c.Type()]
}

// audit appends c's record, if it leaves one, then drops the oldest past
// MaxAuditRecords. f.mu is held.
func (f *FSM) audit(l *raft.Log, c Command, res any) {
	kind := auditKind(c, res)
	if kind == "" {
		return
	}
	st := stampOf(l)
	r := AuditRecord{Index: l.Index, At: st.At, Principal: st.Principal, Via: st.Via, Kind: kind,
		Summary: summarize(c), Applied: true}
	if err, ok := res.(error); ok {
		r.Applied = false
		r.Refusal = cut(err.Error(), maxRefusal)
	}
	a := f.s.Audit
	if n := len(a) + 1 - MaxAuditRecords; n > 0 {
		// Reslicing (no copy): a snapshot's clone shares the records; an
		// append past cap moves the live ones to a new array.
		a = a[n:]
	}
	f.s.Audit = append(a, r)
}

// summarize is c's arguments as JSON, without a full token hash, cut at
// MaxAuditSummary bytes.
func summarize(c Command) string {
	switch p := c.(type) {
	case *SetPrincipal:
		// The hash identifies the token: its first 8 hex digits tell
		// rotations apart without giving it away.
		return cut(fmt.Sprintf(`{"name":%q,"token_sha256":"%.8s...","permissions":%s}`,
			p.Name, p.TokenHash.String(), mustJSON(p.Permissions)), MaxAuditSummary)
	case *AuditNote:
		return cut(p.Summary, MaxAuditSummary)
	}
	return cut(mustJSON(c), MaxAuditSummary)
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("%q", err.Error())
	}
	return string(b)
}

// cut shortens s to at most n bytes on a character boundary, ending with
// "..." when it cut.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := n - 3
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + "..."
}

// auditExpire drops the oldest records while they are older than
// c.Before. Records are in log order; a leader's clock behind an earlier
// leader's may leave an older record behind a newer one until that one
// goes too.
func (f *FSM) auditExpire(c *AuditExpire) any {
	a := f.s.Audit
	i := 0
	for i < len(a) && a[i].At < c.Before {
		i++
	}
	if i == 0 {
		return &Result{}
	}
	f.s.Audit = a[i:]
	if len(f.s.Audit) == 0 {
		f.s.Audit = nil
	}
	return &Result{Changed: true, Expired: i}
}

func (f *FSM) auditNote(c *AuditNote) any {
	if c.Kind == "" || len(c.Kind) > 64 {
		return &protocol.Error{Status: protocol.StatusInvalid, Message: "an audit note needs a kind of 1 to 64 bytes"}
	}
	return &Result{Changed: true}
}

// OldestAuditBefore reports whether a record is older than before (unix
// ms): the leader's cue to propose AuditExpire.
func (f *FSM) OldestAuditBefore(before int64) bool {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return len(f.s.Audit) > 0 && f.s.Audit[0].At < before
}

// AuditQuery selects records (FSM.AuditRecords).
type AuditQuery struct {
	Principal string // "": any
	Kind      string // "": any
	// Below, when not 0, takes records of a lower Raft index only (the
	// cursor of the previous page).
	Below uint64
	// Limit is the most records answered (at least 1).
	Limit int
	// Scan is the most records looked at (0: all), so that a filter
	// matching little costs a bounded time; More then tells to go on.
	Scan int
}

// AuditRecords returns the records q selects, newest first, and the index
// to continue below (0: there are no more). The records are shared: do
// not modify them.
func (f *FSM) AuditRecords(q AuditQuery) (recs []AuditRecord, next uint64) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	a := f.s.Audit
	end := len(a)
	if q.Below != 0 {
		end, _ = slices.BinarySearchFunc(a, q.Below, func(r AuditRecord, i uint64) int {
			if r.Index < i {
				return -1
			}
			return 1
		})
	}
	limit := max(q.Limit, 1)
	scanned := 0
	for i := end - 1; i >= 0; i-- {
		r := a[i]
		if len(recs) == limit || (q.Scan > 0 && scanned == q.Scan) {
			return recs, a[i+1].Index
		}
		scanned++
		if (q.Principal == "" || r.Principal == q.Principal) && (q.Kind == "" || r.Kind == q.Kind) {
			recs = append(recs, r)
		}
	}
	return recs, 0
}

// AuditLen is how many records the registry holds.
func (f *FSM) AuditLen() int {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return len(f.s.Audit)
}
