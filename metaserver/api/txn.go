package api

// The registry's transaction decisions. A transaction whose messages are
// on more than one broker group, or that carries a consumer group's
// offsets, is decided by the registry with one Raft write (TXN_DECIDE):
// the first decision recorded wins, and every later TXN_DECIDE of the
// same transaction, whatever it asks, answers that decision. Whoever
// decided then tells each group's master (TXN_END) and reports the groups
// that applied it (TXN_DONE); the registry forgets the record once every
// group reported, or 7 days after the decision.

// MaxTxnGroups is the most broker groups one transaction decision names.
const MaxTxnGroups = 256

// TxnDecideRequest is the body of TXN_DECIDE: commit (or abort) the
// transaction Producer.Epoch.Number.
type TxnDecideRequest struct {
	Producer uint64 `json:"producer"`
	Epoch    uint16 `json:"epoch"`
	Number   uint64 `json:"number"`
	Commit   bool   `json:"commit"`
	// By says who decides: protocol.TxnByProducer, TxnByChecker,
	// TxnByTimeout, TxnByChecks or TxnByAdmin.
	By string `json:"by"`
	// Groups are the broker groups holding the transaction's messages (1 to
	// MaxTxnGroups, valid names, no repeats).
	Groups []string `json:"groups"`
	// Offsets, only with Commit, are a consumer group member's offsets
	// committed atomically with the decision (consume-transform-produce
	// exactly once): they are checked as COMMIT_OFFSETS checks them, and a
	// refusal records nothing (the producer then aborts).
	Offsets *CommitRequest `json:"offsets,omitempty"`
	// Time is stamped by the leader (unix ms); a client's is ignored.
	Time int64 `json:"time,omitempty"`
}

// TxnDecision is a decision as the registry holds it.
type TxnDecision struct {
	Producer  uint64 `json:"producer"`
	Epoch     uint16 `json:"epoch"`
	Number    uint64 `json:"number"`
	Committed bool   `json:"committed"`
	By        string `json:"by"`
	At        int64  `json:"at"` // unix ms, the leader's clock when it was decided
	// Groups are the broker groups the decision names; Pending those not
	// yet reported done (TXN_DONE).
	Groups  []string `json:"groups"`
	Pending []string `json:"pending"`
	// Offsets says the decision committed a consumer group member's
	// offsets with it. A TXN_DECIDE carrying offsets that is answered a
	// decision made before (by another request) committed none of its
	// own: Offsets false on a commit means the consumer's offsets did not
	// move with it.
	Offsets bool `json:"offsets,omitempty"`
}

// TxnDoneRequest is the body of TXN_DONE: Groups applied the decision of
// the transaction Producer.Epoch.Number. The answer is an empty object.
type TxnDoneRequest struct {
	Producer uint64   `json:"producer"`
	Epoch    uint16   `json:"epoch"`
	Number   uint64   `json:"number"`
	Groups   []string `json:"groups"`
}

// Bounds of TXN_DECISIONS.
const (
	DefaultTxnDecisions = 100
	MaxTxnDecisions     = 1000
)

// TxnDecisionsRequest is the body of TXN_DECISIONS: the decisions held, of
// one producer (0: all), at most Limit (0: DefaultTxnDecisions; at most
// MaxTxnDecisions).
type TxnDecisionsRequest struct {
	Producer uint64 `json:"producer,omitempty"`
	Limit    int    `json:"limit,omitempty"`
}

// TxnDecisions answers TXN_DECISIONS: the records, oldest decision first
// (then by producer, epoch, number); More when the limit left some out.
type TxnDecisions struct {
	Records []TxnDecision `json:"records"`
	More    bool          `json:"more,omitempty"`
}
