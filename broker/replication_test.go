package broker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/storage"
)

// Replication without sockets: a master's replication and a slave's
// follower joined by an in-memory link, over two real commit logs.

func openLog(t *testing.T) *storage.Log {
	t.Helper()
	l, err := storage.Open(storage.Config{Dir: t.TempDir(), SegmentSize: 1 << 20, Logger: hclog.NewNullLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// chanReplier is a replier whose answer arrives on a channel.
type chanReplier chan reply

type reply struct {
	body []byte
	err  error
}

func (c chanReplier) Reply(body []byte) error {
	c <- reply{body: append([]byte(nil), body...)}
	return nil
}
func (c chanReplier) ReplyError(err error) { c <- reply{err: err} }

// memLink fetches by calling the master's handler directly.
type memLink struct{ r *replication }

func (l memLink) Fetch(ctx context.Context, req protocol.HAFetchRequest) (protocol.HAFetchResponse, error) {
	rep := make(chanReplier, 1)
	l.r.handleFetch(rep, protocol.AppendHAFetchRequest(nil, &req))
	select {
	case a := <-rep:
		if a.err != nil {
			return protocol.HAFetchResponse{}, a.err
		}
		return protocol.DecodeHAFetchResponse(a.body)
	case <-ctx.Done():
		return protocol.HAFetchResponse{}, ctx.Err()
	}
}

func (memLink) Close() error { return nil }

// The slave and epoch the test pairs run as.
const (
	testSlave = "g1-slave"
	testEpoch = 3
)

// fetchAt is a fetch from the pair's slave at offset.
func fetchAt(offset int64, wait uint32) []byte {
	return protocol.AppendHAFetchRequest(nil, &protocol.HAFetchRequest{Offset: offset, MaxBytes: 1 << 20, WaitMillis: wait,
		Epoch: testEpoch, BrokerID: testSlave})
}

type replPair struct {
	master, slave *storage.Log
	repl          *replication
	stats         *Stats
	clock         *clockwork.FakeClock
}

func newReplPair(t *testing.T) *replPair {
	p := &replPair{master: openLog(t), slave: openLog(t), stats: &Stats{}, clock: clockwork.NewFakeClock()}
	p.repl = newReplication(p.master, replConfig{HighWait: time.Second, FetchBytes: 64 << 10, FetchWait: 50 * time.Millisecond,
		SlaveLagBytes: 1 << 20, SlaveLagTime: time.Second}, p.stats, p.clock, hclog.NewNullLogger(), nil)
	p.repl.setSlave(testSlave, testEpoch)
	return p
}

// run starts the replication loop, and the follower when follow is set.
func (p *replPair) run(t *testing.T, follow bool) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	go func() { p.repl.run(ctx); done <- struct{}{} }()
	n := 1
	if follow {
		n = 2
		f := &follower{id: testSlave, epoch: testEpoch, addr: "memory", log: p.slave, dial: func(string) masterLink { return memLink{p.repl} },
			fetchBytes: 64 << 10, fetchWait: 50 * time.Millisecond, clock: p.clock, lg: hclog.NewNullLogger()}
		go func() { f.run(ctx); done <- struct{}{} }()
	}
	t.Cleanup(func() {
		cancel()
		for range n {
			<-done
		}
	})
}

func (p *replPair) append(t *testing.T, n int) []storage.Position {
	t.Helper()
	entries := make([]storage.Entry, n)
	for i := range entries {
		entries[i] = storage.Entry{Topic: "t", Queue: 0, Payload: []byte(fmt.Sprintf("message %d", i))}
	}
	pos, err := p.master.Append(entries, false)
	if err != nil {
		t.Fatal(err)
	}
	p.repl.notify()
	return pos
}

func rawLog(t *testing.T, l *storage.Log) []byte {
	t.Helper()
	raw, err := l.ReadRaw(0, int(l.EndOffset())+1)
	if err != nil && l.EndOffset() > 0 {
		t.Fatal(err)
	}
	return raw
}

// The follower copies the master's log byte for byte, and each HIGH
// message completes OK once the slave's fetch acknowledges its end.
func TestReplicationCopiesAndReleasesHigh(t *testing.T) {
	p := newReplPair(t)
	p.run(t, true)
	done := make(chan protocol.Status, 100)
	for range 10 {
		for _, pos := range p.append(t, 10) {
			p.repl.await(pos.End, func(st protocol.Status) { done <- st })
		}
	}
	for i := range 100 {
		if st := <-done; st != protocol.StatusOK {
			t.Fatalf("HIGH message %d: %v", i, st)
		}
	}
	// Every waiter was released by an acknowledgement, so the slave has
	// at least everything they covered.
	if s := p.repl.state(); s.AckOffset != p.master.EndOffset() || !s.Connected {
		t.Fatalf("slave state %+v, master end %d", s, p.master.EndOffset())
	}
	if !bytes.Equal(rawLog(t, p.master), rawLog(t, p.slave)[:p.master.EndOffset()]) {
		t.Fatal("the slave's log differs from the master's")
	}
	if got := p.stats.HighAcked.Load(); got != 100 {
		t.Fatalf("HighAcked %d, want 100", got)
	}
}

// With no slave, a HIGH message waits its whole HighWait, as the clock
// moves, and then completes SLAVE_SYNC_TIMEOUT; a slave never seen counts
// as lagging.
func TestReplicationHighTimesOutOnTheClock(t *testing.T) {
	p := newReplPair(t)
	p.run(t, false)
	if !p.repl.lagging() {
		t.Fatal("no slave ever fetched: HIGH must be refused at once")
	}
	done := make(chan protocol.Status, 1)
	pos := p.append(t, 1)
	p.repl.await(pos[0].End, func(st protocol.Status) { done <- st })

	p.clock.Advance(time.Second) // exactly HighWait: not yet past it
	p.repl.step()
	select {
	case st := <-done:
		t.Fatalf("completed %v before its deadline", st)
	default:
	}
	p.clock.Advance(time.Millisecond)
	p.repl.step()
	if st := <-done; st != protocol.StatusSlaveSyncTimeout {
		t.Fatalf("HIGH without a slave: %v", st)
	}
	if p.stats.HighTimeouts.Load() != 1 {
		t.Fatalf("HighTimeouts %d", p.stats.HighTimeouts.Load())
	}
}

// A fetch with nothing new is parked, and answered when data arrives, or
// empty when its wait passes; a slave that stops fetching counts as gone.
func TestReplicationParksFetches(t *testing.T) {
	p := newReplPair(t)
	rep := make(chanReplier, 1)
	p.repl.handleFetch(rep, fetchAt(0, 100))
	p.repl.step()
	select {
	case a := <-rep:
		t.Fatalf("answered a fetch with nothing to send: %+v", a)
	default:
	}
	p.append(t, 3)
	p.repl.step()
	a := <-rep
	if a.err != nil {
		t.Fatal(a.err)
	}
	fr, err := protocol.DecodeHAFetchResponse(a.body)
	if err != nil || fr.MasterEnd != p.master.EndOffset() || int64(len(fr.Records)) != p.master.EndOffset() || fr.Epoch != testEpoch {
		t.Fatalf("answer: end %d, %d bytes, %v; master end %d", fr.MasterEnd, len(fr.Records), err, p.master.EndOffset())
	}

	end := p.master.EndOffset()
	p.repl.handleFetch(rep, fetchAt(end, 100))
	p.clock.Advance(101 * time.Millisecond)
	p.repl.step()
	if a := <-rep; a.err != nil || len(a.body) != protocol.HAFetchResponseHeaderSize {
		t.Fatalf("expired parked fetch: %d bytes, %v", len(a.body), a.err)
	}
	if p.repl.lagging() {
		t.Fatal("a slave that just fetched everything is not lagging")
	}
	p.clock.Advance(time.Second)
	if p.repl.state().Connected {
		t.Fatal("a slave silent for a second still counts as connected")
	}

	// A slave ahead of its master is refused with a clear error.
	p.repl.handleFetch(rep, fetchAt(end+1, 0))
	if a := <-rep; !errors.Is(a.err, protocol.ErrInvalid) {
		t.Fatalf("slave ahead of the master: %v", a.err)
	}
}

// Only the group's slave, in the master's epoch, is served and counted: a
// stranger's fetch (another id, or the right id in another epoch) is
// refused and releases no HIGH message; a fetch from a newer epoch fences
// the master.
func TestReplicationServesOnlyItsSlave(t *testing.T) {
	p := newReplPair(t)
	var fenced []uint32
	p.repl.fence = func(e uint32) { fenced = append(fenced, e) }
	unknown := 0
	p.repl.unknownSlave = func() { unknown++ }
	done := make(chan protocol.Status, 1)
	pos := p.append(t, 1)
	p.repl.await(pos[0].End, func(st protocol.Status) { done <- st })
	rep := make(chanReplier, 1)
	for _, f := range []protocol.HAFetchRequest{
		{Offset: pos[0].End, BrokerID: "stranger", Epoch: testEpoch},
		{Offset: pos[0].End, BrokerID: "", Epoch: testEpoch},
		{Offset: pos[0].End, BrokerID: testSlave, Epoch: testEpoch - 1},
	} {
		p.repl.handleFetch(rep, protocol.AppendHAFetchRequest(nil, &f))
		if a := <-rep; !errors.Is(a.err, protocol.ErrNotAuthorized) {
			t.Fatalf("fetch %+v: %v, want NOT_AUTHORIZED", f, a.err)
		}
	}
	select {
	case st := <-done:
		t.Fatalf("a stranger's fetch released a HIGH message: %v", st)
	default:
	}
	if s := p.repl.state(); s.AckOffset != 0 || s.Connected {
		t.Fatalf("a stranger's fetch counted: %+v", s)
	}
	if got := p.stats.HAFetchRefused.Load(); got != 3 {
		t.Fatalf("HAFetchRefused %d, want 3", got)
	}
	// The two fetches in this epoch from brokers it does not know make the
	// master ask the registry (a former master may just have rejoined).
	if unknown != 2 {
		t.Fatalf("the registry was asked %d times, want 2", unknown)
	}
	newer := protocol.HAFetchRequest{Offset: 0, BrokerID: testSlave, Epoch: testEpoch + 1}
	p.repl.handleFetch(rep, protocol.AppendHAFetchRequest(nil, &newer))
	if a := <-rep; !errors.Is(a.err, protocol.ErrNotMaster) {
		t.Fatalf("fetch from a newer epoch: %v, want NOT_MASTER", a.err)
	}
	if len(fenced) == 0 || fenced[len(fenced)-1] != testEpoch+1 {
		t.Fatalf("the master was not shown the newer epoch: %v", fenced)
	}
	// The real slave releases it (its fetch, with nothing new, is parked
	// and answered empty once its wait passes).
	p.repl.handleFetch(rep, fetchAt(pos[0].End, 0))
	p.clock.Advance(time.Millisecond)
	p.repl.step()
	if a := <-rep; a.err != nil {
		t.Fatal(a.err)
	}
	if st := <-done; st != protocol.StatusOK {
		t.Fatalf("HIGH after the slave's fetch: %v", st)
	}
}
