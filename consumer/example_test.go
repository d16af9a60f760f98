package consumer_test

import (
	"context"
	"fmt"
	"log"

	"github.com/ferrymq/ferrymq/consumer"
	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/producer"
	"github.com/ferrymq/ferrymq/sdk"
)

// Example sends three messages and consumes them as a member of the group
// "billing". It starts a one-node metaserver and one broker in-process so
// it can run; a real application only needs the metaserver addresses.
func Example() {
	metaAddr, stop := testcluster.ForExample()
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
