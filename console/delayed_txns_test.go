package console

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/producer"
	"github.com/ferrymq/ferrymq/sdk"
)

// The Delayed page as each permission kind, and a cancel through its form:
// the lists to who may describe, a handle's state to who may describe or
// produce its topic, the cancel form and the cancel to who may produce it.
func TestDelayedPage(t *testing.T) {
	e := startEnv(t, envOpts{auth: true})
	e.topic(t, "orders")
	rs := e.send(t, &producer.Message{Topic: "orders", Body: []byte("later"), DeliverAfter: time.Hour})
	h := rs[0].Handle.String()
	state := Prefix + "delayed?handle=" + url.QueryEscape(h)
	for _, c := range []struct {
		k          kind
		page, look int
		lists      bool
		cancelForm bool
		cancel     int
	}{
		{kind{"viewer", []string{"describe"}}, http.StatusOK, http.StatusOK, true, false, http.StatusForbidden},
		{kind{"viewer-app", []string{"describe", "produce:orders"}}, http.StatusOK, http.StatusOK, true, true, -1},
		{kind{"other-app", []string{"describe", "produce:payments"}}, http.StatusOK, http.StatusOK, true, false, http.StatusForbidden},
		{kind{"reader", []string{"consume:orders:*"}}, http.StatusForbidden, http.StatusForbidden, false, false, http.StatusForbidden},
		{kind{"", nil}, http.StatusSeeOther, http.StatusSeeOther, false, false, http.StatusSeeOther},
	} {
		t.Run(c.k.name, func(t *testing.T) {
			b := e.browserAs(t, c.k)
			a := b.wantStatus(Prefix+"delayed", c.page)
			if got := strings.Contains(a.body, `id="delayed-groups"`) && strings.Contains(a.body, "topic orders"); got != c.lists {
				t.Fatalf("the lists shown %v, want %v:\n%.3000s", got, c.lists, a.body)
			}
			a = b.wantStatus(state, c.look)
			if got := strings.Contains(a.body, `id="cancel"`); got != c.cancelForm {
				t.Fatalf("the cancel form shown %v, want %v", got, c.cancelForm)
			}
			if c.cancel < 0 {
				return // the cancel is the next test's
			}
			if b.csrf == "" {
				b.get(Prefix)
			}
			if a := b.post(Prefix+"delayed", url.Values{"handle": {h}}); a.status != c.cancel {
				t.Fatalf("cancel: status %d, want %d:\n%.2000s", a.status, c.cancel, a.body)
			}
		})
	}
	b := e.browserAs(t, kind{"admin", nil})
	if body := b.must(state); !strings.Contains(body, ">pending<") {
		t.Fatalf("the message is not pending after refused cancels:\n%.3000s", body)
	}
	a := b.post(Prefix+"delayed", url.Values{"handle": {h}})
	if a.status != http.StatusSeeOther {
		t.Fatalf("cancel: status %d, want 303:\n%.2000s", a.status, a.body)
	}
	body := b.must(a.location)
	if !strings.Contains(body, `id="outcome">cancelled<`) || !strings.Contains(body, ">cancelled<") || strings.Contains(body, `id="cancel"`) {
		t.Fatalf("after the cancel, the page does not show it cancelled:\n%.3000s", body)
	}
}

// Hostile input in the Delayed page's parameters and form.
func TestDelayedHostile(t *testing.T) {
	e := startEnv(t, envOpts{auth: true, edit: unlimited})
	b := e.browserAs(t, kind{"admin", nil})
	b.must(Prefix + "delayed")
	for _, param := range []string{"handle", "bucket", "limit", "topic", "q", "page", "size", "outcome"} {
		for _, v := range hostileValues {
			noRawMarkup(t, "GET "+param+"="+v, b.get(Prefix+"delayed?"+url.Values{param: {v}}.Encode()))
		}
	}
	for _, v := range append(hostileValues, "g1@5/1", "nosuch@0/1", "g1@-1/5") {
		a := b.post(Prefix+"delayed", url.Values{"handle": {v}})
		noRawMarkup(t, "POST handle="+v, a)
		if a.status != http.StatusBadRequest {
			t.Fatalf("POST handle=%q: status %d, want 400:\n%.1000s", v, a.status, a.body)
		}
	}
}

// The Transactions page as each permission kind: open transactions and
// the decisions to who may describe (a producer cannot list the groups); the abort form and the abort to admin only; an abort decides
// the transaction aborted, and the page shows the registry's decision.
func TestTxnsPage(t *testing.T) {
	e := startEnv(t, envOpts{auth: true})
	e.topic(t, "orders")
	p, err := producer.New(sdk.MetaAddrs(e.Meta.Addrs()...), sdk.Token(e.adminTok), producer.Identity("console-txn"), producer.Linger(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	ctx := context.Background()
	txn, err := p.BeginTxn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := txn.Send(ctx, &producer.Message{Topic: "orders", Body: []byte("in-txn")}); err != nil {
		t.Fatal(err)
	}
	id := txn.ID().String()
	for _, c := range []struct {
		k               kind
		page            int
		listed, decided bool
		abortForm       bool
	}{
		{kind{"viewer", []string{"describe"}}, http.StatusOK, true, true, false},
		{kind{"app", []string{"produce:orders"}}, http.StatusForbidden, false, false, false},
		{kind{"viewer-app", []string{"describe", "produce:orders"}}, http.StatusOK, true, true, false},
		{kind{"reader", []string{"consume:orders:*"}}, http.StatusForbidden, false, false, false},
		{kind{"", nil}, http.StatusSeeOther, false, false, false},
		{kind{"admin", nil}, http.StatusOK, true, true, true},
	} {
		t.Run(c.k.name, func(t *testing.T) {
			b := e.browserAs(t, c.k)
			a := b.wantStatus(Prefix+"txns", c.page)
			if got := strings.Contains(a.body, ">"+id+"<"); got != c.listed {
				t.Fatalf("the open transaction listed %v, want %v:\n%.3000s", got, c.listed, a.body)
			}
			if got := strings.Contains(a.body, `id="decisions"`); got != c.decided {
				t.Fatalf("the decisions shown %v, want %v", got, c.decided)
			}
			if got := strings.Contains(a.body, `name="txn" value="`+id+`"`); got != c.abortForm {
				t.Fatalf("the abort form shown %v, want %v", got, c.abortForm)
			}
			if c.k.name == "admin" || c.k.name == "" {
				return
			}
			if b.csrf == "" {
				b.get(Prefix)
			}
			if a := b.post(Prefix+"txns", url.Values{"txn": {id}, "group": {"g1"}}); a.status != http.StatusForbidden {
				t.Fatalf("abort without admin: status %d, want 403", a.status)
			}
		})
	}
	b := e.browserAs(t, kind{"admin", nil})
	b.must(Prefix + "txns")
	a := b.post(Prefix+"txns", url.Values{"txn": {id}, "group": {"g1"}})
	if a.status != http.StatusSeeOther {
		t.Fatalf("abort: status %d, want 303:\n%.2000s", a.status, a.body)
	}
	body := b.must(a.location)
	if !strings.Contains(body, `id="outcome">`+id+` in g1: aborted<`) || strings.Contains(body, `value="`+id+`"`) ||
		!strings.Contains(body, "<td>aborted</td><td>admin</td>") {
		t.Fatalf("after the abort, the page does not show it aborted by admin:\n%.4000s", body)
	}
}

// Hostile input in the Transactions page's parameters and form.
func TestTxnsHostile(t *testing.T) {
	e := startEnv(t, envOpts{auth: true, edit: unlimited})
	b := e.browserAs(t, kind{"admin", nil})
	b.must(Prefix + "txns")
	for _, param := range []string{"producer", "q", "page", "size", "outcome"} {
		for _, v := range hostileValues {
			noRawMarkup(t, "GET "+param+"="+v, b.get(Prefix+"txns?"+url.Values{param: {v}}.Encode()))
		}
	}
	for _, field := range []string{"txn", "group"} {
		for _, v := range hostileValues {
			f := url.Values{"txn": {"1.1.1"}, "group": {"g1"}}
			f.Set(field, v)
			a := b.post(Prefix+"txns", f)
			noRawMarkup(t, "POST "+field+"="+v, a)
			if a.status != http.StatusBadRequest {
				t.Fatalf("POST %s=%q: status %d, want 400:\n%.1000s", field, v, a.status, a.body)
			}
		}
	}
	if a := b.post(Prefix+"txns", url.Values{"txn": {"1.1.1"}, "group": {"nosuch"}}); a.status != http.StatusBadRequest {
		t.Fatalf("an unknown group: status %d, want 400", a.status)
	}
}
