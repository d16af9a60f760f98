package fsm

import (
	"cmp"
	"fmt"
	"maps"
	"slices"

	"github.com/ferrymq/ferrymq/protocol"
)

// Transaction decisions. A transaction whose messages are on more than one
// broker group, or that carries a consumer group's offsets, is decided here
// with one Raft write (TxnDecide): the first decision recorded for a
// transaction wins, so a producer committing and a broker aborting at its
// timeout cannot both succeed, and whoever loses learns the decision made.
// Whoever decided tells each group's master (TXN_END) and reports the
// groups that applied it (TxnDone). A producer's decision names every group
// of its transaction and is deleted once all reported; one made by another
// (a master's timeout, a checker, an operator) names only the group that
// asked, so it is kept: every record goes TxnRetentionMillis after its
// decision (TxnExpire). A producer's decision from an instance older than
// its identity's newest is refused (PRODUCER_FENCED).
//
// The commands have no IgnoreUnknown bit: a node that skipped a decision
// would, once it led, let a later request decide the other way.
const (
	TypeTxnDecide CommandType = 30
	TypeTxnDone   CommandType = 31
	TypeTxnExpire CommandType = 32
)

// Limits of transaction decisions.
const (
	// MaxTxnGroups is the most broker groups one decision names.
	MaxTxnGroups = 256
	// MaxTxnRecords is the most decisions held at once: past it a new
	// decision is refused BUSY (retriable) until groups report done or
	// records expire.
	MaxTxnRecords = 100_000
	// TxnRetentionMillis (7 days) is how long a decision is kept when
	// some of its groups never report done: the leader expires older
	// records (TxnExpire). (Milliseconds: the FSM reads no clock, nor
	// imports package time.)
	//
	// Why 7 days: a broker asks the registry only about a transaction open
	// on it, and it asks (at its transaction timeout, or when the decider's
	// TXN_END reaches its master) within minutes while its master is up; a
	// group still pending a week later is one that never held the
	// transaction's messages (the producer named it, but nothing was
	// written there) or one whose master was down for the whole week,
	// which is out of scope: such a master, back, aborts its open
	// transaction at its timeout and learns nothing of a commit the
	// registry forgot. 7 days is also how long the brokers keep a
	// producer's dedupe state (storage ProducerIdle), so a producer
	// identity idle that long is forgotten everywhere alike.
	TxnRetentionMillis int64 = 7 * 24 * 3600 * 1000
)

// TxnKey names a transaction: its producer's id and epoch and its number
// (protocol.TxnID). As a map key in a snapshot it is "PRODUCER.EPOCH.NUMBER".
type TxnKey struct {
	Producer uint64
	Epoch    uint16
	Number   uint64
}

// MarshalText is the key's protocol.TxnID string.
func (k TxnKey) MarshalText() ([]byte, error) { return []byte(k.ID().String()), nil }

// UnmarshalText parses a protocol.TxnID string.
func (k *TxnKey) UnmarshalText(b []byte) error {
	id, err := protocol.ParseTxnID(string(b))
	if err != nil {
		return fmt.Errorf("fsm: transaction key: %w", err)
	}
	*k = TxnKey{Producer: id.Producer, Epoch: id.Epoch, Number: id.Number}
	return nil
}

// ID is the key as a protocol.TxnID.
func (k TxnKey) ID() protocol.TxnID {
	return protocol.TxnID{Producer: k.Producer, Epoch: k.Epoch, Number: k.Number}
}

func (k TxnKey) compare(o TxnKey) int {
	return cmp.Or(cmp.Compare(k.Producer, o.Producer), cmp.Compare(k.Epoch, o.Epoch), cmp.Compare(k.Number, o.Number))
}

// TxnRecord is a transaction's decision. Records are never modified in
// place, only replaced, so a clone of the state may share them.
type TxnRecord struct {
	Committed bool     `json:"committed"`
	By        string   `json:"by"`
	At        int64    `json:"at"` // unix ms, stamped by the leader
	Groups    []string `json:"groups"`
	// Pending are the groups of Groups not yet reported done.
	Pending []string `json:"pending"`
	// Offsets says the decision committed a consumer group member's
	// offsets with it (a later decide carrying offsets, answered this
	// record, committed none).
	Offsets bool `json:"offsets,omitempty"`
	// Principal made the decision (stamped by the leader; "" with
	// authorization off).
	Principal string `json:"principal,omitempty"`
}

// TxnEntry is a record with its key (FSM.TxnDecisions).
type TxnEntry struct {
	Key TxnKey
	TxnRecord
}

// TxnOffsets are a consumer group member's offsets committed with a
// decision: checked and applied as CommitHeld (Incarnation not 0) or
// CommitOffsets (in Generation) check and apply them.
type TxnOffsets struct {
	Group       string        `json:"group"`
	Member      string        `json:"member"`
	Generation  uint64        `json:"generation,omitempty"`
	Incarnation uint64        `json:"incarnation,omitempty"`
	Offsets     []QueueOffset `json:"offsets"`
	Principal   string        `json:"principal,omitempty"`
}

// TxnDecide records a transaction's decision, unless one is recorded:
// then it changes nothing and the Result carries the recorded one, whatever
// this command asks (the first decision wins; a repeated command is
// harmless). With Offsets (only with Commit), the offsets are checked and
// committed first, exactly as a member's commit; a refused commit records
// nothing and is the command's error.
type TxnDecide struct {
	Producer uint64      `json:"producer"`
	Epoch    uint16      `json:"epoch"`
	Number   uint64      `json:"number"`
	Commit   bool        `json:"commit"`
	By       string      `json:"by"`
	Groups   []string    `json:"groups"`
	Offsets  *TxnOffsets `json:"offsets,omitempty"`
	At       int64       `json:"at"` // unix ms, stamped by the leader
	// Principal deciding, stamped by the leader ("": authorization off).
	Principal string `json:"principal,omitempty"`
}

// TxnDone removes Groups from a record's pending groups, and the record
// once none is pending. An unknown record is no error (it expired, or the
// groups reported before).
type TxnDone struct {
	Producer uint64   `json:"producer"`
	Epoch    uint16   `json:"epoch"`
	Number   uint64   `json:"number"`
	Groups   []string `json:"groups"`
	// Principal, stamped by the leader ("": a broker, an operator, or
	// authorization off), must be the one that decided a producer's
	// decision: another producer cannot make the registry forget it.
	Principal string `json:"principal,omitempty"`
}

// TxnExpire deletes the records decided before Before (unix ms): the
// leader proposes it with Before = now - TxnRetentionMillis when such records
// exist.
type TxnExpire struct {
	Before int64 `json:"before"`
}

func (TxnDecide) Type() CommandType { return TypeTxnDecide }
func (TxnDone) Type() CommandType   { return TypeTxnDone }
func (TxnExpire) Type() CommandType { return TypeTxnExpire }

// Key is the transaction c decides.
func (c *TxnDecide) Key() TxnKey {
	return TxnKey{Producer: c.Producer, Epoch: c.Epoch, Number: c.Number}
}

// Key is the transaction c reports on.
func (c *TxnDone) Key() TxnKey { return TxnKey{Producer: c.Producer, Epoch: c.Epoch, Number: c.Number} }

// ValidTxnBy reports whether by names who may decide a transaction.
func ValidTxnBy(by string) bool {
	switch by {
	case protocol.TxnByProducer, protocol.TxnByChecker, protocol.TxnByTimeout, protocol.TxnByChecks, protocol.TxnByAdmin:
		return true
	}
	return false
}

// CheckTxnKey refuses a key naming no transaction.
func CheckTxnKey(k TxnKey) error {
	if k.Producer == 0 || k.Number == 0 {
		return invalidErr("transaction %s names no transaction: producer and number must not be 0", k.ID())
	}
	return nil
}

// CheckTxnGroups checks the broker groups of a decision or a report: 1 to
// MaxTxnGroups valid names, none repeated.
func CheckTxnGroups(groups []string) error {
	if len(groups) == 0 || len(groups) > MaxTxnGroups {
		return invalidErr("a transaction names 1 to %d broker groups, got %d", MaxTxnGroups, len(groups))
	}
	seen := make(map[string]bool, len(groups))
	for _, g := range groups {
		if err := protocol.ValidateServerName("broker group name", g); err != nil {
			return invalidErr("%v", err)
		}
		if seen[g] {
			return invalidErr("broker group %q is named twice", g)
		}
		seen[g] = true
	}
	return nil
}

// Check refuses a malformed decision (INVALID), before and at apply.
func (c *TxnDecide) Check() error {
	if err := CheckTxnKey(c.Key()); err != nil {
		return err
	}
	if !ValidTxnBy(c.By) {
		return invalidErr("transaction %s: unknown decider %q", c.Key().ID(), protocol.Clip(c.By))
	}
	if err := CheckTxnGroups(c.Groups); err != nil {
		return err
	}
	if c.Offsets == nil {
		return nil
	}
	if !c.Commit {
		return invalidErr("transaction %s: offsets are committed only with a commit, not an abort", c.Key().ID())
	}
	if len(c.Offsets.Offsets) == 0 {
		return invalidErr("transaction %s: offsets name no queue", c.Key().ID())
	}
	if err := ValidateConsumerName("group", c.Offsets.Group); err != nil {
		return invalidErr("%v", err)
	}
	if err := ValidateConsumerName("member", c.Offsets.Member); err != nil {
		return invalidErr("%v", err)
	}
	return nil
}

func (f *FSM) txnDecide(c *TxnDecide) any {
	if err := c.Check(); err != nil {
		return err
	}
	k := c.Key()
	if r := f.s.Txns[k]; r != nil {
		return &Result{Txn: r}
	}
	if c.By == protocol.TxnByProducer {
		// A producer decides only its own instance's transactions: an
		// older instance (a zombie, or a late retry) is fenced, so a
		// decision forgotten once applied cannot be made again by it.
		for _, p := range f.s.Producers {
			if p.ID == c.Producer && p.Epoch > c.Epoch {
				return &protocol.Error{Status: protocol.StatusProducerFenced,
					Message: fmt.Sprintf("transaction %s: a later instance of its producer (epoch %d) has started", k.ID(), p.Epoch)}
			}
		}
	}
	if len(f.s.Txns) >= MaxTxnRecords {
		return &protocol.Error{Status: protocol.StatusBusy,
			Message: fmt.Sprintf("the registry holds %d transaction decisions, its most; try again once groups reported theirs", len(f.s.Txns))}
	}
	res := &Result{Changed: true}
	if o := c.Offsets; o != nil {
		var out any
		if o.Incarnation != 0 {
			out = f.commitHeld(&CommitHeld{Group: o.Group, Member: o.Member, Incarnation: o.Incarnation, Offsets: o.Offsets, Principal: o.Principal})
		} else {
			out = f.commitOffsets(&CommitOffsets{Group: o.Group, Member: o.Member, Generation: o.Generation, Offsets: o.Offsets, Principal: o.Principal})
		}
		if err, ok := out.(error); ok {
			return err // nothing recorded: the commits check everything before they change anything
		}
		res.Generation = out.(*Result).Generation
	}
	r := &TxnRecord{Committed: c.Commit, By: c.By, At: c.At, Groups: slices.Clone(c.Groups), Pending: slices.Clone(c.Groups),
		Offsets: c.Offsets != nil, Principal: c.Principal}
	if f.s.Txns == nil {
		f.s.Txns = map[TxnKey]*TxnRecord{}
	}
	f.s.Txns[k] = r
	res.Txn = r
	return res
}

func (f *FSM) txnDone(c *TxnDone) any {
	k := c.Key()
	r := f.s.Txns[k]
	if r == nil {
		return &Result{}
	}
	if c.Principal != "" && c.Principal != r.Principal {
		return &protocol.Error{Status: protocol.StatusNotAuthorized,
			Message: fmt.Sprintf("transaction %s was decided by principal %q: %q may not report it applied", k.ID(), r.Principal, c.Principal)}
	}
	pending := slices.DeleteFunc(slices.Clone(r.Pending), func(g string) bool { return slices.Contains(c.Groups, g) })
	switch {
	case len(pending) == len(r.Pending):
		return &Result{Txn: r}
	case len(pending) == 0 && r.By == protocol.TxnByProducer:
		// Its producer named every group the transaction wrote.
		delete(f.s.Txns, k)
		return &Result{Changed: true}
	}
	// A decision made by another (a timeout, a checker, an operator) names
	// only the group that asked: other groups of the transaction may ask
	// later, so it is kept until it expires.
	r2 := *r
	r2.Pending = pending
	f.s.Txns[k] = &r2
	return &Result{Changed: true, Txn: &r2}
}

func (f *FSM) txnExpire(c *TxnExpire) any {
	n := 0
	for k, r := range f.s.Txns {
		if r.At < c.Before {
			delete(f.s.Txns, k)
			n++
		}
	}
	return &Result{Changed: n > 0, Expired: n}
}

// Txn returns a transaction's decision, and whether one is recorded.
func (f *FSM) Txn(k TxnKey) (TxnRecord, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	r := f.s.Txns[k]
	if r == nil {
		return TxnRecord{}, false
	}
	return *r, true
}

// TxnCount is how many decisions are held.
func (f *FSM) TxnCount() int {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return len(f.s.Txns)
}

// TxnsDecidedBefore reports whether a decision older than before (unix ms)
// is held.
func (f *FSM) TxnsDecidedBefore(before int64) bool {
	f.mu.RLock()
	defer f.mu.RUnlock()
	for _, r := range f.s.Txns {
		if r.At < before {
			return true
		}
	}
	return false
}

// TxnDecisions returns the decisions of producer (0: all), sorted by
// decision time then key, at most limit of them, and whether more are held.
func (f *FSM) TxnDecisions(producer uint64, limit int) ([]TxnEntry, bool) {
	f.mu.RLock()
	out := make([]TxnEntry, 0, min(len(f.s.Txns), 1024))
	for k, r := range f.s.Txns {
		if producer == 0 || k.Producer == producer {
			out = append(out, TxnEntry{Key: k, TxnRecord: *r})
		}
	}
	f.mu.RUnlock()
	slices.SortFunc(out, func(a, b TxnEntry) int { return cmp.Or(cmp.Compare(a.At, b.At), a.Key.compare(b.Key)) })
	if len(out) > limit {
		return out[:limit], true
	}
	return out, false
}

// cloneTxns copies the records' map; the records are shared (never
// modified in place).
func cloneTxns(m map[TxnKey]*TxnRecord) map[TxnKey]*TxnRecord {
	if m == nil {
		return map[TxnKey]*TxnRecord{}
	}
	return maps.Clone(m)
}
