package console

import (
	"slices"
	"strconv"
	"unicode/utf8"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
)

// The audit page: the registry's audit trail (AUDIT_LIST), newest first,
// by principal and kind, a page at a time below a cursor (the Raft index
// of the last record shown).

// maxAuditPrincipal is the longest principal filter the page takes.
const maxAuditPrincipal = 200

// auditData is the audit page's.
type auditData struct {
	Principal, Kind string // the filters
	Kinds           []string
	Size            int
	Records         []auditRow
	Held            int    // records the registry holds in all
	Older           string // the link to the next page ("": none)
	Paged           bool   // this is not the first page
}

// auditRow is one record as the page shows it.
type auditRow struct {
	api.AuditRecord
	Who string // the principal, and how it acted
}

func auditPage(q *query) (any, error) {
	v := q.r.URL.Query()
	d := auditData{Principal: v.Get("principal"), Kind: v.Get("kind"), Kinds: api.AuditKinds}
	if len(d.Principal) > maxAuditPrincipal || !utf8.ValidString(d.Principal) {
		return nil, bad("the principal filter is at most %d bytes of text", maxAuditPrincipal)
	}
	if d.Kind != "" && !slices.Contains(api.AuditKinds, d.Kind) {
		return nil, bad("no kind of change is called %q", d.Kind)
	}
	var err error
	if d.Size, err = intParam(v, "size", defaultPageSize, 1, api.MaxAuditPage); err != nil {
		return nil, err
	}
	var below uint64
	if s := v.Get("below"); s != "" {
		if below, err = strconv.ParseUint(s, 10, 64); err != nil || below == 0 {
			return nil, bad("below must be a record's index, a whole number from 1")
		}
		d.Paged = true
	}
	release, err := q.slot()
	if err != nil {
		return nil, err
	}
	defer release()
	l, err := q.meta().AuditList(q.ctx, api.AuditListRequest{Principal: d.Principal, Kind: d.Kind, Below: below, Limit: d.Size})
	if err != nil {
		return nil, err
	}
	d.Held = l.Held
	for _, r := range l.Records {
		who := r.Principal
		if who == "" {
			who = "-"
		}
		if r.Via != "" {
			who += " (" + r.Via + ")"
		}
		d.Records = append(d.Records, auditRow{AuditRecord: r, Who: who})
	}
	if l.Next != 0 {
		d.Older = withParam(q.r.URL, "below", strconv.FormatUint(l.Next, 10))
	}
	return d, nil
}

// actingClient is a certificate session's metaserver client: it calls with
// the servers' cluster token and names the session's principal with the
// proof made from the metaservers' raft secret, whom the metaservers then
// check every request as and stamp its audit records with
// (client.Config.ActAs, ActProof).
func (c *Console) actingClient(principal string) (*client.Client, error) {
	cc := client.Config{Addrs: c.cfg.MetaAddrs, Token: c.cfg.ClusterToken, ActAs: principal,
		ActProof: auth.ActorProof(c.cfg.RaftSecret, principal), CallTimeout: c.cfg.CallTimeout}
	cc.Transport.TLS = c.cfg.TLS
	return client.New(cc)
}
