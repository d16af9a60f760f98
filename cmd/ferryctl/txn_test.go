package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/ferrymq/ferrymq/producer"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/sdk"
)

// txn ls shows an open transaction with what it holds back; txn abort
// aborts it (and says so again, or that one committed before, exit 1);
// hostile arguments are usage errors.
func TestTxnCommands(t *testing.T) {
	addr := startCluster(t)
	meta := "--meta=" + addr
	mustCtl(t, meta, "topic", "create", "tx", "--queues", "1")
	for _, g := range []string{"g1", "g2"} { // a commit waits for the sync set, as HIGH does: no slave here
		mustCtl(t, meta, "broker", "set-group", g, "--min-insync", "1")
	}
	p, err := producer.New(sdk.MetaAddrs(addr), producer.Identity("ctl-txn"), producer.Linger(0))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	open, err := p.BeginTxn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r, err := open.Send(ctx, &producer.Message{Topic: "tx", Body: []byte("held")})
	if err != nil {
		t.Fatal(err)
	}

	var lists []protocol.TxnList
	if err := json.Unmarshal([]byte(mustCtl(t, meta, "txn", "ls", "--json")), &lists); err != nil {
		t.Fatal(err)
	}
	var found []protocol.TxnInfo
	for _, l := range lists {
		found = append(found, l.Open...)
	}
	if len(found) != 1 || found[0].ID != open.ID().String() || found[0].Queues[0] != (protocol.TxnQueue{Topic: "tx", Queue: 0, First: r.QueueOffset}) {
		t.Fatalf("txn ls: %+v, want %s holding tx/0@%d", found, open.ID(), r.QueueOffset)
	}
	out := mustCtl(t, meta, "txn", "ls", "--group", r.Group)
	if !strings.Contains(out, open.ID().String()) || !strings.Contains(out, "HOLDS-BACK") || !strings.Contains(out, "tx/0@") {
		t.Fatalf("txn ls table:\n%s", out)
	}

	out = mustCtl(t, meta, "txn", "abort", open.ID().String(), "--group", r.Group)
	if !strings.Contains(out, "aborted") {
		t.Fatalf("txn abort:\n%s", out)
	}
	if out := mustCtl(t, meta, "txn", "abort", open.ID().String(), "--group", r.Group); !strings.Contains(out, "aborted-before") {
		t.Fatalf("a second abort:\n%s", out)
	}
	out = mustCtl(t, meta, "txn", "ls", "--group", r.Group)
	if strings.Contains(out, "tx/0@") || !strings.Contains(out, "admin") {
		t.Fatalf("txn ls after the abort (want it decided by admin, not open):\n%s", out)
	}
	if err := open.Commit(ctx); err == nil {
		t.Fatal("a commit after an operator's abort succeeded")
	}

	done, err := p.BeginTxn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r, err = done.Send(ctx, &producer.Message{Topic: "tx", Body: []byte("kept")})
	if err != nil {
		t.Fatal(err)
	}
	if err := done.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := ctl(meta, "txn", "abort", done.ID().String(), "--group", r.Group); code != exitError || !strings.Contains(out, "committed-before") || !strings.Contains(errOut, "committed before") {
		t.Fatalf("abort of a committed transaction: exit %d, %q, %q", code, out, errOut)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"txn", "abort", "1.2", "--group", "g1"}, "want PRODUCER.EPOCH.NUMBER"},
		{[]string{"txn", "abort", "0.1.1", "--group", "g1"}, "want PRODUCER.EPOCH.NUMBER"},
		{[]string{"txn", "abort", "1.1.1"}, `"group" not set`},
		{[]string{"txn", "abort", "1.1.1", "--group", "a b"}, "broker group name"},
		{[]string{"txn", "ls", "--producer", "-1"}, "--producer"},
		{[]string{"txn", "ls", "x"}, "unknown command"},
	} {
		code, _, errOut := ctl(append([]string{"--meta", nowhere, "--timeout", "1s"}, tc.args...)...)
		if code != exitUsage || !strings.Contains(errOut, tc.want) {
			t.Errorf("ferryctl %q: exit %d, stderr %q; want exit %d saying %q", tc.args, code, errOut, exitUsage, tc.want)
		}
	}
}
