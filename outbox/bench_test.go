package outbox

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/sdk"
)

// BenchmarkRelay measures the relay on SQLite and PostgreSQL: b.N rows
// committed (in one transaction, before the clock starts), then relayed
// (sent, each answered, and deleted) to an in-process cluster. rows/s is
// the relay's throughput.
func BenchmarkRelay(b *testing.B) {
	c := startCluster(b)
	for _, bk := range backends {
		for _, batch := range []int{100, 500} {
			b.Run(bk.name+"/batch="+strconv.Itoa(batch), func(b *testing.B) { benchRelay(b, c, bk, batch) })
		}
	}
}

func benchRelay(b *testing.B, c *cluster, bk backend, batch int) {
	db := bk.open(b, bk.dsn(b))
	table := newTable()
	o := c.newOutbox(b, db, bk.dialect, table, BatchSize(batch), LeaseTTL(10*time.Second))
	ctx := context.Background()
	if err := o.EnsureTable(ctx); err != nil {
		b.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		b.Fatal(err)
	}
	body := make([]byte, 256)
	for i := range b.N {
		m := &Message{Topic: c.topic, Body: body}
		if i%2 == 0 {
			m.Key = fmt.Sprintf("customer-%d", i%100)
		}
		if _, err := o.Add(ctx, tx, m); err != nil {
			b.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	start := time.Now()
	if err := o.Start(); err != nil {
		b.Fatal(err)
	}
	fctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := o.Flush(fctx); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "rows/s")
	if n := rowsLeft(b, db, table); n != 0 {
		b.Fatalf("%d rows left", n)
	}
}

// BenchmarkAdd measures Add on SQLite: one message per committed
// transaction (what an application pays on top of its own writes).
func BenchmarkAdd(b *testing.B) {
	db := sqliteBackend.open(b, sqliteBackend.dsn(b))
	o, err := New(db, "relay", Table(newTable()), Client(sdk.MetaAddrs("127.0.0.1:1")))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if err := o.EnsureTable(ctx); err != nil {
		b.Fatal(err)
	}
	body := make([]byte, 256)
	b.ResetTimer()
	for range b.N {
		addCommitted(b, o, db, &Message{Topic: "t", Key: "k", Body: body})
	}
}
