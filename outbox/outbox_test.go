package outbox

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/producer"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/sdk"
)

// afterSend is the test hook: f is called after a pass's sends answered,
// before their rows are deleted; true stops the relay there as a crash
// would.
func afterSend(f func(sent int) bool) Opt { return optFunc(func(c *config) { c.afterSend = f }) }

// forEachBackend runs f against SQLite and PostgreSQL (skipped when the
// machine has none), on one cluster.
func forEachBackend(t *testing.T, f func(t *testing.T, c *cluster, b backend, dsn string, db *sql.DB)) {
	c := startCluster(t)
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			c.useTopic(t, "orders-"+b.name)
			dsn := b.dsn(t)
			f(t, c, b, dsn, b.open(t, dsn))
		})
	}
}

// What a user relies on: a message added in a committed transaction is
// stored once, one added in a rolled-back transaction never; a message
// keeps its topic, key, tag, properties and body, and carries its outbox
// id; keyed messages are stored in their key's queue in the order added.
func TestCommittedOnceRolledBackNever(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c *cluster, b backend, dsn string, db *sql.DB) {
		table := newTable()
		o := c.newOutbox(t, db, b.dialect, table)
		ctx := context.Background()
		if err := o.EnsureTable(ctx); err != nil {
			t.Fatal(err)
		}
		if err := o.EnsureTable(ctx); err != nil { // again: nothing to do
			t.Fatal(err)
		}
		var committed, rolledBack []string
		for i := range 30 {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			m := &Message{Topic: c.topic, Key: "customer-" + string(rune('a'+i%3)), Tag: "paid",
				Properties: map[string]string{"n": string(rune('0' + i%10))}, Body: []byte{byte(i)}}
			if i == 6 {
				m.ID = "order-6" // the caller's id
			}
			if i%5 == 4 {
				m.Key = "" // unkeyed
			}
			id, err := o.Add(ctx, tx, m)
			if err != nil {
				t.Fatal(err)
			}
			if i%4 == 3 {
				if err := tx.Rollback(); err != nil {
					t.Fatal(err)
				}
				rolledBack = append(rolledBack, id)
				continue
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			committed = append(committed, id)
		}
		if err := o.Start(); err != nil {
			t.Fatal(err)
		}
		o.Notify()
		fctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		if err := o.Flush(fctx); err != nil {
			t.Fatal(err)
		}
		if n := rowsLeft(t, db, table); n != 0 {
			t.Fatalf("%d rows left after Flush", n)
		}
		got := c.counts(t)
		exactlyOnce(t, got, committed)
		for _, id := range rolledBack {
			if got[id] != 0 {
				t.Errorf("rolled-back message %s stored %d times", id, got[id])
			}
		}
		if got["order-6"] != 1 {
			t.Errorf("the caller's id order-6: stored %d times", got["order-6"])
		}
		if s := o.Stats(); s.Sent != int64(len(committed)) || s.Resolved != 0 || s.Failed != 0 {
			t.Errorf("stats %+v, want %d sent", s, len(committed))
		}
		checkStored(t, c)
	})
}

// checkStored checks what the messages of TestCommittedOnceRolledBackNever
// look like in the topic: fields kept, the key's messages in one queue in
// the order added, unkeyed ones keyed by their outbox id.
func checkStored(t *testing.T, c *cluster) {
	t.Helper()
	lastByKey := map[string]int{}
	for _, q := range c.route.Queues {
		tc := testcluster.Dial(t, c.Master(q.Group).Addr())
		for _, sm := range testcluster.PullAll(t, tc, c.topic, q.Queue) {
			m := sm.Message
			props := map[string]string{}
			for _, p := range m.Properties {
				props[p.Key] = p.Value
			}
			i := int(m.Body[0])
			key := props[protocol.KeyProperty]
			if m.Tag != "paid" || props["n"] != string(rune('0'+i%10)) || props[IDProperty] == "" {
				t.Errorf("message %d: tag %q, properties %v", i, m.Tag, props)
			}
			if i%5 == 4 {
				if key != props[IDProperty] {
					t.Errorf("unkeyed message %d: key %q, want its outbox id %q", i, key, props[IDProperty])
				}
				continue
			}
			if want := "customer-" + string(rune('a'+i%3)); key != want {
				t.Errorf("message %d: key %q, want %q", i, key, want)
			}
			if last, ok := lastByKey[key]; ok && last > i {
				t.Errorf("key %s: message %d stored after %d", key, i, last)
			}
			lastByKey[key] = i
		}
	}
}

// A relay that dies after its sends were stored and before it deleted
// their rows leaves them marked attempted; the relay that takes over
// (once the dead one's lease expired) finds each stored by a lookup and
// deletes it without sending it again: every message stored once.
func TestRelayDiesBeforeDelete(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c *cluster, b backend, dsn string, db *sql.DB) {
		table := newTable()
		crashed := make(chan struct{})
		var once sync.Once
		a := c.newOutbox(t, db, b.dialect, table, BatchSize(8), afterSend(func(sent int) bool {
			once.Do(func() { close(crashed) })
			return true
		}))
		if err := a.EnsureTable(context.Background()); err != nil {
			t.Fatal(err)
		}
		ids := commitMessages(t, a, db, c.topic, 20, "dies")
		errc := make(chan error, 1)
		go func() { errc <- a.Run(context.Background()) }()
		<-crashed
		if err := <-errc; !errors.Is(err, errCrash) {
			t.Fatalf("relay a: %v, want the injected crash", err)
		}
		if s := a.Stats(); s.Passes != 1 {
			t.Fatalf("relay a: %+v, want one pass", s)
		}
		if n := rowsLeft(t, db, table); n != 20 {
			t.Fatalf("%d rows after the crash, want 20", n)
		}

		bo := c.newOutbox(t, db, b.dialect, table, BatchSize(8))
		if err := bo.Start(); err != nil {
			t.Fatal(err)
		}
		waitEmpty(t, db, table, 20*time.Second)
		exactlyOnce(t, c.counts(t), ids)
		if s := bo.Stats(); s.Resolved != 8 || s.Sent != 12 {
			t.Errorf("relay b: %+v, want 8 found stored and 12 sent", s)
		}
	})
}

// A message the broker refuses for good (too large) is kept in its table,
// marked failed with the reason, reported once, and not tried again; the
// messages after it are sent.
func refusedMessageKeptAndReported(t *testing.T, c *cluster) {
	b := sqliteBackend
	db := b.open(t, b.dsn(t))
	table := newTable()
	failed := make(chan FailedRow, 4)
	o := c.newOutbox(t, db, b.dialect, table, OnFailed(func(r FailedRow) { failed <- r }))
	ctx := context.Background()
	if err := o.EnsureTable(ctx); err != nil {
		t.Fatal(err)
	}
	big := addCommitted(t, o, db, &Message{Topic: c.topic, Body: make([]byte, protocol.MaxMessageSize+1)})
	ok := addCommitted(t, o, db, &Message{Topic: c.topic, Body: []byte("fine")})
	if err := o.Start(); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 20*time.Second, "the small message to be sent", func() bool { return c.counts(t)[ok] == 1 })
	var r FailedRow
	select {
	case r = <-failed:
	case <-time.After(20 * time.Second):
		t.Fatal("no failed row reported")
	}
	if r.ID != big || !errors.Is(r.Err, protocol.ErrMessageTooLarge) {
		t.Fatalf("failed row %+v, want %s too large", r, big)
	}
	fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := o.Flush(fctx); err != nil {
		t.Fatal(err)
	}
	var lastErr string
	var failedAt sql.NullInt64
	if err := db.QueryRow("SELECT last_error, failed_at FROM "+table+" WHERE msg_id = ?", big).Scan(&lastErr, &failedAt); err != nil {
		t.Fatalf("the row of %s after the relay's passes: %v", big, err)
	}
	if !failedAt.Valid || !strings.Contains(lastErr, "MESSAGE_TOO_LARGE") && !strings.Contains(strings.ToLower(lastErr), "too large") {
		t.Fatalf("row of %s: failed_at %v, last_error %q", big, failedAt, lastErr)
	}
	if s := o.Stats(); s.Failed != 1 || len(failed) != 0 {
		t.Fatalf("stats %+v, %d more reports: want the row failed once", s, len(failed))
	}
}

// Two relays on one table (two instances of an application): the lease
// lets one send at a time, and every message is stored once.
func TestTwoRelaysOneTable(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c *cluster, b backend, dsn string, db *sql.DB) {
		table := newTable()
		r1 := c.newOutbox(t, db, b.dialect, table, BatchSize(5))
		r2 := c.newOutbox(t, db, b.dialect, table, BatchSize(5))
		if err := r1.EnsureTable(context.Background()); err != nil {
			t.Fatal(err)
		}
		for _, r := range []*Outbox{r1, r2} {
			if err := r.Start(); err != nil {
				t.Fatal(err)
			}
		}
		var ids []string
		for range 4 {
			ids = append(ids, commitMessages(t, r1, db, c.topic, 10, "two")...)
			r1.Notify()
			r2.Notify()
		}
		waitEmpty(t, db, table, 20*time.Second)
		exactlyOnce(t, c.counts(t), ids)
		s1, s2 := r1.Stats(), r2.Stats()
		if s1.Sent+s2.Sent+s1.Resolved+s2.Resolved != int64(len(ids)) {
			t.Errorf("stats %+v and %+v: want %d sent in all", s1, s2, len(ids))
		}
	})
}

// New refuses what cannot work, all at once; Add refuses a message
// without a topic or using the outbox's property; a second Run fails.
func TestOptionsAndMisuse(t *testing.T) {
	db := sqliteBackend.open(t, sqliteBackend.dsn(t))
	_, err := New(db, "", Table("1bad"), BatchSize(0))
	if err == nil || !strings.Contains(err.Error(), "producer name") || !strings.Contains(err.Error(), "table") ||
		!strings.Contains(err.Error(), "BatchSize") || !strings.Contains(err.Error(), "metaservers") {
		t.Fatalf("New: %v", err)
	}
	o, err := New(db, "relay", Client(sdk.MetaAddrs("127.0.0.1:1")))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := o.EnsureTable(ctx); err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []*Message{{}, {Topic: "t", Properties: map[string]string{IDProperty: "x"}}} {
		if _, err := o.Add(ctx, tx, m); !errors.Is(err, protocol.ErrInvalid) {
			t.Errorf("Add(%+v): %v, want INVALID", m, err)
		}
	}
	if _, err := o.Add(ctx, tx, &Message{Topic: "t", ID: "same"}); err != nil {
		t.Fatal(err)
	}
	if _, err := o.Add(ctx, tx, &Message{Topic: "t", ID: "same"}); err == nil {
		t.Error("a second Add of id same in the table succeeded")
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if err := o.Start(); err != nil {
		t.Fatal(err)
	}
	if err := o.Start(); !errors.Is(err, ErrRunning) {
		t.Errorf("second Start: %v", err)
	}
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	if err := o.Run(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("Run after Close: %v", err)
	}
}

// The ready query keeps a key's order: a keyed row waiting for a retry
// holds back its topic and key's later rows (not another key's, another
// topic's, or unkeyed ones); a row marked failed holds nothing back.
func TestReadyHoldsKeyBehindRetry(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			db := b.open(t, b.dsn(t))
			o, err := New(db, "relay", WithDialect(b.dialect), Table(newTable()), Client(sdk.MetaAddrs("127.0.0.1:1")))
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if err := o.EnsureTable(ctx); err != nil {
				t.Fatal(err)
			}
			a := addCommitted(t, o, db, &Message{Topic: "t", Key: "k1", ID: "a"})
			for _, m := range []*Message{{Topic: "t", Key: "k2", ID: "b"}, {Topic: "t", Key: "k1", ID: "c"},
				{Topic: "t", ID: "d"}, {Topic: "u", Key: "k1", ID: "e"}} {
				addCommitted(t, o, db, m)
			}
			ready := func() string {
				rows, err := o.readyRows(ctx, 10)
				if err != nil {
					t.Fatal(err)
				}
				var ids []string
				for _, r := range rows {
					ids = append(ids, r.msgID)
				}
				return strings.Join(ids, ",")
			}
			if got := ready(); got != "a,b,c,d,e" {
				t.Fatalf("ready %s, want all", got)
			}
			rowA := row{msgID: a}
			if err := db.QueryRow(b.dialect.bind("SELECT id FROM "+o.cfg.table+" WHERE msg_id = ?"), a).Scan(&rowA.id); err != nil {
				t.Fatal(err)
			}
			if err := o.putOff(ctx, rowA, time.Hour, errors.New("later"), false); err != nil {
				t.Fatal(err)
			}
			if got := ready(); got != "b,d,e" {
				t.Fatalf("with a waiting: ready %s, want b,d,e", got)
			}
			if err := o.putOff(ctx, rowA, 0, errors.New("refused"), true); err != nil {
				t.Fatal(err)
			}
			if got := ready(); got != "b,c,d,e" {
				t.Fatalf("with a failed: ready %s, want b,c,d,e", got)
			}
		})
	}
}

// None lost when sends fail: a relay whose producer gives every message
// up at once (a delivery timeout of a microsecond) keeps the rows, pass
// after pass; a relay started after it stores every one once (any an
// attempt stored meanwhile is found by its lookup).
func failedSendsKeepRows(t *testing.T, c *cluster) {
	b := sqliteBackend
	db := b.open(t, b.dsn(t))
	table := newTable()
	failing := c.newOutbox(t, db, b.dialect, table, ProducerOptions(producer.Linger(0), producer.DeliveryTimeout(time.Microsecond)))
	if err := failing.EnsureTable(context.Background()); err != nil {
		t.Fatal(err)
	}
	ids := commitMessages(t, failing, db, c.topic, 6, "failing")
	if err := failing.Start(); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 20*time.Second, "two failed passes over the 6 rows", func() bool {
		if n := rowsLeft(t, db, table); n != 6 {
			t.Fatalf("%d rows left after failed sends, want 6", n)
		}
		return failing.Stats().Retried >= 12
	})
	if err := failing.Close(); err != nil {
		t.Fatal(err)
	}
	if n := rowsLeft(t, db, table); n != 6 {
		t.Fatalf("%d rows left after failed sends, want 6", n)
	}
	o := c.newOutbox(t, db, b.dialect, table)
	if err := o.Start(); err != nil {
		t.Fatal(err)
	}
	waitEmpty(t, db, table, 20*time.Second)
	exactlyOnce(t, c.counts(t), ids)
	if s := o.Stats(); s.Sent+s.Resolved != 6 {
		t.Errorf("stats %+v, want 6 sent or found", s)
	}
}

// Close gives the lease up: a relay started after it (a restarted
// application) sends at once, without waiting for the lease (a minute
// here) to expire.
func closeHandsLeaseOver(t *testing.T, c *cluster) {
	b := sqliteBackend
	db := b.open(t, b.dsn(t))
	table := newTable()
	first := c.newOutbox(t, db, b.dialect, table, LeaseTTL(time.Minute))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := first.EnsureTable(ctx); err != nil {
		t.Fatal(err)
	}
	ids := commitMessages(t, first, db, c.topic, 5, "first")
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	if err := first.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	second := c.newOutbox(t, db, b.dialect, table, LeaseTTL(time.Minute))
	if err := second.Start(); err != nil {
		t.Fatal(err)
	}
	ids = append(ids, commitMessages(t, second, db, c.topic, 5, "second")...)
	second.Notify()
	if err := second.Flush(ctx); err != nil {
		t.Fatalf("the second relay's flush: %v (the first's lease not given up?)", err)
	}
	exactlyOnce(t, c.counts(t), ids)
}

// The relay's cases on SQLite, on one cluster (a topic each).
func TestRelayCases(t *testing.T) {
	c := startCluster(t)
	for _, tc := range []struct {
		name string
		f    func(*testing.T, *cluster)
	}{
		{"refused-message-kept-and-reported", refusedMessageKeptAndReported},
		{"failed-sends-keep-rows", failedSendsKeepRows},
		{"close-hands-lease-over", closeHandsLeaseOver},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c.useTopic(t, tc.name)
			tc.f(t, c)
		})
	}
}
