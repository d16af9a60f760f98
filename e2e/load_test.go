package e2e

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/producer"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/sdk"
)

// The load of the fault tests: workers send through one producer client in
// the test process, at a bounded rate, until the test stops them or a count
// or time cap is reached. Every message's body is its test id: "KEY/SEQ"
// for a keyed message (SEQ counts that key's sends: one worker owns a key,
// so SEQ is the key's send order), "uW/N" for an unkeyed one. Every
// promise's outcome is recorded.

type loadConfig struct {
	topic         string
	workers       int     // goroutines sending, each owning its keys
	keysPerWorker int     // keys each worker cycles through
	unkeyedEvery  int     // every n-th message of a worker has no key (0: all keyed)
	rate          float64 // messages per second per worker (a pace, not asserted)
	maxMessages   int     // cap on messages sent, over all workers
	maxDuration   time.Duration
	reliability   protocol.Reliability
	// highEvery > 0 makes every n-th message of a worker HIGH (the others
	// keep reliability): a mixed load.
	highEvery int
	opts      []producer.Opt // besides MetaAddrs
}

// outcome is what a promise said about one message.
type outcome struct {
	tid    string // the body
	key    string // "" for an unkeyed message
	seq    int    // the key's send index (keyed messages)
	rel    protocol.Reliability
	res    producer.Result
	err    error
	sentAt time.Time // when SendAsync was called
	at     time.Time // when the promise was called
}

type load struct {
	t     *testing.T
	cfg   loadConfig
	p     *producer.Client
	start time.Time

	stopOnce sync.Once
	stop     chan struct{}
	workers  sync.WaitGroup
	promises sync.WaitGroup

	sent, acked, failed atomic.Int64

	mu       sync.Mutex
	outcomes []outcome

	// lostOK, if set, says which acknowledged messages check accepts as
	// lost (NORMAL messages of a failed-over group's tail); check returns
	// them.
	lostOK func(o *outcome) bool
	// storedTwice, set by check, is how many message ids are stored more
	// than once across the topic's queues, flagged PossibleDuplicate or not.
	storedTwice int
	// recoveredN, set by check, is how many stored messages a new master
	// appended again from a former master's cut tail.
	recoveredN int
	// flaggedTwice, set by check, is every acknowledged message stored more
	// than once whose result said PossibleDuplicate, with its copies.
	flaggedTwice []flaggedCopies
}

// flaggedCopies is a message stored more than once whose result said it
// might be.
type flaggedCopies struct {
	o      outcome
	copies []storedMsg
}

// tb is what the checks need of a test: *testing.T and *rapid.T have it.
type tb interface {
	Helper()
	Logf(format string, args ...any)
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	Fatal(args ...any)
}

func startLoad(t *testing.T, c *localCluster, cfg loadConfig) *load {
	t.Helper()
	opts := append([]producer.Opt{sdk.MetaAddrs(strings.Split(c.meta, ",")...)}, cfg.opts...)
	p, err := producer.New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	l := &load{t: t, cfg: cfg, p: p, start: time.Now(), stop: make(chan struct{})}
	t.Cleanup(func() {
		l.halt()
		l.workers.Wait()
		p.Close()
	})
	perWorker := cfg.maxMessages / cfg.workers
	for w := range cfg.workers {
		l.workers.Add(1)
		go l.work(w, perWorker)
	}
	return l
}

func (l *load) halt() { l.stopOnce.Do(func() { close(l.stop) }) }

func (l *load) work(w, count int) {
	defer l.workers.Done()
	keySeq := make([]int, l.cfg.keysPerWorker)
	keyed := 0
	for n := range count {
		// Pace: message n leaves no earlier than n/rate after the start.
		if d := time.Until(l.start.Add(time.Duration(float64(n) / l.cfg.rate * float64(time.Second)))); d > 0 {
			select {
			case <-l.stop:
				return
			case <-time.After(d):
			}
		}
		select {
		case <-l.stop:
			return
		default:
		}
		if time.Since(l.start) > l.cfg.maxDuration {
			return
		}
		var o outcome
		if l.cfg.unkeyedEvery > 0 && n%l.cfg.unkeyedEvery == l.cfg.unkeyedEvery-1 {
			o.tid = fmt.Sprintf("u%d/%d", w, n)
		} else {
			k := keyed % l.cfg.keysPerWorker
			keyed++
			o.key = fmt.Sprintf("k%d.%d", w, k)
			o.seq = keySeq[k]
			keySeq[k]++
			o.tid = fmt.Sprintf("%s/%d", o.key, o.seq)
		}
		o.rel = l.cfg.reliability
		if l.cfg.highEvery > 0 && n%l.cfg.highEvery == l.cfg.highEvery-1 {
			o.rel = protocol.High
		}
		l.promises.Add(1)
		l.sent.Add(1)
		o.sentAt = time.Now()
		l.p.SendAsync(context.Background(), &producer.Message{Topic: l.cfg.topic, Key: o.key, Body: []byte(o.tid), Reliability: o.rel},
			func(r producer.Result, err error) {
				o.res, o.err, o.at = r, err, time.Now()
				if err != nil {
					l.failed.Add(1)
				} else {
					l.acked.Add(1)
				}
				l.mu.Lock()
				l.outcomes = append(l.outcomes, o)
				l.mu.Unlock()
				l.promises.Done()
			})
	}
}

// waitAcked waits until n messages in all were acknowledged.
func (l *load) waitAcked(n int64, timeout time.Duration, why string) {
	l.t.Helper()
	testwait.ForEvery(l.t, timeout, 10*time.Millisecond, fmt.Sprintf("%d acknowledgements (%s)", n, why), func() bool {
		return l.acked.Load() >= n
	})
}

// finish stops sending and waits for every promise (the producer's delivery
// timeout bounds each message).
func (l *load) finish() {
	l.t.Helper()
	l.halt()
	l.workers.Wait()
	done := make(chan struct{})
	go func() { l.promises.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		l.t.Fatalf("promises still pending 60 s after the load stopped: sent %d, acked %d, failed %d", l.sent.Load(), l.acked.Load(), l.failed.Load())
	}
	l.t.Logf("load: sent %d in %v, acked %d, failed %d; SDK stats: %+v", l.sent.Load(), time.Since(l.start).Round(time.Millisecond),
		l.acked.Load(), l.failed.Load(), l.p.Stats())
}

// storedMsg is one message read back from a queue.
type storedMsg struct {
	queue  uint32
	offset int64
	id     string // the SDK's message id
	tid    string // the body
	stamp  protocol.ProducerStamp
	// recovered: appended again by a new master from its former master's
	// cut tail (protocol.RecoveredProperty): it lands after what its queue
	// took meanwhile, the one exception to per-key order.
	recovered bool
	// storeTime (unix ms) tells this record from another of the same id
	// at the same place: a message a failover cut, stored again by the new
	// master where the old one had it (a producer's retry).
	storeTime int64
}

// readAll reads every queue of the topic from its master through PULL, from
// its first offset to its end.
func readAll(t tb, c *localCluster, topic string) [][]storedMsg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	route, err := c.mc.RouteExisting(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	out := make([][]storedMsg, len(route.Queues))
	for _, qr := range route.Queues {
		tc := transport.NewClient(qr.Master, transport.ClientConfig{})
		req := protocol.PullRequest{Topic: topic, Queue: qr.Queue, MaxBytes: 1 << 20}
		for {
			resp, err := tc.Call(ctx, protocol.CodePull, protocol.AppendPullRequest(nil, &req))
			if err != nil {
				t.Fatalf("pull %s queue %d at %d from %s: %v", topic, qr.Queue, req.Offset, qr.Master, err)
			}
			pr, err := protocol.DecodePullResponse(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			if req.Offset == 0 && pr.MinOffset != 0 {
				t.Fatalf("queue %d starts at %d: messages were deleted", qr.Queue, pr.MinOffset)
			}
			for _, m := range pr.Messages {
				out[qr.Queue] = append(out[qr.Queue], storedMsg{queue: qr.Queue, offset: m.QueueOffset, id: m.Message.ID,
					tid: string(m.Message.Body), stamp: m.Message.Producer, storeTime: m.StoreTime,
					recovered: slices.ContainsFunc(m.Message.Properties, func(p protocol.Property) bool { return p.Key == protocol.RecoveredProperty })})
			}
			if len(pr.Messages) == 0 {
				if pr.NextOffset < pr.MaxOffset {
					t.Fatalf("queue %d: empty PULL at %d before the end %d", qr.Queue, pr.NextOffset, pr.MaxOffset)
				}
				break
			}
			req.Offset = pr.NextOffset
		}
		tc.Close()
		for i, m := range out[qr.Queue] {
			if m.offset != int64(i) {
				t.Fatalf("queue %d: message %d has offset %d: offsets not dense", qr.Queue, i, m.offset)
			}
		}
	}
	return out
}

// violations collects broken promises by kind, with a few examples each.
type violations struct {
	count    map[string]int
	examples map[string][]string
}

func (v *violations) add(kind, format string, args ...any) { v.addN(kind, 1, format, args...) }

// addN counts n cases of a kind under one example.
func (v *violations) addN(kind string, n int, format string, args ...any) {
	if v.count == nil {
		v.count, v.examples = map[string]int{}, map[string][]string{}
	}
	v.count[kind] += n
	if len(v.examples[kind]) < 5 {
		v.examples[kind] = append(v.examples[kind], fmt.Sprintf(format, args...))
	}
}

// check reads the topic back and checks issue 11's promises against the
// recorded outcomes; it logs one summary line and fails the test on every
// broken promise. It returns the acknowledged messages that are not stored
// and that l.lostOK accepts as lost, and sets l.storedTwice.
func (l *load) check(c *localCluster, name string) (lost []outcome) {
	l.t.Helper()
	return l.checkOn(l.t, c, name)
}

// checkOn is check reporting to t.
func (l *load) checkOn(t tb, c *localCluster, name string) (lost []outcome) {
	t.Helper()
	queues := readAll(t, c, l.cfg.topic)
	l.mu.Lock()
	outcomes := slices.Clone(l.outcomes)
	l.mu.Unlock()
	var v violations

	// Where each test id is stored, and how often each message id.
	where := map[string][]storedMsg{}
	ids := map[string]int{}
	stored := 0
	l.storedTwice = 0
	l.flaggedTwice = nil
	for _, q := range queues {
		for _, m := range q {
			where[m.tid] = append(where[m.tid], m)
			stored++
			if ids[m.id]++; ids[m.id] == 2 {
				l.storedTwice++
			}
		}
	}
	byTid := make(map[string]*outcome, len(outcomes))
	var ackTimes []time.Time
	var acked, failed, dupResults, possDups, possDupStoredTwice int
	for i := range outcomes {
		o := &outcomes[i]
		byTid[o.tid] = o
		if o.err != nil {
			failed++
			continue
		}
		acked++
		ackTimes = append(ackTimes, o.at)
		if o.res.Duplicate {
			dupResults++
		}
		if o.res.PossibleDuplicate {
			possDups++
		}
		// Every acknowledged message is stored, where its result says.
		copies := where[o.tid]
		if len(copies) == 0 && l.lostOK != nil && l.lostOK(o) {
			lost = append(lost, *o)
			continue
		}
		if len(copies) == 0 {
			v.add("acknowledged but not stored", "%s (id %s, %v, acked by %s of %s at queue %d offset %d, log offset %d, at %s)", o.tid, o.res.ID, o.rel,
				o.res.Broker, o.res.Group, o.res.Queue, o.res.QueueOffset, o.res.LogOffset, o.at.Format("15:04:05.000"))
			continue
		}
		// A recovered copy is where the new master appended it again, not
		// where the old master acknowledged it.
		if !(o.res.Duplicate && o.res.QueueOffset < 0) && !slices.ContainsFunc(copies, func(m storedMsg) bool { return m.recovered }) {
			q := int(o.res.Queue)
			if q >= len(queues) || o.res.QueueOffset < 0 || o.res.QueueOffset >= int64(len(queues[q])) || queues[q][o.res.QueueOffset].tid != o.tid {
				got := "nothing"
				if q < len(queues) && o.res.QueueOffset >= 0 && o.res.QueueOffset < int64(len(queues[q])) {
					got = queues[q][o.res.QueueOffset].tid
				}
				v.add("result's offset holds another message", "%s acked at queue %d offset %d (duplicate=%v), which holds %s", o.tid, o.res.Queue, o.res.QueueOffset, o.res.Duplicate, got)
			}
		}
		for _, m := range copies {
			if m.id != o.res.ID {
				v.add("stored with another id", "%s stored with id %s, result says %s", o.tid, m.id, o.res.ID)
			}
		}
		// The stored stamp is the one the result reports.
		if st := (protocol.ProducerStamp{ID: o.res.ProducerID, Epoch: o.res.Epoch, Seq: o.res.Seq}); !slices.ContainsFunc(copies, func(m storedMsg) bool {
			return m.queue == o.res.Queue && m.stamp == st
		}) {
			v.add("result's stamp not stored", "%s acked with stamp %+v in queue %d; stored %+v", o.tid, st, o.res.Queue, copies)
		}
	}

	// No message is stored twice unless its result said PossibleDuplicate.
	storedTwice, storedFailed := 0, 0
	for tid, copies := range where {
		if o := byTid[tid]; o != nil && o.err != nil {
			storedFailed++ // its outcome was unknown to the user: allowed
		}
		if len(copies) < 2 {
			continue
		}
		storedTwice++
		at := make([]string, len(copies))
		for i, m := range copies {
			at[i] = fmt.Sprintf("q%d@%d", m.queue, m.offset)
		}
		o := byTid[tid]
		switch {
		case o == nil:
			v.add("stored but never sent", "%s at %v", tid, at)
		case o.err == nil && o.res.PossibleDuplicate:
			possDupStoredTwice++
			l.flaggedTwice = append(l.flaggedTwice, flaggedCopies{*o, copies})
		case o.err != nil:
			v.add("stored twice", "%s at %v (failed: %v)", tid, at, o.err)
		default:
			v.add("stored twice", "%s at %v (acked at q%d@%d, duplicate=%v, possible duplicate=false)", tid, at, o.res.Queue, o.res.QueueOffset, o.res.Duplicate)
		}
	}

	// Per key, acknowledged messages are stored in one queue, in their send
	// order (first copies; second copies are counted above).
	type pos struct {
		queue  uint32
		offset int64
	}
	keyQueues := map[string]map[uint32]bool{}
	last := map[string]int{} // key -> last acknowledged seq seen in stored order, per queue below
	inversions := 0
	for _, q := range queues {
		seen := map[string]bool{}
		clear(last)
		for _, m := range q {
			o := byTid[m.tid]
			if o == nil || o.err != nil || o.key == "" || seen[m.tid] || m.recovered {
				continue
			}
			seen[m.tid] = true
			if keyQueues[o.key] == nil {
				keyQueues[o.key] = map[uint32]bool{}
			}
			keyQueues[o.key][m.queue] = true
			if prev, ok := last[o.key]; ok && o.seq < prev {
				inversions++
				v.add("key order broken", "queue %d offset %d: %s stored after %s/%d", m.queue, m.offset, m.tid, o.key, prev)
				continue
			}
			last[o.key] = o.seq
		}
	}
	splitKeys := 0
	for key, qs := range keyQueues {
		if len(qs) > 1 {
			splitKeys++
			v.add("key in several queues", "%s in queues %v", key, slices.Sorted(maps.Keys(qs)))
		}
	}

	// Per queue and producer (id, epoch), stored sequence numbers strictly
	// increase; every message carries a stamp.
	type prodQueue struct {
		id    uint64
		epoch uint16
		queue uint32
	}
	unstamped, seqGaps, recovered := 0, 0, 0
	producers := map[uint64]bool{}
	for _, q := range queues {
		lastSeq := map[prodQueue]pos{}
		seqOf := map[prodQueue]int64{}
		for _, m := range q {
			if m.stamp.IsZero() {
				unstamped++
				continue
			}
			if m.recovered {
				recovered++ // appended after what its queue took meanwhile, with its old stamp
				continue
			}
			producers[m.stamp.ID] = true
			k := prodQueue{m.stamp.ID, m.stamp.Epoch, m.queue}
			if p, ok := lastSeq[k]; ok {
				switch prev := seqOf[k]; {
				case m.stamp.Seq <= prev:
					v.add("producer sequence not increasing", "queue %d: seq %d at offset %d after seq %d at offset %d (producer %d epoch %d)",
						m.queue, m.stamp.Seq, m.offset, prev, p.offset, k.id, k.epoch)
					continue
				case m.stamp.Seq > prev+1:
					seqGaps++
				}
			}
			lastSeq[k], seqOf[k] = pos{m.queue, m.offset}, m.stamp.Seq
		}
	}
	l.recoveredN = recovered
	if unstamped > 0 {
		v.addN("unstamped messages", unstamped, "%d of %d stored messages carry no producer stamp", unstamped, stored)
	}

	// The longest wait between two acknowledgements.
	slices.SortFunc(ackTimes, func(a, b time.Time) int { return a.Compare(b) })
	var maxGap time.Duration
	for i := 1; i < len(ackTimes); i++ {
		maxGap = max(maxGap, ackTimes[i].Sub(ackTimes[i-1]))
	}
	brokerDups := int64(0)
	if gs, err := c.groups(); err == nil {
		for _, g := range gs {
			brokerDups += g.Last.Duplicates
		}
	}
	t.Logf("SUMMARY %s: sent=%d acked=%d failed=%d stored=%d stored-but-failed=%d stored-twice=%d (of which possible-duplicate=%d) "+
		"duplicate-results=%d possible-duplicate-results=%d broker-duplicates-absorbed=%d key-inversions=%d split-keys=%d "+
		"unstamped=%d producers=%d seq-gaps=%d recovered=%d max-ack-gap=%v acknowledged-lost-accepted=%d",
		name, len(outcomes), acked, failed, stored, storedFailed, storedTwice, possDupStoredTwice, dupResults, possDups, brokerDups,
		inversions, splitKeys, unstamped, len(producers), seqGaps, recovered, maxGap.Round(time.Millisecond), len(lost))
	for _, k := range slices.Sorted(maps.Keys(v.count)) {
		t.Errorf("%s: %d, e.g.\n\t%s", k, v.count[k], strings.Join(v.examples[k], "\n\t"))
	}
	return lost
}

// snapshot returns the outcomes recorded so far.
func (l *load) snapshot() []outcome {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.outcomes)
}

// arrivals counts acknowledgements: all, and unkeyed ones, with the first
// arrival of each (zero if none).
type arrivals struct {
	n, unkeyed          int
	first, firstUnkeyed time.Time
}

// acksFrom counts the acknowledgements from one broker (by address) of a
// group that arrived at or after since.
func (l *load) acksFrom(group, broker string, since time.Time) arrivals {
	l.mu.Lock()
	defer l.mu.Unlock()
	var a arrivals
	for i := range l.outcomes {
		o := &l.outcomes[i]
		if o.err != nil || o.res.Group != group || o.res.Broker != broker || o.at.Before(since) {
			continue
		}
		a.n++
		if a.first.IsZero() || o.at.Before(a.first) {
			a.first = o.at
		}
		if o.key == "" {
			a.unkeyed++
			if a.firstUnkeyed.IsZero() || o.at.Before(a.firstUnkeyed) {
				a.firstUnkeyed = o.at
			}
		}
	}
	return a
}

// longestWait is the longest time a message waited for its outcome among
// those whose wait overlapped [from, to]: for acknowledged messages, and
// for all (failures too).
func (l *load) longestWait(from, to time.Time) (acked, all time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := range l.outcomes {
		o := &l.outcomes[i]
		if o.sentAt.After(to) || o.at.Before(from) {
			continue
		}
		w := o.at.Sub(o.sentAt)
		all = max(all, w)
		if o.err == nil {
			acked = max(acked, w)
		}
	}
	return acked, all
}
