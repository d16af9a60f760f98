package api

// MaxAuditPage is the most records one AUDIT_LIST answers.
const MaxAuditPage = 500

// AuditListRequest asks for the registry's audit records, newest first
// (AUDIT_LIST; describe).
type AuditListRequest struct {
	// Principal and Kind, when set, take only the records of that
	// principal (exactly) and of that kind.
	Principal string `json:"principal,omitempty"`
	Kind      string `json:"kind,omitempty"`
	// Below, when not 0, continues a listing: records of a lower Raft
	// index only (the previous answer's Next).
	Below uint64 `json:"below,omitempty"`
	// Limit is the most records answered: 1 to MaxAuditPage (0: 100).
	Limit int `json:"limit,omitempty"`
}

// AuditList is a page of audit records.
type AuditList struct {
	Records []AuditRecord `json:"records"`
	// Next is the Below of the next page; 0 when there is none. A page
	// may hold fewer than Limit records and still have a Next: the server
	// looks at a bounded number of records per request.
	Next uint64 `json:"next,omitempty"`
	// Held is how many records the registry holds in all.
	Held int `json:"held"`
}

// AuditKinds are the kinds of audit records, sorted (the console's filter;
// the metaserver's tests keep it the registry's list).
var AuditKinds = []string{
	"add-queues", "add-voter", "admit-group", "alter-sync-set", "create-topic", "delete-consumer-group",
	"join-slave", "promote", "register-broker", "remove-broker", "remove-group", "remove-member",
	"remove-principal", "remove-slave", "remove-voter", "reset-offsets", "resync", "resync-done",
	"retire-group", "set-group-filter", "set-group-mode", "set-group-policy", "set-member",
	"set-principal", "txn-decide",
}

// AuditRecord is one change made through the registry.
type AuditRecord struct {
	Index     uint64 `json:"index"` // its Raft index
	AtMillis  int64  `json:"at"`    // unix ms, the leader's clock when it proposed it
	Principal string `json:"principal,omitempty"`
	// Via says how the principal acted: "console" when the console acted
	// for a certificate session, "leader ID" for the leader's own work.
	Via     string `json:"via,omitempty"`
	Kind    string `json:"kind"`
	Summary string `json:"summary"` // the command's arguments, JSON, cut at 512 bytes
	Applied bool   `json:"applied"`
	Refusal string `json:"refusal,omitempty"` // why it was refused (Applied false)
}
