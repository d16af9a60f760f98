// Package producer is ferrymq's producer SDK: it looks routes up from the
// metaserver, picks queues while avoiding slow or failed broker groups,
// batches messages per group, sends them synchronously or asynchronously,
// retries failures, and hands every message exactly one result.
//
// # Order and exactly-once (idempotence, on by default)
//
// Before its first batch leaves, a producer takes an identity from the
// metaserver: a producer id, unique in the cluster across restarts
// (allocated through Raft), and an epoch. Every message carries the id, the
// epoch and a sequence number per queue (0, 1, 2, ... per identity),
// assigned when its batch is built. Brokers keep, per producer and queue,
// the last sequences and the offsets they got: a message already stored is
// answered DUPLICATE with the original offsets and not stored again, a
// sequence that would leave a gap is refused (OUT_OF_ORDER_SEQUENCE), and
// an older epoch is refused (PRODUCER_FENCED).
//
// What is ordered. A batch may carry several queues' messages, but a queue
// has one batch in flight at a time: its messages are stored in the order
// they were handed to it, whatever the order of concurrent batches on the
// wire (MaxInflightPerGroup still bounds the batches per group). So:
//   - per queue and per producer, messages are stored in send order, except
//     an unkeyed message that failed and was sent again elsewhere (it may
//     land after later messages);
//   - per key (Message.Key), messages are stored in send order, across
//     failures: a keyed message never leaves its key's queue (unless
//     MoveKeyedOnFailure allows it), it waits there, retried with backoff,
//     until its delivery deadline, and the key's later messages wait behind
//     it. A keyed message that fails for good (its deadline passed) leaves
//     later messages of its key to be stored without it.
//
// Retries. A send whose outcome is unknown (no answer: a lost connection, a
// deadline, a malformed answer, a call given up; or a status of
// protocol.Status.MaybeStored: SLAVE_SYNC_TIMEOUT, FLUSH_TIMEOUT, TIMEOUT,
// STORE_ERROR, INTERNAL, LEASE_LOST) is retried on the same queue with the
// same stamp, ahead of that queue's newer messages, until its delivery
// deadline: the broker answers it DUPLICATE if it had stored it. A HIGH
// message retried after SLAVE_SYNC_TIMEOUT is so answered once the slave
// has it, with one copy. Such a message, keyed or not, stays on its queue
// with its stamp also while its group refuses it or has no writable
// master: the group's next master (the same broker, or the slave promoted
// in its place, which holds the dedupe state: a slave replays the stamps
// it copies) answers it DUPLICATE or stores it once. It moves, losing its
// stamp, only when the newest route shows its group with no writable
// master and no slave (nobody can be promoted) and no master promoted
// since its unknown attempt (one not yet taking writes will answer it),
// once FailoverWait (20 s)
// has passed since its first unknown outcome (failover off, a dead slave,
// a group held read-only), or with MoveOnUnknownOutcome(true). A status
// that says the message was not stored (READ_ONLY, NOT_MASTER,
// SLAVE_LAGGING, NO_ROUTE, BUSY, SHUTTING_DOWN, OUT_OF_ORDER_SEQUENCE...)
// rewinds the queue's sequence to the first refused message's, never below
// a message that may be stored; the refused messages lose their stamps and
// are sent again (an unkeyed one may go to another queue, which keeps
// unkeyed traffic flowing while a group fails over; a keyed one waits for
// its own), except those up to the last refused one that may be stored and
// waits as above: they keep their stamps and wait with it, so the queue's
// sequence has no gap. OUT_OF_ORDER_SEQUENCE also means the broker lost
// state the producer relied on (a log tail lost in a crash or a failover):
// the producer takes a new identity and restarts every queue at sequence
// 0, and the refused messages are re-stamped. PRODUCER_FENCED fails with
// ErrFenced.
//
// When a message can still be stored twice:
//   - it had an attempt of unknown outcome and was then sent without that
//     attempt's stamp: moved to another queue when its group could not
//     answer it (as above: no member to promote, FailoverWait passed, or
//     MoveOnUnknownOutcome), or re-stamped after OUT_OF_ORDER_SEQUENCE.
//     Its Result has PossibleDuplicate set and Stats().PossibleDuplicates
//     counts it. A message re-stamped after OUT_OF_ORDER_SEQUENCE is not
//     in its queue's log already (the broker lacks an earlier sequence of
//     the producer there, and stores a producer's sequences without gaps):
//     its other copy, if any, is in the records a failed-over master cut
//     from its log when it rejoined (its truncated/ side file);
//   - an anonymous producer (no Identity) restarted while a send's outcome
//     was unknown: the new instance has a new id, and the application's
//     resend is a new message to the broker. A named producer (Identity)
//     resumes under its name at a higher epoch, and fences the old
//     instance, but its sequences restart, so a resend by the application
//     is still a new message: exactly-once covers the SDK's own retries;
//   - the broker forgot the producer: a producer idle for longer than the
//     brokers' retention window of producer state (days), or whose last
//     messages were deleted by log retention, is accepted afresh;
//   - idempotence is off (Idempotence(false)): no stamps, and a retry after
//     an unknown outcome may store a message twice, anywhere.
//
// A message answered DUPLICATE has Result.Duplicate set, its offsets are
// the original's (-1 when the broker no longer knows them), and
// Stats().Duplicates counts it. Result carries the message's stamp
// (ProducerID, Epoch, Seq). Stats also counts retries, out-of-order answers
// and identities taken.
//
// # Delayed messages
//
// A message with DeliverAt or DeliverAfter is a delayed one: the master of
// the group that owns the queue it is sent to stores it at once, pending,
// in the queue's internal queue of pending messages
// (protocol.DelayTopic(topic), the same queue number, in the same group),
// replicated as its Reliability says, and releases it into the queue at
// its due time or later, never before. Its Result's Handle names the
// pending record (group and log offset); Cancel cancels it until it is
// released, and DelayedState says whether and where it was. The broker
// checks a delayed message's stamp in that internal queue, so the
// producer keeps a sequence space per queue for its delayed messages apart
// from the queue's own: each is ordered, retried and rewound as above, as
// if it were another queue. A key's delayed messages are stored pending in
// send order, and the broker releases those due at the same time in the
// order it stored them, so they keep their key's order among themselves;
// there is no order between a key's delayed and ordinary messages.
//
// # Failover
//
// When a broker group's master is replaced (the metaserver promotes its
// slave, at a higher group epoch), the producer follows within about a
// RoutePoll (300 ms): a status that says the route is stale (NOT_MASTER,
// READ_ONLY, NO_ROUTE, LEASE_LOST) or a send with no answer refreshes the
// route at once (at most once a second per topic), and while a queue of the
// route has no writable master, or a send to one of its groups has waited
// longer than RoutePoll, the route is polled every RoutePoll. Every SEND
// carries the group epoch of the route it was sent by, so a broker that was
// replaced knows it. A send to a master that stopped answering (its
// connection open, nothing coming back) is given up as soon as a route
// shows the group's master or epoch changed, or the group not writable
// after the send waited RoutePoll, and otherwise at RequestTimeout (5 s).
// A send given up has an unknown outcome: its messages are retried on
// their queue with their stamps, at the new master, which answers
// DUPLICATE for what it already has; a queue still has one batch in flight
// at a time, so order holds. Stats().GivenUp counts the sends given up.
// Messages of unknown outcome wait through the failover for the new
// master, refused or unanswered meanwhile (see Retries: FailoverWait
// bounds the wait); messages known not stored, unkeyed, go to other
// groups.
//
// # Errors
//
// Every error that Send, a promise, Flush or Close gives matches, with
// errors.Is, one or more of the package's sentinels, a status (a
// *protocol.Error, so errors.Is(err, protocol.ErrReadOnly) and the like
// work, and errors.As gives the status), or the caller's context error:
//
//   - ErrClosed: the producer is closed, or was closing and gave up on the
//     message.
//   - ErrBufferFull: the buffer is full and FailWhenFull is set.
//   - ErrConnLost: a broker could not be reached or its connection broke.
//     It is retried, so it ends a message only with ErrDeliveryTimeout.
//   - ErrUnreachable: no metaserver node answered a route lookup, or the
//     request for the producer's identity, in time.
//     It is retried, so it ends a message only with ErrDeliveryTimeout.
//   - ErrDeliveryTimeout: a retriable failure lasted until the message's
//     delivery deadline (DeliveryTimeout, or the Send context's deadline if
//     sooner). The error wraps the last attempt's cause too: ErrConnLost,
//     ErrUnreachable, or a retriable status such as protocol.ErrReadOnly
//     (every group of the topic is read-only), protocol.ErrBusy or
//     protocol.ErrNotEnoughReplicas (a HIGH message while the group's sync
//     set holds fewer copies than its minimum).
//   - ErrFenced: a later instance of this named producer (Identity) has
//     written to a queue. The producer's held messages and every later send
//     fail with it; close it.
//   - A status that is not retriable (protocol.Status.Retriable) ends a
//     message at once: protocol.ErrInvalid or protocol.ErrMessageTooLarge
//     for a bad message (found before it is sent), protocol.ErrUnknownTopic
//     when the topic does not exist and auto-create is off, and the like.
//     With idempotence on, the statuses that leave the outcome unknown
//     (protocol.Status.MaybeStored, INTERNAL included) are retried on the
//     same queue instead, so they end a message only with
//     ErrDeliveryTimeout. DUPLICATE is a success (Result.Duplicate).
//   - context.Canceled or context.DeadlineExceeded when the context ended
//     while the message waited for buffer room or for its next attempt (the
//     last attempt's cause, if any, is wrapped too).
//
// Cancel and DelayedState give ErrClosed, a status that is not retriable
// (protocol.ErrNotFound: no pending record at the handle; protocol.ErrInvalid,
// protocol.ErrNotAuthorized), or the context's error wrapping the last
// attempt's retriable cause (ErrConnLost, ErrUnreachable, a status).
package producer
