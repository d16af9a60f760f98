package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sync/atomic"
	"time"

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

// ExampleRetryAfter: a handler chooses when its message comes back; other
// failures wait the retry schedule's steps.
func ExampleRetryAfter() {
	c, err := consumer.New("billing", []string{"orders"}, sdk.MetaAddrs("10.0.0.1:7400"),
		consumer.RetrySchedule(time.Second, 5*time.Second, 30*time.Second, 5*time.Minute))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	err = c.Run(context.Background(), func(ctx context.Context, m *consumer.Message) error {
		err := bill(ctx, m.Body)
		var busy *rateLimited
		if errors.As(err, &busy) {
			return consumer.RetryAfter(busy.wait, err) // the bank said when
		}
		return err // nil: processed; otherwise 1 s, 5 s, 30 s, then every 5 min
	})
	log.Print(err)
}

type rateLimited struct{ wait time.Duration }

func (r *rateLimited) Error() string { return "rate limited" }

func bill(ctx context.Context, body []byte) error { return nil }

// ExampleNonBlockingRetries: a failed message waits for its retry in the
// group's retry topic, so the messages after it in its queue are not held
// back; it comes back as the original, after them.
func ExampleNonBlockingRetries() {
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

	c, err := consumer.New("billing", []string{"orders"}, sdk.MetaAddrs(metaAddr), consumer.NonBlockingRetries())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	runCtx, cancel := context.WithCancel(ctx)
	var handled atomic.Int32 // the retry topic's queue is handled concurrently with the others
	err = c.Run(runCtx, func(ctx context.Context, m *consumer.Message) error {
		fmt.Printf("%s: %s (offset %d, delivery %d)\n", m.Topic, m.Body, m.Offset, m.Deliveries)
		if string(m.Body) == "order 0" && m.Deliveries == 1 {
			return consumer.RetryAfter(200*time.Millisecond, errors.New("the bank is busy"))
		}
		if handled.Add(1) == 3 {
			cancel()
		}
		return nil
	})
	if err != context.Canceled {
		log.Fatal(err)
	}
	// Output:
	// orders: order 0 (offset 0, delivery 1)
	// orders: order 1 (offset 1, delivery 1)
	// orders: order 2 (offset 2, delivery 1)
	// orders: order 0 (offset 0, delivery 2)
}

// ExampleConsumer_TxnOffsets: consume-transform-produce exactly once. Each
// batch's outputs and its inputs' offsets commit in one transaction: after
// a crash, an input is either transformed and past the group's offset, or
// neither. (Compiled, not run: it needs a cluster.)
func ExampleConsumer_TxnOffsets() {
	ctx := context.Background()
	meta := sdk.MetaAddrs("10.0.0.1:7101")
	p, err := producer.New(meta, producer.Identity("enricher")) // a new instance fences a dead one
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	c, err := consumer.New("enricher", []string{"orders"}, meta, consumer.ManualCommit())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	for {
		batch, err := c.Poll(ctx)
		if err != nil {
			log.Fatal(err)
		}
		offsets, err := c.TxnOffsets(batch...)
		if errors.Is(err, consumer.ErrQueueLost) {
			continue // a rebalance moved a queue: its new owner transforms it
		} else if err != nil {
			log.Fatal(err)
		}
		txn, err := p.BeginTxn(ctx)
		if err != nil {
			log.Fatal(err)
		}
		for _, m := range batch {
			txn.SendAsync(ctx, &producer.Message{Topic: "enriched", Key: m.Key, Body: m.Body}, func(producer.Result, error) {})
		}
		txn.CommitOffsets(offsets)
		switch err := txn.Commit(ctx); {
		case err == nil:
			c.TxnCommitted(offsets)
		case errors.Is(err, producer.ErrTxnAborted):
			c.TxnAborted(offsets) // Poll hands the batch out again
		default:
			log.Fatal(err) // unknown outcome: a real loop calls Commit again
		}
	}
}
