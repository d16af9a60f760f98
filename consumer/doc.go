// Package consumer is ferrymq's consumer SDK: members of a consumer group
// share the queues of the topics they subscribe to, read them with
// long-polling PULLs, hand the messages to the application, and commit
// each queue's offset once everything before it was processed.
//
//	c, err := consumer.New("billing", []string{"orders"}, sdk.MetaAddrs("10.0.0.1:7400"))
//	...
//	defer c.Close() // commits what was processed and leaves the group
//	err = c.Run(ctx, func(ctx context.Context, m *consumer.Message) error {
//		return bill(ctx, m.Body) // nil: processed; an error: delivered again later
//	})
//
// # Groups
//
// A member joins its group with its first heartbeat to the metaserver
// leader (at the first Run or Poll) and heartbeats every Heartbeat (1 s).
// The leader assigns every queue of the subscribed topics to one member,
// in a generation: a join, a leave or a lost session starts a new
// generation, sticky (a member keeps its queues when another joins, and
// gives up only what the newcomer's fair share needs). A heartbeat's reply
// carries the member's queues with the group's committed offsets; the
// member stops the fetchers of queues it lost, commits what it processed
// of them (refused once the generation moved: see below), and starts
// fetching its new queues from their committed offsets, or, for a queue
// the group never committed, from StartFrom (Earliest by default, or
// Latest).
//
// A member that cannot reach the metaserver stops consuming all its queues
// once a Session (10 s) less a Heartbeat has passed since the send of its
// last answered heartbeat: the leader gives them away a Session after it
// got that heartbeat, which is later. It joins again when the metaserver
// answers. Close leaves at once, so its queues move to the others without
// waiting for the session.
//
// # At least once
//
// A queue's offset is committed only when the handler returned nil for
// every message before it in that queue (or they were dead-lettered); in
// poll style, when every message before it was marked (MarkProcessed).
// Commits are batched: one CommitOffsets call with every queue whose offset
// moved, every AutoCommit (1 s) and before every heartbeat (so a rebalance
// the heartbeat brings finds them committed), when a queue is revoked, and
// at Close; ManualCommit leaves only Commit, revocations and Close. A
// commit names the member's generation; the leader refuses one in an older
// generation (STALE_GENERATION, ErrRebalanced) and the member heartbeats at
// once to take its new assignment.
//
// When a message can be handled twice: its queue moved to another member
// (a join, a leave, a session lost) after the handler finished and before
// the offset was committed (at most about an AutoCommit or a Heartbeat of
// messages per queue; the leader takes commits of the current generation
// only), or the consumer died (a crash, a kill) with processed offsets not
// committed. A handler that must not repeat an effect should key it on
// (Topic, Queue, Offset) or on the producer's stamp (ProducerID, Seq).
//
// # Exactly once with transactions
//
// A ManualCommit consumer in poll style can hand a batch's offsets to a
// producer transaction (TxnOffsets, the producer's Txn.CommitOffsets): the
// registry commits them in the same write as the transaction's decision,
// so each input's outputs are committed exactly once, crashes included, as
// long as every transaction carries its inputs' offsets; a member that
// lost a queue has its offsets refused, and the transaction aborts. The
// consumer is told the outcome (TxnCommitted, TxnAborted: the inputs are
// delivered again). See TxnOffsets.
//
// # Order, retries and dead letters
//
// Run hands one queue's messages to the handler one at a time, in offset
// order; different queues are handled concurrently (one goroutine per
// queue). A handler that returns an error, or panics (recovered, logged,
// counted in Stats), has its message delivered again after a wait, and its
// queue waits meanwhile, so order holds. The waits are RetryBackoff's (1 s,
// doubling up to 30 s) or a RetrySchedule's (for example 1 s, 5 s, 30 s,
// 5 min: the n-th retry waits the n-th entry, and every retry past the
// list the last one). A handler that returns RetryAt(t) or RetryAfter(d)
// (wrapping its cause, if any) chooses the next delivery's time itself;
// that delivery counts toward MaxRetries all the same. After MaxRetries
// redeliveries (16, RocketMQ's default) the message goes to the dead-letter
// topic (DeadLetterTopic, "%DLQ%" followed by the group) with its key, body
// and properties, plus PropOriginTopic, PropOriginQueue, PropOriginOffset,
// PropOriginID, PropError (the last error) and PropDeliveries, and the
// queue moves on. A dead letter that cannot be stored is retried; its
// queue waits.
//
// # Retries that do not hold the queue
//
// Holding a queue while one of its messages waits keeps the queue's order,
// and costs its throughput: with a 1 s first retry and 0.5% of handler
// calls failing once, a queue handles about 200 messages a second, however
// fast its handler. NonBlockingRetries trades order for throughput: a
// failed message is stored as a delayed message, due at its retry's time,
// in the group's retry topic ("%RETRY%" followed by the group, created on
// first use like the dead-letter topic), with its origin (PropRetryTopic,
// PropRetryQueue, PropRetryOffset, PropRetryID, its store time and producer
// stamp) and its deliveries so far, and its queue moves on at once. The
// retry is stored once: its id and its stamp are kept across its own send
// attempts, and its queue waits while it cannot be stored. The group
// consumes its retry topic with its other topics; the broker releases a
// retry into it when it is due, and the member hands it to the handler as
// the original message (its topic, queue, offset, id, key, properties,
// stamp and times restored, Deliveries counted on, PropRetry holding the
// failed delivery's error). Out of retries it is dead-lettered as the
// original. What changes: a failed message comes back after messages
// stored after it in its queue, and a message whose retry was stored but
// whose offset was not committed before its queue moved is delivered
// twice (from its queue and from the retry topic), as any message handled
// and not committed is. Every member of the group must give the option or
// none; Poll, which has no retries, refuses it.
//
// # Delayed messages
//
// A delayed message (sent with the producer's DeliverAt or DeliverAfter)
// waits pending in its broker group and is read like any other once the
// broker releases it into its queue, at its due time or later: it takes
// its queue offset then, so it comes after what the queue took before its
// release. Message.DueAt says when it was due, Message.ReleasedAt when it
// was released (its StoreTime; ReleasedAt minus DueAt is how late), and
// Message.DelayedHandle names the pending record it came from (the
// producer's Result.Handle). They are zero on any other message.
//
// # Fetching
//
// Every queue the member holds has a fetcher: a PULL to the queue's master
// (with the route's epoch) that the broker holds up to PollWait (1 s) when
// there is nothing new, answering as soon as a message arrives. When the
// master does not answer (connection refused or lost, a timeout,
// NOT_MASTER, SHUTTING_DOWN) the fetcher reads from the group's slave for 5
// s, then looks the route up and tries the master again. Fetched messages
// wait in memory up to MaxPrefetchBytes (64 MiB) over all the member's
// queues, split evenly (at least 64 KiB each); a fetcher whose share is
// full waits. A committed offset before the queue's oldest message (log
// retention deleted it) starts from the oldest, and one past the queue's
// end on its master (a tail lost in a failover) from the end; both are
// logged once.
//
// # Errors
//
// Errors match, with errors.Is, the package's sentinels or a status (a
// *protocol.Error):
//
//   - ErrClosed: the consumer is closed.
//   - ErrBusy: Run after Poll (or a second Run), Poll after Run.
//   - ErrUnknownTopic (and protocol.ErrUnknownTopic): Run or Poll found a
//     subscribed topic that does not exist (consumers never create topics).
//   - ErrUnreachable: no metaserver node answered in time (Run or Poll
//     looking routes up, Commit, Close leaving the group).
//   - ErrRebalanced (and protocol.ErrStaleGeneration): Commit or Close found
//     the group in a newer generation; nothing was committed.
//   - ErrQueueLost: TxnOffsets of a message of a queue the member no
//     longer holds; the batch is void.
//   - The context's error when it ended first.
//
// Poll returns an error with NonBlockingRetries (Poll style has no retries).
//
// Fetch failures, heartbeat failures and handler failures are not returned:
// they are retried, logged (sdk.Logger) and counted (Stats).
package consumer
