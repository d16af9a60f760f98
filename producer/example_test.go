package producer_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/producer"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/sdk"
)

// Example sends one message synchronously and a few asynchronously. It
// starts a one-node metaserver and one broker in-process so it can run; a
// real application only needs the metaserver addresses.
func Example() {
	metaAddr, stop := testcluster.ForExample()
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

// Example_delayed sends a message for delivery in an hour and cancels it.
func Example_delayed() {
	metaAddr, stop := testcluster.ForExample()
	defer stop()

	p, err := producer.New(sdk.MetaAddrs(metaAddr))
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()

	res, err := p.Send(ctx, &producer.Message{Topic: "reminders", Body: []byte("call back"), DeliverAfter: time.Hour})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("delayed:", res.Delayed)
	st, err := p.Cancel(ctx, res.Handle)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(st.State, "by", st.By)
	// Output:
	// delayed: true
	// cancelled by cancel
}
