package consumer_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/ferrymq/ferrymq/broker"
	"github.com/ferrymq/ferrymq/consumer"
	"github.com/ferrymq/ferrymq/metaserver"
	"github.com/ferrymq/ferrymq/producer"
	"github.com/ferrymq/ferrymq/routing"
	"github.com/ferrymq/ferrymq/sdk"
)

// Example sends three messages and consumes them as a member of the group
// "billing". It starts a one-node metaserver and one broker in-process so
// it can run; a real application only needs the metaserver addresses.
func Example() {
	metaAddr, stop := startLocalCluster()
	defer stop()
	ctx := context.Background()

	p, err := producer.New(sdk.MetaAddrs(metaAddr))
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	for i := range 3 {
		if _, err := p.Send(ctx, &producer.Message{Topic: "orders", Key: "customer-7", Body: fmt.Appendf(nil, "order %d", i)}); err != nil {
			log.Fatal(err)
		}
	}

	c, err := consumer.New("billing", []string{"orders"}, sdk.MetaAddrs(metaAddr))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close() // commits what was handled and leaves the group at once

	runCtx, cancel := context.WithCancel(ctx)
	handled := 0
	err = c.Run(runCtx, func(ctx context.Context, m *consumer.Message) error {
		fmt.Printf("%s: %s (queue %d, offset %d, key %s)\n", m.Topic, m.Body, m.Queue, m.Offset, m.Key)
		if handled++; handled == 3 {
			cancel()
		}
		return nil // processed: its offset may be committed
	})
	if err != context.Canceled {
		log.Fatal(err)
	}
	// Output:
	// orders: order 0 (queue 0, offset 0, key customer-7)
	// orders: order 1 (queue 0, offset 1, key customer-7)
	// orders: order 2 (queue 0, offset 2, key customer-7)
}

// startLocalCluster starts a metaserver that creates topics with one queue
// and a single-broker group, and returns the metaserver's address (see the
// producer's example).
func startLocalCluster() (string, func()) {
	dir, err := os.MkdirTemp("", "ferrymq-example-")
	if err != nil {
		log.Fatal(err)
	}
	quiet := hclog.NewNullLogger()
	meta, err := metaserver.New(metaserver.Config{ID: "m1", Dir: dir + "/meta", RaftAddr: "127.0.0.1:0", RPCAddr: "127.0.0.1:0",
		AutoCreateTopics: true, DefaultQueues: 1, Logger: quiet})
	if err != nil {
		log.Fatal(err)
	}
	if err := meta.Start([]metaserver.Peer{{ID: "m1", RaftAddr: meta.RaftAddr(), RPCAddr: meta.RPCAddr()}}); err != nil {
		log.Fatal(err)
	}
	b, err := broker.New(broker.Config{ID: "b1", Group: "g1", Role: routing.RoleMaster, Dir: dir + "/broker",
		Addr: "127.0.0.1:0", MetaAddrs: []string{meta.RPCAddr()}, HeartbeatInterval: 100 * time.Millisecond, Logger: quiet})
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
