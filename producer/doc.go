// Package producer is ferrymq's producer SDK: it looks routes up from the
// metaserver, picks queues while avoiding slow or failed broker groups,
// batches messages per group, sends them synchronously or asynchronously,
// retries retriable failures on another group, and hands every message
// exactly one result.
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
//   - ErrUnreachable: no metaserver node answered a route lookup in time.
//     It is retried, so it ends a message only with ErrDeliveryTimeout.
//   - ErrDeliveryTimeout: a retriable failure lasted until the message's
//     delivery deadline (DeliveryTimeout, or the Send context's deadline if
//     sooner). The error wraps the last attempt's cause too: ErrConnLost,
//     ErrUnreachable, or a retriable status such as protocol.ErrReadOnly
//     (every group of the topic is read-only), protocol.ErrBusy or
//     protocol.ErrSlaveLagging (a HIGH message and no slave keeping up).
//   - A status that is not retriable (protocol.Status.Retriable) ends a
//     message at once: protocol.ErrInvalid or protocol.ErrMessageTooLarge
//     for a bad message (found before it is sent), protocol.ErrUnknownTopic
//     when the topic does not exist and auto-create is off,
//     protocol.ErrDuplicate, and the like.
//   - context.Canceled or context.DeadlineExceeded when the context ended
//     while the message waited for buffer room or for its next attempt (the
//     last attempt's cause, if any, is wrapped too).
package producer
