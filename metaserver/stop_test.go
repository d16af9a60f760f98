package metaserver_test

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/ferrymq/ferrymq/auth"
	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/internal/testlog"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/metaserver"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/routing"
)

// TestCleanStopLogsNoError: a node closed while its peers run (a follower,
// then the leader) logs nothing at ERROR from the moment its Close starts
// until every goroutine of its raft transport has ended. Raft's transport
// logs a connection closed under a reader, or a request read but no longer
// taken by raft, at ERROR: a clean stop must make neither.
//
// With a cluster token the raft connections open with the raft-secret
// handshake: a clean stop must log no error there either.
func TestCleanStopLogsNoError(t *testing.T) {
	for _, keyed := range []bool{false, true} {
		for _, which := range []string{"follower", "leader"} {
			name := which
			if keyed {
				name = "raft-secret-" + which
			}
			t.Run(name, func(t *testing.T) { cleanStop(t, which, keyed) })
		}
	}
}

func cleanStop(t *testing.T, which string, keyed bool) {
	tok := ""
	if keyed {
		tok = auth.NewToken()
	}
	logs := map[string]*testlog.Capture{}
	m := testcluster.StartMeta(t, 3, func(c *metaserver.Config) {
		logs[c.ID] = testlog.NewCapture(c.ID, hclog.Info)
		c.Logger = logs[c.ID]
		c.ClusterToken = tok
	})
	leader, _ := m.Leader()
	i := leader
	if which == "follower" {
		i = (leader + 1) % 3
	}
	id := m.Cfgs[i].ID
	cl, err := client.New(client.Config{Addrs: m.Addrs(), CallTimeout: 10 * time.Second, Token: tok})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	// Raft traffic in both directions: the leader's heartbeats and
	// appends to the followers and their answers.
	heartbeat(t, cl, "g1", routing.RoleMaster, nil)
	if _, err := cl.CreateTopic(context.Background(), api.CreateTopicRequest{Name: "stop", Queues: 1, Groups: []string{"g1"}}); err != nil {
		t.Fatal(err)
	}
	before := len(logs[id].Lines(""))
	if before == 0 {
		t.Fatalf("%s logged nothing while starting: the capture is not its logger", id)
	}
	m.Stop(i)
	// The others stop too, so that every raft transport goroutine of
	// the process ends, those that served the closed node's
	// connections with them.
	m.StopAll()
	testwait.For(t, 10*time.Second, "raft transports' connection goroutines to end", func() bool {
		return !strings.Contains(allStacks(), "raft.(*NetworkTransport).handleConn")
	})
	for _, line := range logs[id].Lines("")[before:] {
		if strings.Contains(line, "[ERROR]") {
			t.Errorf("the %s %s logged while stopping: %s", which, id, line)
		}
	}
}

func allStacks() string {
	buf := make([]byte, 1<<20)
	return string(buf[:runtime.Stack(buf, true)])
}
