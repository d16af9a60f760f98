// Package routing is the route model shared by the metaserver, the broker and
// the producer: topics, their queues, the broker groups that hold them and
// each group's state (writable, or read-only with its reasons), plus queue
// selection with latency-fault avoidance for the producer.
package routing
