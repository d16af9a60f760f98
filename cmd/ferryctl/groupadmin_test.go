package main

import (
	"strings"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/metaserver"
	"github.com/ferrymq/ferrymq/routing"
)

// What an operator sees of admission and retirement: a pending group is
// PENDING in `brokers`, with a note saying what to do; add-group admits it;
// retire-group refuses a live group (exit 1, naming --force), plans with
// --dry-run, then moves the queues and prints where each went and from
// which offset; the retired group shows as retired.
func TestBrokerAddAndRetireGroup(t *testing.T) {
	m := testcluster.StartMeta(t, 1, func(c *metaserver.Config) {
		testcluster.SteadyMeta(c)
		c.AdmitGroups = metaserver.AdmitManual
	})
	steady := testcluster.GroupOpts{Edit: testcluster.SteadyBroker}
	testcluster.StartGroup(t, m.Addrs(), "g1", steady)
	g2 := testcluster.StartGroup(t, m.Addrs(), "g2", steady)
	meta := "--meta=" + m.Addr()

	out := mustCtl(t, meta, "brokers")
	if row := rowOf(t, out, "g2 "); !strings.HasSuffix(strings.TrimSpace(row), "PENDING") {
		t.Fatalf("a pending group's row: %q", row)
	}
	if !strings.Contains(out, "g2 pending:") || !strings.Contains(out, "ferryctl broker add-group g2") {
		t.Fatalf("brokers does not say what to do with the pending group:\n%s", out)
	}
	if gs := brokersJSON(t, meta); gs["g1"].Admission != routing.Pending {
		t.Fatalf("brokers --json: %+v", gs["g1"])
	}
	for _, g := range []string{"g1", "g2"} {
		out = mustCtl(t, meta, "broker", "add-group", g)
		if row := rowOf(t, out, g+" "); !strings.Contains(row, "admitted") || !strings.Contains(row, "RW") {
			t.Fatalf("add-group %s:\n%s", g, out)
		}
	}
	if code, _, errOut := ctl(meta, "broker", "add-group", "g9"); code != exitError || !strings.Contains(errOut, "has not registered") {
		t.Fatalf("add-group of an unknown group: exit %d, %s", code, errOut)
	}
	mustCtl(t, meta, "topic", "create", "orders", "--queues", "2")

	code, _, errOut := ctl(meta, "broker", "retire-group", "g2")
	if code != exitError || !strings.Contains(errOut, "GROUP_ACTIVE") || !strings.Contains(errOut, "--force") {
		t.Fatalf("retiring a live group: exit %d, %s", code, errOut)
	}
	out = mustCtl(t, meta, "broker", "retire-group", "g2", "--dry-run")
	if !strings.Contains(out, "dry run: retiring g2 would move 1 queue") || !strings.Contains(rowOf(t, out, "orders"), "g1") {
		t.Fatalf("dry run:\n%s", out)
	}
	if gs := brokersJSON(t, meta); gs["g2"].Admission != routing.Admitted {
		t.Fatal("the dry run retired the group")
	}

	if err := g2.Master.Close(); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 10*time.Second, "retire-group to take g2 once it is silent for a session", func() bool {
		code, out, errOut = ctl(meta, "broker", "retire-group", "g2")
		return code == exitOK
	})
	if !strings.Contains(out, "retired g2: 1 queue moved") {
		t.Fatalf("retire-group:\n%s%s", out, errOut)
	}
	header := rowOf(t, out, "TOPIC")
	if f := strings.Fields(header); strings.Join(f, " ") != "TOPIC QUEUE TO BASE KNOWN-END COMMITTED" {
		t.Fatalf("retire-group header: %q", header)
	}
	if f := strings.Fields(rowOf(t, out, "orders")); f[2] != "g1" || f[5] != "-" {
		t.Fatalf("retire-group row: %v", f)
	}
	out = mustCtl(t, meta, "brokers")
	if row := rowOf(t, out, "g2 "); !strings.HasSuffix(strings.TrimSpace(row), "retired") || strings.Fields(row)[2] != "-" || !strings.Contains(out, "g2 retired:") {
		t.Fatalf("brokers after the retirement:\n%s", out)
	}
	if f := strings.Fields(rowOf(t, mustCtl(t, meta, "routes", "orders"), "orders")); !strings.Contains(strings.Join(f, " "), "g1") {
		t.Fatalf("routes after the retirement: %v", f)
	}
}
