package broker

import "sync/atomic"

// Stats are the broker's counters, read by the metrics endpoint.
type Stats struct {
	MessagesIn   atomic.Int64 // messages stored
	BytesIn      atomic.Int64 // message bytes stored
	Refused      atomic.Int64 // messages answered with a non-OK status
	Batches      atomic.Int64 // SEND requests answered
	BatchNanos   atomic.Int64 // sum of SEND latencies, for the mean
	HighAcked    atomic.Int64 // HIGH messages confirmed by the slave
	HighTimeouts atomic.Int64 // HIGH messages answered SLAVE_SYNC_TIMEOUT
}

// Stats returns the broker's counters.
func (b *Broker) Stats() *Stats { return &b.stats }
