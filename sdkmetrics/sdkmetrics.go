// Package sdkmetrics is how the producer and consumer SDKs report metrics:
// they call a Hooks implementation with each counted event and each
// measured duration, and know nothing of where the numbers go. Package
// sdkmetrics/prom implements Hooks for Prometheus (client_golang), so the
// SDKs themselves import no metrics library; an application with another
// system implements Hooks itself.
//
// Give the hooks to an SDK client with sdk.Metrics. Hooks are called from
// the SDK's goroutines, on the send path among others: they must be safe
// for concurrent use, quick, and must not block.
package sdkmetrics

import "time"

// Counter names a counter an SDK adds to.
type Counter uint8

// The producer's counters, the same as its Stats.
const (
	// ProducerDuplicates: messages a broker answered DUPLICATE (a retry of a
	// message already stored, not stored again).
	ProducerDuplicates Counter = iota
	// ProducerPossibleDuplicates: messages sent again without their stamp
	// after an attempt of unknown outcome (they may be stored twice).
	ProducerPossibleDuplicates
	// ProducerOutOfOrder: OUT_OF_ORDER_SEQUENCE answers (each took a new
	// producer identity).
	ProducerOutOfOrder
	// ProducerRetries: messages sent again after a failed attempt.
	ProducerRetries
	// ProducerRenewals: producer identities taken after the first.
	ProducerRenewals
	// ProducerGivenUp: SEND requests abandoned without an answer because
	// the group's master was replaced or the group stayed read-only.
	ProducerGivenUp
	// ProducerTxnCommits and ProducerTxnAborts: transactions the producer
	// committed and aborted (its own, not those its checker resolved).
	ProducerTxnCommits
	ProducerTxnAborts
	// ProducerTxnChecks: open transactions of earlier instances the
	// producer asked its TxnChecker about.
	ProducerTxnChecks

	// NumCounters is the number of counters: a Counter is below it.
	NumCounters
)

// Histogram names a distribution of durations an SDK measures.
type Histogram uint8

const (
	// ProducerSendDuration: time from sending a SEND request (a batch of
	// messages to one broker) to its answer, or to its failure, per
	// request.
	ProducerSendDuration Histogram = iota

	// NumHistograms is the number of histograms: a Histogram is below it.
	NumHistograms
)

// Hooks receives an SDK client's metric events.
type Hooks interface {
	// Add adds n to counter c.
	Add(c Counter, n int64)
	// Observe records one duration d of histogram h.
	Observe(h Histogram, d time.Duration)
}

// Nop is Hooks that keeps nothing: an SDK client's default.
type Nop struct{}

// Add does nothing.
func (Nop) Add(Counter, int64) {}

// Observe does nothing.
func (Nop) Observe(Histogram, time.Duration) {}
