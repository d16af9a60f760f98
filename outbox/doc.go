// Package outbox is QMQ's transactional-message pattern for applications
// with a database: a message is stored in the application's own
// transaction, in a table of its database, and a relay sends it after the
// commit through a named idempotent producer, and deletes it once stored.
//
//	ob, err := outbox.New(db, "billing-outbox", outbox.WithDialect(outbox.PostgreSQL),
//		outbox.Client(sdk.MetaAddrs("127.0.0.1:7101")))
//	err = ob.EnsureTable(ctx) // or create the tables with your migrations
//	err = ob.Start()          // the relay; defer ob.Close()
//
//	tx, err := db.BeginTx(ctx, nil)
//	// ... the business writes ...
//	_, err = ob.Add(ctx, tx, &outbox.Message{Topic: "orders", Key: "customer-42", Body: body})
//	err = tx.Commit()
//	ob.Notify() // send now rather than at the next poll
//
// The package has no database driver: the application opens db with its
// own (SQLite and PostgreSQL dialects; the tests use
// github.com/ncruces/go-sqlite3, a pure-Go SQLite, and github.com/lib/pq). On SQLite, open it
// with a busy timeout (and preferably WAL): the relay writes to the table
// while the application's transactions do.
//
// # The table
//
// TABLE (default ferrymq_outbox) has a row per message: id (the order of
// Adds), msg_id (the outbox id, unique), topic, msg_key, tag, properties
// (JSON), body, reliability, created_at, attempted_at (the first attempt,
// NULL before), attempts, next_at (not before), failed_at and last_error.
// TABLE_lease has one row, the relay's lease. Times are unix milliseconds
// by the database's clock, so relays on machines with skewed clocks agree.
//
// # What is guaranteed
//
// A message exists iff the transaction that added it committed: Add is an
// INSERT in the caller's transaction.
//
// None lost: a row is deleted only after the broker answered OK or
// DUPLICATE for its message, or a lookup found the message stored. Any
// other outcome leaves the row, tried again after a backoff (Backoff, and
// at least LeaseTTL/4); rows a dead process left are found by the next
// relay's poll (PollInterval). A message the broker refuses for good (INVALID,
// MESSAGE_TOO_LARGE) is never dropped either: its row is kept with
// failed_at and last_error set, reported to OnFailed (or logged at Error)
// and counted in Stats.Failed, and skipped until someone clears failed_at.
//
// No message twice, across crashes. A pass of the relay marks the rows it
// is about to send attempted, in a committed UPDATE, before it sends
// them; it waits for every result and deletes the stored rows. A relay
// that dies in between leaves rows marked attempted whose messages may be
// stored. The producer's dedupe cannot answer for them (a new process is a
// new producer epoch, and its sequences restart), so the relay that finds
// an attempted row looks its message up first (LOOKUP by key, at the
// master of each broker group of the topic's route, from the row's first
// attempt less LookupMargin): found, the row is deleted without a send;
// not found, it is sent; undecided (a group without a master, or whose
// master does not answer, messages hidden from the relay's principal,
// more than 20 pages of the key in the window), it waits for a later
// pass, never sent blind. Only masters are asked: a slave may lack the
// newest records. Every message carries its outbox id in the
// property OUTBOX_ID (IDProperty), which the lookup matches, and a consumer
// can dedupe on.
//
// The lookup is by key because the producer makes message ids itself: a
// message without a Key is sent with its outbox id as its Key. It then
// goes to the queue of that key's hash (spread evenly), and, as any keyed
// message, waits for its queue when its group fails rather than moving to
// another (the pass ends by its lease's deadline, and the row is tried
// again). A Message.ID set by the caller is its outbox id; it is not the
// broker's message id.
//
// One relay at a time. Relays of the same table (several instances of an
// application) share it through the lease row: a pass first takes or
// renews the lease (an UPDATE that succeeds for its holder or once it
// expired, by the database's clock), and its sends end a quarter of
// LeaseTTL before the lease could pass to another relay, which looks up
// what this one may have sent. Every relay of a table uses the same
// producer name, and a relay takes a new producer (a new epoch) each time
// it takes the lease afresh, so a relay that lost its lease and still
// sends is refused (PRODUCER_FENCED) at every queue its successor wrote
// to. The same lease works on both dialects (no SELECT ... FOR UPDATE SKIP
// LOCKED): one relay sends while the others poll the lease.
//
// Order: within a topic, a key's messages are stored in the order of
// their rows' ids: passes take rows in id order and send them in that
// order, one pass at a time, the producer keeps a key's messages in order
// across its retries, and a keyed row waiting for a retry holds its key's
// later rows back (in its pass and in the ready query). Ids follow Add
// order within a transaction, and commit order between transactions that
// do not overlap; between overlapping ones (PostgreSQL hands ids out at
// the INSERT) a row with a lower id committed later is sent after a
// higher one already sent. The exceptions: a row marked failed (refused
// for good) is passed by its key's later rows, and a row whose send failed
// in a pass where later rows of its key were stored (its delivery
// deadline, the pass's, passed while theirs did not) is stored after
// them. Unkeyed messages have no order between them (each has its own
// key).
//
// # Limits
//
//   - Once holds for a message its lookup can find. It is stored twice if
//     an attempt of it is still on its way to the broker when a relay
//     looks it up, which the lease (after a relay's death) and the least
//     wait before a retry (LeaseTTL/4, after a failed send) make an
//     attempt in flight for LeaseTTL/4 or more (a broker or network that
//     slow); if it was stored before its first attempt less LookupMargin
//     by the brokers' clocks (the database's and the brokers' clocks
//     apart by more than the margin); or if the broker no longer has it
//     (retention deleted it before a relay came back).
//   - A failover between an attempt and its lookup: a message only the
//     failed master held (not yet copied to the slave promoted in its
//     place) is not found and is sent again; when that master comes back,
//     the group appends its cut tail (DESIGN.md, "The recovered tail"), and
//     the message is then stored twice. Consumers that must not see it
//     twice dedupe on OUTBOX_ID.
//   - The producer's own cases of a message stored twice remain (see
//     package producer: a message moved or re-stamped after an unknown
//     outcome, Result.PossibleDuplicate, counted in
//     Stats.PossibleDuplicates).
//   - A second Add of an id still in the table fails (msg_id is unique);
//     an id added again after its row was deleted is a new message.
//   - The relay's principal needs produce and consume on the outbox's
//     topics (LOOKUP shows a message only to who may consume its topic),
//     consume on every topic that uses the same keys (a lookup that sees
//     hidden messages of its key cannot tell, and leaves the row
//     undecided), and describe when a topic's queues moved from a retired
//     group (the lookup then asks every group the metaserver lists).
//   - Delayed messages are not supported (Message has no DeliverAt).
//   - A relay after a crash waits for the dead one's lease to expire
//     (LeaseTTL); Close gives the lease up, so a clean restart does not.
//   - An attempted row costs a LOOKUP, done one row at a time, before it is
//     sent again.
//   - A pass reads the ready rows in id order and stops at its batch when
//     the planner knows the table's size: PostgreSQL reads a large backlog
//     whole at each pass until the table is analyzed (autovacuum does it,
//     or ANALYZE).
//
// # Goroutines
//
// The relay is one goroutine (Start, or the caller's in Run) that owns the
// lease, the producer and its lookups' connections; the producer has its
// own, which Close ends. Close stops the relay after its pass (whose sends
// and deletes it lets finish), closes the producer and gives the lease up.
package outbox
