package e2e

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/broker"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/producer"
	"github.com/ferrymq/ferrymq/sdk"
)

// TestRestartOrderKeepsEpochStarts is issue 22's stuck-read-only sequence
// through real processes. A topic on g1 takes 20 messages; g1's slave is
// paused; its master takes 10 more alone and is killed; the slave, resumed,
// is promoted and takes 3; then the new master is stopped (SIGTERM) and
// started again with its own command line, and after it the old master.
//
// Before epoch starts were fixed, the restart moved epoch 2's start past
// the 3 messages written in it, and the old master then either could not
// cut there (not a record boundary: blocked for good, g1 read-only) or cut
// there and kept its own epoch-1 messages at offsets where the new master
// holds others. Now: epoch 2's start stays where the promotion's new
// master took over, the old master cuts there and hands its 10 messages
// back (stored again, flagged), g1 is writable, both logs are byte
// identical, every member records the registry's epochs, and all 33
// acknowledged messages are stored once.
func TestRestartOrderKeepsEpochStarts(t *testing.T) {
	skipShort(t)
	c := startLocalCluster(t)
	c.waitMembers("g1", "g1-master", "g1-slave", 1, 10*time.Second, "at the start")
	masterArgs, slaveArgs := c.cmdline("g1-master"), c.cmdline("g1-slave")
	c.ctl("topic", "create", "seq", "--queues", "2", "--groups", "g1")

	p, err := producer.New(sdk.MetaAddrs(strings.Split(c.meta, ",")...))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var acked []producer.Result
	send := func(n int, what string) {
		t.Helper()
		for i := range n {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			// Bodies of several sizes: where the old start fell on a record
			// boundary of the old master's log, it did not even complain.
			body := strings.Repeat("x", 40+len(acked)*7%97)
			r, err := p.Send(ctx, &producer.Message{Topic: "seq", Key: fmt.Sprintf("k%d", i%3), Body: []byte(body)})
			cancel()
			if err != nil {
				t.Fatalf("%s: send %d: %v", what, i, err)
			}
			acked = append(acked, r)
		}
	}
	send(20, "both members up")
	c.signal("g1-slave", syscall.SIGSTOP)
	send(10, "the slave paused")
	c.kill9("g1-master")
	c.signal("g1-slave", syscall.SIGCONT)
	g := c.waitMembers("g1", "g1-slave", "", 2, failoverBound, "after kill -9 of g1-master")
	var start int64
	testwait.ForEvery(t, failoverBound, 20*time.Millisecond, "the new master to fix where epoch 2 began", func() bool {
		g, _ = c.group("g1")
		r, ok := g.Record(2)
		start = r.Start
		return ok && r.Fixed
	})
	send(3, "after the promotion")

	// The new master restarts: its log now ends past epoch 2's start.
	c.signal("g1-slave", syscall.SIGTERM)
	pid := c.pid("g1-slave")
	testwait.ForEvery(t, failoverBound, 10*time.Millisecond, "g1-slave to stop", func() bool { return !alive(pid) })
	c.restart("g1-slave", slaveArgs)
	c.waitWritable("g1", failoverBound, "after the new master's restart")
	send(2, "after the new master's restart")
	if g, _ = c.group("g1"); g.History[len(g.History)-1].Start != start {
		t.Fatalf("the new master's restart moved epoch 2's start from %d: history %+v", start, g.History)
	}

	// The old master comes back last.
	c.restart("g1-master", masterArgs)
	waitFollower(t, c, "g1-master", 2)
	c.waitMaster("g1", failoverBound, "after the old master's return")
	if m, _ := c.metrics("g1-master"); m[`ferrymq_broker_role{role="broken"}`] == 1 {
		t.Fatal("the old master is broken")
	}
	rec := waitHandedOver(t, c, "g1-master", "g1-slave")
	send(2, "after the old master's return")
	t.Logf("epoch 2 began at %d and stayed there; the old master cut %v records, the new master appended %v again",
		start, rec["ferrymq_broker_recovered_messages_total"]+rec["ferrymq_broker_recover_duplicates_total"], rec["ferrymq_broker_recovered_messages_total"])

	// Every acknowledged message is stored once.
	stored := map[string]int{}
	for _, q := range readAll(t, c, "seq") {
		for _, m := range q {
			stored[m.id]++
		}
	}
	for _, r := range acked {
		if stored[r.ID] != 1 {
			t.Errorf("acknowledged message %s (queue %d, offset %d) is stored %d times", r.ID, r.Queue, r.QueueOffset, stored[r.ID])
		}
	}
	if g, _ = c.group("g1"); g.State != "RW" {
		t.Fatalf("g1 is %s %s", g.State, g.Reason)
	}
	assertSameLogs(t, c, "g1-slave", "g1-master")
	assertLocalEpochs(t, c, "g1", "g1-master", "g1-slave")
}

// assertLocalEpochs checks that each member of group records the epochs
// the registry has, with the same starts, all fixed.
func assertLocalEpochs(t *testing.T, c *localCluster, group string, members ...string) {
	t.Helper()
	g, ok := c.group(group)
	if !ok {
		t.Fatalf("no group %s", group)
	}
	for _, name := range members {
		local, err := broker.LocalEpochs(c.dataDir(name))
		if err != nil {
			t.Fatal(err)
		}
		if len(local) != len(g.History) {
			t.Fatalf("%s records epochs %+v; the registry %+v", name, local, g.History)
		}
		for i, r := range local {
			if reg := g.History[i]; r.Epoch != reg.Epoch || r.Start != reg.Start || r.Master != reg.Master || !r.Fixed || !reg.Fixed {
				t.Fatalf("%s records epoch %+v; the registry %+v", name, r, reg)
			}
		}
	}
}
