package fsm

import (
	"reflect"
	"strings"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
)

// stamped is the log entry a leader appends for c at index i, stamped with
// principal p at unix ms at.
func stamped(t *testing.T, i uint64, c Command, p string, at int64) *raft.Log {
	t.Helper()
	b, err := Encode(c)
	if err != nil {
		t.Fatal(err)
	}
	return &raft.Log{Type: raft.LogCommand, Index: i, Data: b, Extensions: EncodeStamp(Stamp{Principal: p, At: at})}
}

// auditLog is a log of audited and unaudited commands, on seeded's state.
func auditLog(t *testing.T) []*raft.Log {
	cmds := []struct {
		c Command
		p string
	}{
		{&CreateTopic{Name: "pay", Queues: []string{"g1"}}, "alice"},
		{&InitProducer{Name: "p1"}, "app"},                                  // traffic
		{&CreateTopic{Name: "pay", Queues: []string{"g2"}}, "bob"},          // refused: exists
		{&CreateTopic{Name: "pay", Queues: []string{"g1"}}, "alice"},        // a retry: changes nothing
		{&SetGroupReasons{Group: "g1", Set: routing.Admin, At: 9}, "alice"}, // group mode
		{&SetPrincipal{Name: "carol", TokenHash: auth.HashToken("secret-token-of-carol-0123456789"), Permissions: []string{"describe"}}, "admin"},
		{&TxnDecide{Producer: 7, Epoch: 1, Number: 1, Commit: true, By: protocol.TxnByProducer, Groups: []string{"g1"}, At: 5}, "app"}, // traffic
		{&TxnDecide{Producer: 7, Epoch: 1, Number: 2, Commit: false, By: protocol.TxnByAdmin, Groups: []string{"g1"}, At: 5}, "admin"},
		{&TxnDecide{Producer: 7, Epoch: 1, Number: 3, Commit: false, By: protocol.TxnByTimeout, Groups: []string{"g1"}, At: 5}, "cluster"}, // traffic
		{&AuditNote{Kind: "add-voter", Summary: `{"id":"n4"}`}, "admin"},
		{&Promote{Group: "g2", Epoch: 1, Master: "g2-m", Slave: "g2-s", Start: 10, At: 11}, "cluster"},
	}
	var out []*raft.Log
	for i, c := range cmds {
		out = append(out, stamped(t, uint64(100+i), c.c, c.p, int64(1000+i)))
	}
	return out
}

func applyLog(f *FSM, log []*raft.Log) {
	for _, l := range log {
		f.Apply(l)
	}
}

// Exactly the audited commands leave a record, with the stamp's principal
// and time and the entry's index, applied or refused.
func TestAuditRecordsTheAuditedCommands(t *testing.T) {
	f := seeded(t)
	before := f.AuditLen()
	applyLog(f, auditLog(t))
	got := f.State().Audit[before:]
	type rec struct {
		Index     uint64
		At        int64
		Principal string
		Kind      string
		Applied   bool
	}
	want := []rec{
		{100, 1000, "alice", "create-topic", true},
		{102, 1002, "bob", "create-topic", false},
		{104, 1004, "alice", "set-group-mode", true},
		{105, 1005, "admin", "set-principal", true},
		{107, 1007, "admin", "txn-decide", true},
		{109, 1009, "admin", "add-voter", true},
		{110, 1010, "cluster", "promote", true},
	}
	var have []rec
	for _, r := range got {
		have = append(have, rec{r.Index, r.At, r.Principal, r.Kind, r.Applied})
	}
	if !reflect.DeepEqual(have, want) {
		t.Fatalf("records:\n got %+v\nwant %+v", have, want)
	}
	if r := got[0]; r.Summary != `{"name":"pay","queues":["g1"]}` {
		t.Errorf("create-topic summary %q", r.Summary)
	}
	if r := got[1]; !strings.Contains(r.Refusal, "already exists") {
		t.Errorf("refusal %q", r.Refusal)
	}
	full := auth.HashToken("secret-token-of-carol-0123456789").String()
	if r := got[3]; strings.Contains(r.Summary, full) || !strings.Contains(r.Summary, full[:8]+"...") || !strings.Contains(r.Summary, `"carol"`) {
		t.Errorf("set-principal summary %q: must name the principal and only the start of the hash", r.Summary)
	}
}

// Two nodes applying the same log hold the same records, and a snapshot
// carries them to a third.
func TestAuditSameOnEveryNode(t *testing.T) {
	log := auditLog(t)
	a, b := seeded(t), seeded(t)
	applyLog(a, log)
	applyLog(b, log)
	if !reflect.DeepEqual(a.State().Audit, b.State().Audit) {
		t.Fatal("two nodes applying the same log disagree on the audit trail")
	}
	c := restored(t, a)
	if !reflect.DeepEqual(a.State().Audit, c.State().Audit) || len(c.State().Audit) == 0 {
		t.Fatalf("restored trail differs:\n got %+v\nwant %+v", c.State().Audit, a.State().Audit)
	}
	// A snapshot taken before a change does not see it.
	snap, err := a.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	n := a.AuditLen()
	a.Apply(stamped(t, 200, &CreateTopic{Name: "later", Queues: []string{"g1"}}, "alice", 3000))
	if d := persisted(t, snap); d.AuditLen() != n {
		t.Fatalf("snapshot holds %d records, want %d", d.AuditLen(), n)
	}
}

// An entry without a stamp (an earlier leader's) takes the time it was
// appended at and no principal.
func TestAuditUnstamped(t *testing.T) {
	f := New()
	b, _ := Encode(&AuditNote{Kind: "add-voter", Summary: "{}"})
	l := &raft.Log{Type: raft.LogCommand, Index: 3, Data: b}
	l.AppendedAt = l.AppendedAt.Add(1) // non-zero
	f.Apply(l)
	if r := f.State().Audit; len(r) != 1 || r[0].Principal != "" || r[0].At != l.AppendedAt.UnixMilli() {
		t.Fatalf("%+v", r)
	}
}

// AuditExpire drops the records older than its cutoff, oldest first.
func TestAuditExpire(t *testing.T) {
	f := New()
	for i := range 5 {
		f.Apply(stamped(t, uint64(i+1), &AuditNote{Kind: "add-voter"}, "admin", int64(1000*(i+1))))
	}
	if !f.OldestAuditBefore(2500) || f.OldestAuditBefore(1000) {
		t.Fatal("OldestAuditBefore")
	}
	r := mustApply(t, f, &AuditExpire{Before: 2500}) // itself no record
	if !r.Changed || r.Expired != 2 {
		t.Fatalf("expire: %+v", r)
	}
	recs := f.State().Audit
	if len(recs) != 3 || recs[0].At != 3000 || recs[2].At != 5000 {
		t.Fatalf("left %+v", recs)
	}
	if r := mustApply(t, f, &AuditExpire{Before: 2500}); r.Changed {
		t.Fatal("a second expiry changed something")
	}
	mustApply(t, f, &AuditExpire{Before: 1 << 50})
	if f.AuditLen() != 0 || f.State().Audit != nil {
		t.Fatal("expiring everything left records")
	}
}

// The trail holds at most MaxAuditRecords: the oldest go first, on every
// node alike.
func TestAuditCap(t *testing.T) {
	f := New()
	const extra = 3
	b, _ := Encode(&AuditNote{Kind: "add-voter", Summary: "{}"})
	ext := EncodeStamp(Stamp{Principal: "admin", At: 1})
	for i := range MaxAuditRecords + extra {
		f.Apply(&raft.Log{Type: raft.LogCommand, Index: uint64(i + 1), Data: b, Extensions: ext})
	}
	recs := f.State().Audit
	if len(recs) != MaxAuditRecords || recs[0].Index != extra+1 || recs[len(recs)-1].Index != MaxAuditRecords+extra {
		t.Fatalf("%d records from index %d to %d", len(recs), recs[0].Index, recs[len(recs)-1].Index)
	}
}

// AuditRecords pages newest first, by principal and kind, continuing below
// a cursor, and bounds what it scans.
func TestAuditRecordsPages(t *testing.T) {
	f := New()
	for i := range 10 {
		p := "alice"
		if i%2 == 1 {
			p = "bob"
		}
		f.Apply(stamped(t, uint64(10+i), &AuditNote{Kind: "add-voter"}, p, int64(i)))
	}
	recs, next := f.AuditRecords(AuditQuery{Limit: 3})
	if len(recs) != 3 || recs[0].Index != 19 || recs[2].Index != 17 || next != 17 {
		t.Fatalf("first page %+v next %d", recs, next)
	}
	recs, next = f.AuditRecords(AuditQuery{Limit: 3, Below: next, Principal: "alice"})
	if len(recs) != 3 || recs[0].Index != 16 || recs[2].Index != 12 || next != 12 {
		t.Fatalf("second page %+v next %d", recs, next)
	}
	recs, next = f.AuditRecords(AuditQuery{Limit: 3, Below: next, Principal: "alice"})
	if len(recs) != 1 || recs[0].Index != 10 || next != 0 {
		t.Fatalf("last page %+v next %d", recs, next)
	}
	if recs, _ := f.AuditRecords(AuditQuery{Limit: 5, Kind: "promote"}); len(recs) != 0 {
		t.Fatalf("kind filter: %+v", recs)
	}
	recs, next = f.AuditRecords(AuditQuery{Limit: 5, Principal: "nobody", Scan: 4})
	if len(recs) != 0 || next != 16 {
		t.Fatalf("scan bound: %+v next %d", recs, next)
	}
}

// registry is f's state without its audit trail: what a refused command,
// which leaves a record, must not change.
func registry(f *FSM) *State {
	s := f.State()
	s.Audit = nil
	return s
}
