package protocol

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
)

// TxnTopic is the internal topic of a broker group's transaction marks:
// its queue 0 in every group's log holds, in log order, an open mark for
// each queue a transaction writes (before the transaction's first record
// there) and one commit or abort mark per decided transaction (after all
// its records). Marks take no offset in the queues they speak of.
const TxnTopic = "%TXN%"

// TxnID names one transaction: its producer's id and epoch and its number,
// which a producer instance counts up from 1.
type TxnID struct {
	Producer uint64
	Epoch    uint16
	Number   uint64
}

// IsZero reports whether id names no transaction.
func (id TxnID) IsZero() bool { return id.Number == 0 }

// Before reports whether id is an older transaction of the same producer
// than o: an earlier epoch, or the same epoch and a lower number.
func (id TxnID) Before(o TxnID) bool {
	return id.Epoch < o.Epoch || id.Epoch == o.Epoch && id.Number < o.Number
}

// String is "PRODUCER.EPOCH.NUMBER", as ferryctl prints and parses it.
func (id TxnID) String() string {
	return strconv.FormatUint(id.Producer, 10) + "." + strconv.FormatUint(uint64(id.Epoch), 10) + "." + strconv.FormatUint(id.Number, 10)
}

// ParseTxnID parses "PRODUCER.EPOCH.NUMBER".
func ParseTxnID(s string) (TxnID, error) {
	bad := fmt.Errorf("protocol: transaction %q: want PRODUCER.EPOCH.NUMBER (numbers, the first and last not 0)", s)
	parts := strings.Split(s, ".")
	if len(parts) != 3 {
		return TxnID{}, bad
	}
	var n [3]uint64
	for i, p := range parts {
		v, err := strconv.ParseUint(p, 10, 64)
		if err != nil {
			return TxnID{}, bad
		}
		n[i] = v
	}
	id := TxnID{Producer: n[0], Epoch: uint16(n[1]), Number: n[2]}
	if n[1] > 1<<16-1 || id.Producer == 0 || id.Number == 0 || id.String() != s {
		return TxnID{}, bad
	}
	return id, nil
}

// TxnOf is the transaction m belongs to (the zero TxnID: none).
func TxnOf(m *Message) TxnID {
	if m.Txn == 0 {
		return TxnID{}
	}
	return TxnID{Producer: m.Producer.ID, Epoch: m.Producer.Epoch, Number: m.Txn}
}

// TxnKind says what a transaction mark records.
type TxnKind uint8

const (
	// TxnOpen: the transaction writes the queue named, from queue offset
	// First at the lowest (the queue's end when the mark was made).
	TxnOpen TxnKind = 1
	// TxnCommit: the transaction's records are delivered.
	TxnCommit TxnKind = 2
	// TxnAbort: the transaction's records are never delivered.
	TxnAbort TxnKind = 3
	// TxnPrepared: every record the producer was told this group stored
	// is in the log before the mark (a transaction on several groups is
	// prepared on each before the registry decides it). It decides
	// nothing.
	TxnPrepared TxnKind = 4
)

func (k TxnKind) String() string {
	switch k {
	case TxnOpen:
		return "open"
	case TxnCommit:
		return "commit"
	case TxnAbort:
		return "abort"
	case TxnPrepared:
		return "prepared"
	}
	return "txn-kind(" + strconv.Itoa(int(k)) + ")"
}

// Who decided a transaction, in its commit or abort mark.
const (
	TxnByProducer = "producer" // the producer's CommitTxn or AbortTxn
	TxnByChecker  = "checker"  // the producer identity's checker, after the instance that began it was gone
	TxnByTimeout  = "timeout"  // open longer than its timeout: aborted by the master
	TxnByChecks   = "checks"   // the checker answered unknown too many times: aborted
	TxnByAdmin    = "admin"    // an operator's TXN_END
)

// TxnMark is the body of a record of TxnTopic.
//
// Encoding: kind u8, producer u64, epoch u16, number u64, time i64 (unix
// milliseconds: when the transaction began, for an open mark; when it was
// decided, for the others), then for an open mark the queue (u16 length +
// topic, u32 queue, i64 first), for a decision who decided it (u8 length
// + bytes).
type TxnMark struct {
	Kind  TxnKind
	ID    TxnID
	Time  int64
	Topic string // open: the queue's topic (a delayed message's: its internal topic)
	Queue uint32
	First int64  // open: the queue's end when the mark was made, at or below the transaction's first record there
	By    string // a decision: who made it (TxnByProducer, ...)
}

// AppendTxnMark appends m's encoding.
func AppendTxnMark(dst []byte, m *TxnMark) []byte {
	dst = append(dst, byte(m.Kind))
	dst = binary.BigEndian.AppendUint64(dst, m.ID.Producer)
	dst = binary.BigEndian.AppendUint16(dst, m.ID.Epoch)
	dst = binary.BigEndian.AppendUint64(dst, m.ID.Number)
	dst = binary.BigEndian.AppendUint64(dst, uint64(m.Time))
	if m.Kind == TxnOpen {
		dst = appendStr16(dst, clip16(m.Topic))
		dst = binary.BigEndian.AppendUint32(dst, m.Queue)
		return binary.BigEndian.AppendUint64(dst, uint64(m.First))
	}
	by := m.By
	if len(by) > 255 {
		by = by[:255]
	}
	dst = append(dst, byte(len(by)))
	return append(dst, by...)
}

// DecodeTxnMark decodes one mark's body.
func DecodeTxnMark(b []byte) (TxnMark, error) {
	r := reader{b: b}
	var m TxnMark
	m.Kind = TxnKind(r.u8("mark kind"))
	m.ID.Producer = r.u64("producer id")
	m.ID.Epoch = r.u16("producer epoch")
	m.ID.Number = r.u64("transaction number")
	m.Time = r.i64("time")
	switch m.Kind {
	case TxnOpen:
		m.Topic = r.str16("topic")
		m.Queue = r.u32("queue")
		m.First = r.i64("first offset")
	case TxnCommit, TxnAbort, TxnPrepared:
		m.By = string(r.span(int(r.u8("decided by")), "decided by"))
	default:
		r.fail(fmt.Sprintf("unknown mark kind %d", m.Kind))
	}
	if r.err == nil && (m.ID.Producer == 0 || m.ID.Number == 0) {
		r.fail("a mark of no transaction")
	}
	if err := r.done("transaction mark"); err != nil {
		return TxnMark{}, err
	}
	return m, nil
}

// TxnMarkMessage is the record a broker appends to TxnTopic for mark m.
func TxnMarkMessage(m *TxnMark) Message {
	return Message{
		ID:        "txn/" + m.ID.String() + "/" + m.Kind.String(),
		Topic:     TxnTopic,
		Timestamp: m.Time,
		Body:      AppendTxnMark(nil, m),
	}
}

// TxnEndRequest is the body of TXN_END (JSON): decide a transaction of the
// broker's group. Commit false aborts. By says who decides (the producer
// or its checker; an operator's is always TxnByAdmin). The answer comes
// once the group's sync set holds the decision mark: its members then hold
// every record of the transaction too, which precede the mark in the log.
type TxnEndRequest struct {
	Producer uint64 `json:"producer"`
	Epoch    uint16 `json:"epoch"`
	Number   uint64 `json:"number"`
	Commit   bool   `json:"commit"`
	By       string `json:"by,omitempty"`
	// Seqs, for a commit by its producer, are the last sequence the
	// producer was told was stored in each queue it wrote here: a commit
	// is refused (TXN_INCOMPLETE) unless the group's log holds them all
	// (a failover can lose what the old master acknowledged).
	Seqs []TxnSeq `json:"seqs,omitempty"`
	// Prepare decides nothing: it answers once the group's log holds Seqs
	// and its sync set holds them, so that no failover can lose them; the
	// registry then decides (a transaction on several groups).
	Prepare bool `json:"prepare,omitempty"`
}

// TxnSeq is the last sequence of a producer in a queue.
type TxnSeq struct {
	Topic string `json:"topic"`
	Queue uint32 `json:"queue"`
	Seq   int64  `json:"seq"`
}

// ID is the transaction r names.
func (r TxnEndRequest) ID() TxnID {
	return TxnID{Producer: r.Producer, Epoch: r.Epoch, Number: r.Number}
}

// TxnEndReply answers TXN_END: the transaction's decision (the one asked
// for, or the one made before: Committed says which), and how many of this
// group's queues it covered: 0 when the transaction wrote nothing here
// (nothing is recorded), -1 when it was decided before.
type TxnEndReply struct {
	// Prepared answers a Prepare: the group holds the transaction's
	// messages as the sync set does (false: it was decided before, as
	// Committed says).
	Prepared  bool   `json:"prepared,omitempty"`
	Committed bool   `json:"committed"`
	By        string `json:"by"`
	Queues    int    `json:"queues"`
}

// TxnListRequest is the body of TXN_LIST (JSON): the open transactions of
// a broker group, of one producer (0: all; that needs describe).
type TxnListRequest struct {
	Producer uint64 `json:"producer,omitempty"`
}

// TxnInfo is one open transaction of a broker group.
type TxnInfo struct {
	ID       string     `json:"id"` // TxnID.String
	Producer uint64     `json:"producer"`
	Epoch    uint16     `json:"epoch"`
	Number   uint64     `json:"number"`
	Began    int64      `json:"began"`    // unix milliseconds, the master's clock
	Messages int64      `json:"messages"` // stored so far (the master's count; 0 when rebuilt from the log)
	Queues   []TxnQueue `json:"queues"`
	Prepared bool       `json:"prepared,omitempty"` // prepared for the registry's decision (on several groups)
}

// TxnQueue is a queue an open transaction holds back: readers of committed
// messages read it up to First.
type TxnQueue struct {
	Topic string `json:"topic"`
	Queue uint32 `json:"queue"`
	First int64  `json:"first"`
}

// TxnList answers TXN_LIST: the group's open transactions, oldest first,
// and its recent decisions that were not the producer's own (timeouts,
// exhausted checks, operators), newest first.
type TxnList struct {
	Group   string       `json:"group"`
	Open    []TxnInfo    `json:"open"`
	Decided []TxnDecided `json:"decided,omitempty"`
}

// TxnDecided is a transaction decided by someone other than its producer.
type TxnDecided struct {
	ID        string `json:"id"`
	Committed bool   `json:"committed"`
	By        string `json:"by"`
	At        int64  `json:"at"` // unix milliseconds
}
