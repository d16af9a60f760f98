// Package producer is ferrymq's producer SDK: it looks routes up from the
// metaserver, picks queues while avoiding slow or failed broker groups,
// batches messages per group, sends them synchronously or asynchronously,
// retries retriable failures on another group, and hands every message
// exactly one result.
package producer
