package console

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/internal/ops"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/protocol"
)

// The Transactions page: the open transactions of every broker group
// (TXN_LIST: age, messages, the queues each holds back from its first
// offset, prepared), the registry's recent decisions (TXN_DECISIONS), and a
// form that aborts an open transaction as ferryctl txn abort does: the
// registry decides first, then the group's master applies it.
//
// Who may do what: the page needs describe: TXN_LIST alone would let a
// producer ask (the broker shows it the transactions that wrote only
// topics it may send to), but the broker groups to ask are listed by
// ADMIN_GROUPS, which needs describe (ferryctl txn ls has the same rule).
// The decisions need describe too; an abort needs admin, checked before
// anything is asked (the registry checks the session's token again).

// txnsData is what the page shows.
type txnsData struct {
	Open      []openTxn
	Pager     pager
	Filter    string
	Unasked   string
	Decisions []api.TxnDecision
	More      bool   // the registry holds more decisions than shown
	NoDecided string // why the decisions are not shown
	Admin     bool   // the principal may abort
	Outcome   string // the last abort's, from the form
}

// openTxn is an open transaction of a group.
type openTxn struct {
	Group string
	protocol.TxnInfo
	Age time.Duration
}

// maxDecisions bounds the decisions the page shows.
const maxDecisions = 200

func txns(q *query) (any, error) {
	v := q.r.URL.Query()
	d := &txnsData{Filter: v.Get("q"), Admin: q.isAdmin(), Outcome: strings.Join(q.notesOf(), "; ")}
	var producer uint64
	if s := v.Get("producer"); s != "" {
		var err error
		if producer, err = strconv.ParseUint(s, 10, 64); err != nil {
			return nil, bad("producer must be a producer id, a whole number")
		}
	}
	release, err := q.slot()
	if err != nil {
		return nil, err
	}
	defer release()
	lists, unasked, err := ops.TxnLists(q.ctx, q.meta(), q.dial(), "", protocol.TxnListRequest{Producer: producer})
	if err != nil {
		return nil, err
	}
	if unasked != nil {
		d.Unasked = unasked.Error()
	}
	now := time.Now()
	var open []openTxn
	for _, l := range lists {
		for _, t := range l.Open {
			open = append(open, openTxn{Group: l.Group, TxnInfo: t, Age: now.Sub(time.UnixMilli(t.Began)).Round(time.Millisecond)})
		}
	}
	sort.SliceStable(open, func(i, j int) bool { return open[i].Began < open[j].Began })
	if d.Open, d.Pager, err = pageOf(q, open, func(t openTxn) string { return t.Group + " " + t.ID }); err != nil {
		return nil, err
	}
	if err := q.allow(protocol.CodeTxnDecisions, auth.Target{}); err != nil {
		d.NoDecided = "the registry's decisions are shown to who may describe the cluster"
		return d, nil
	}
	dec, err := q.meta().TxnDecisions(q.ctx, api.TxnDecisionsRequest{Producer: producer, Limit: maxDecisions})
	if err != nil {
		return nil, err
	}
	d.Decisions, d.More = dec.Records, dec.More
	slices.Reverse(d.Decisions) // newest first
	return d, nil
}

// isAdmin reports whether the session's principal is admin (everyone with
// authorization off).
func (q *query) isAdmin() bool { return !q.c.authOn() || q.s.principal.IsAdmin() }

// abortTxn aborts the form's transaction (txn: PRODUCER.EPOCH.NUMBER) in
// its group (admin), and shows the outcome.
func abortTxn(q *query) (string, error) {
	if !q.isAdmin() {
		return "", &protocol.Error{Status: protocol.StatusNotAuthorized,
			Message: fmt.Sprintf("principal %q lacks admin (aborting a transaction)", q.s.principal.Name)}
	}
	raw, group := q.r.PostFormValue("txn"), q.r.PostFormValue("group")
	if len(raw) > 64 {
		return "", bad("txn is longer than 64 characters")
	}
	id, err := protocol.ParseTxnID(raw)
	if err != nil {
		return "", bad("txn %q: want PRODUCER.EPOCH.NUMBER", protocol.Clip(raw))
	}
	if len(group) > maxParamLen || protocol.ValidateName("group", group, 255, protocol.TopicNameChars) != nil {
		return "", bad("group %q is not a broker group name", protocol.Clip(group))
	}
	release, err := q.slot()
	if err != nil {
		return "", err
	}
	defer release()
	outcome, err := ops.AbortTxn(q.ctx, q.meta(), q.dial(), id, group)
	if errors.Is(err, protocol.ErrNotFound) {
		return "", bad("no broker group %s", protocol.Clip(group))
	}
	if err != nil {
		return "", err
	}
	q.c.cfg.Logger.Info("console aborted a transaction", "principal", q.s.principal.Name, "txn", id.String(), "group", group, "outcome", outcome)
	return Prefix + "txns?" + q.noted(fmt.Sprintf("%s in %s: %s", id, group, outcome)).Encode(), nil
}
