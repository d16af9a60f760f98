package broker

import "sync/atomic"

// Stats are the broker's counters, read by the metrics endpoint. The parts
// add to them; nothing reads them on the hot path.
type Stats struct {
	MessagesIn   atomic.Int64 // messages stored
	BytesIn      atomic.Int64 // message bytes stored
	Refused      atomic.Int64 // messages answered with a non-OK status
	Batches      atomic.Int64 // SEND requests answered
	BatchNanos   atomic.Int64 // sum of SEND latencies, for the mean
	HighAcked    atomic.Int64 // HIGH messages confirmed by the slave
	HighTimeouts atomic.Int64 // HIGH messages answered SLAVE_SYNC_TIMEOUT (or LEASE_LOST when stepping down)

	// Failover.
	LeaseLost      atomic.Int64 // stored messages answered LEASE_LOST: the lease ran out before the answer
	Fenced         atomic.Int64 // SEND batches refused because a newer epoch was seen
	Takeovers      atomic.Int64 // times this broker took over as master
	Truncations    atomic.Int64 // times this broker cut its log on rejoining as slave
	TruncatedBytes atomic.Int64 // bytes cut
	HAFetchRefused atomic.Int64 // HA fetches refused: not this group's slave in this epoch

	// Long-polling PULL (longpoll.go).
	PullsParked   atomic.Int64 // PULLs parked now (a gauge)
	PullWakeups   atomic.Int64 // parked PULLs answered because their queue grew
	PullsExpired  atomic.Int64 // parked PULLs answered when their wait passed
	PullsReleased atomic.Int64 // parked PULLs answered at a step-down or a truncation
	PullsOverflow atomic.Int64 // PULLs answered at once, empty, because too many were parked
}
