package producer_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/ferrymq/ferrymq/broker"
	"github.com/ferrymq/ferrymq/metaserver"
	"github.com/ferrymq/ferrymq/producer"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
	"github.com/ferrymq/ferrymq/sdk"
)

// Example sends one message synchronously and a few asynchronously. It
// starts a one-node metaserver and one broker in-process so it can run; a
// real application only needs the metaserver addresses.
func Example() {
	metaAddr, stop := startLocalCluster()
	defer stop()

	p, err := producer.New(sdk.MetaAddrs(metaAddr), producer.Linger(5*time.Millisecond))
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()

	// Synchronous: wait for the broker's answer.
	res, err := p.Send(ctx, &producer.Message{Topic: "greetings", Body: []byte("hello"), Reliability: protocol.Normal})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("stored in queue %d at offset %d\n", res.Queue, res.QueueOffset)

	// Asynchronous: one promise per message, then Flush.
	for i := range 3 {
		p.SendAsync(ctx, &producer.Message{Topic: "greetings", Body: []byte(fmt.Sprint("hello ", i))}, func(r producer.Result, err error) {
			if err != nil {
				log.Print(err)
			}
		})
	}
	if err := p.Flush(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("flushed")
	// Output:
	// stored in queue 0 at offset 0
	// flushed
}

// startLocalCluster starts a metaserver that creates topics with one queue
// and a single-broker group, and returns the metaserver's address. It is
// written out here, not taken from internal/testcluster, because a runnable
// example has no testing.TB and shows readers the public API only.
func startLocalCluster() (string, func()) {
	dir, err := os.MkdirTemp("", "ferrymq-example-")
	if err != nil {
		log.Fatal(err)
	}
	meta, err := metaserver.New(metaserver.Config{ID: "m1", Dir: dir + "/meta", RaftAddr: "127.0.0.1:0", RPCAddr: "127.0.0.1:0",
		AutoCreateTopics: true, DefaultQueues: 1, Logger: quiet()})
	if err != nil {
		log.Fatal(err)
	}
	if err := meta.Start([]metaserver.Peer{{ID: "m1", RaftAddr: meta.RaftAddr(), RPCAddr: meta.RPCAddr()}}); err != nil {
		log.Fatal(err)
	}
	b, err := broker.New(broker.Config{ID: "b1", Group: "g1", Role: routing.RoleMaster, Dir: dir + "/broker",
		Addr: "127.0.0.1:0", MetaAddrs: []string{meta.RPCAddr()}, HeartbeatInterval: 100 * time.Millisecond, Logger: quiet()})
	if err != nil {
		log.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); !b.Writable(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			log.Fatal("the example's broker did not become writable in 30 s")
		}
	}
	return meta.RPCAddr(), func() {
		_ = b.Close()
		_ = meta.Close()
		_ = os.RemoveAll(dir)
	}
}

func quiet() hclog.Logger { return hclog.NewNullLogger() }
