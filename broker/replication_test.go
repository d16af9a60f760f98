package broker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jonboulle/clockwork"

	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
	"github.com/ferrymq/ferrymq/storage"
)

// Replication without sockets: a master's replication and a slave's
// follower joined by an in-memory link, over two real commit logs.

func openLog(t *testing.T) *storage.Log {
	t.Helper()
	l, err := storage.Open(storage.Config{Dir: t.TempDir(), SegmentSize: 1 << 20, Logger: hclog.NewNullLogger(),
		Fingerprint: protocol.EncodedTagFingerprint})
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
func (c chanReplier) ReplyGiven(body []byte, release func()) error {
	err := c.Reply(body)
	release()
	return err
}

// memLink fetches by calling the master's handler directly.
type memLink struct{ r *replication }

func (l memLink) Fetch(ctx context.Context, req protocol.HAFetchRequest) (protocol.HAFetchResponse, func(), error) {
	rep := make(chanReplier, 1)
	l.r.handleFetch(rep, protocol.AppendHAFetchRequest(nil, &req))
	select {
	case a := <-rep:
		if a.err != nil {
			return protocol.HAFetchResponse{}, func() {}, a.err
		}
		resp, err := decodeFetchAnswer(req, a.body)
		return resp, func() {}, err
	case <-ctx.Done():
		return protocol.HAFetchResponse{}, func() {}, ctx.Err()
	}
}

// Ack hands an HA_ACK to the master and returns its refusal, if any.
func (l memLink) Ack(_ context.Context, a protocol.HAAck) error {
	rep := make(chanReplier, 1)
	l.r.handleAck(rep, protocol.AppendHAAck(nil, &a))
	return (<-rep).err
}

func (memLink) Close() error { return nil }

// The slave and epoch the test pairs run as.
const (
	testSlave = "g1-slave"
	testEpoch = 3
)

// fetchAt is a fetch from the pair's slave at offset, which it has appended.
func fetchAt(offset int64, wait uint32) []byte {
	return protocol.AppendHAFetchRequest(nil, &protocol.HAFetchRequest{Offset: offset, Acked: offset, MaxBytes: 1 << 20, WaitMillis: wait,
		Epoch: testEpoch, BrokerID: testSlave})
}

type replPair struct {
	master, slave *storage.Log
	repl          *replication
	stats         *Stats
	clock         *clockwork.FakeClock
	reg           *memRegistry
}

func newReplPair(t *testing.T) *replPair {
	p := &replPair{master: openLog(t), slave: openLog(t), stats: &Stats{}, clock: clockwork.NewFakeClock()}
	p.repl = newReplication(p.master, replConfig{HighWait: time.Second, FetchBytes: 64 << 10, FetchWait: 50 * time.Millisecond,
		SlaveLagTime: 2 * time.Second}, p.stats, p.clock, hclog.NewNullLogger(), nil)
	p.reg = newMemRegistry(testEpoch, testSlave)
	p.repl.alter = p.reg.alter
	p.repl.setGroup(p.reg.group(), testMaster)
	return p
}

const testMaster = "g1-master"

// memRegistry is the registry's side of a group for replication tests: it
// applies AlterSyncSet as the FSM does (compare-and-set on the epoch, the
// master and the set's version) and records what it took.
type memRegistry struct {
	mu      sync.Mutex
	g       routing.Group
	altered [][]string // every set it took, in order
}

// newMemRegistry is a group of testMaster and slaves in epoch, every slave
// in the sync set.
func newMemRegistry(epoch uint32, slaves ...string) *memRegistry {
	g := routing.Group{Name: "g1", Master: routing.Broker{ID: testMaster}, Epoch: epoch, SyncVersion: 1}
	for _, id := range slaves {
		g.Slaves = append(g.Slaves, routing.Broker{ID: id, Addr: id})
		g.InSync = append(g.InSync, id)
	}
	return &memRegistry{g: g}
}

func (m *memRegistry) group() routing.Group {
	m.mu.Lock()
	defer m.mu.Unlock()
	g := m.g
	g.Slaves, g.InSync, g.Eligible = slices.Clone(g.Slaves), slices.Clone(g.InSync), slices.Clone(g.Eligible)
	return g
}

// set changes the group as an operator or a failover would.
func (m *memRegistry) set(change func(g *routing.Group)) routing.Group {
	m.mu.Lock()
	change(&m.g)
	m.mu.Unlock()
	return m.group()
}

func (m *memRegistry) alter(_ context.Context, req api.AlterSyncSetRequest) (routing.Group, error) {
	m.mu.Lock()
	if req.Epoch != m.g.Epoch || req.Master != m.g.Master.ID || req.ExpectVersion != m.g.SyncVersion {
		m.mu.Unlock()
		return routing.Group{}, &protocol.Error{Status: protocol.StatusConflict, Message: "moved"}
	}
	// Eligible as the FSM keeps it: those leaving a set that falls below
	// the minimum.
	if len(req.InSync)+1 >= m.g.MinCopies() {
		m.g.Eligible = nil
	} else {
		for _, id := range m.g.InSync {
			if !slices.Contains(req.InSync, id) && !slices.Contains(m.g.Eligible, id) {
				m.g.Eligible = append(m.g.Eligible, id)
			}
		}
		m.g.Eligible = slices.DeleteFunc(m.g.Eligible, func(id string) bool { return slices.Contains(req.InSync, id) })
	}
	m.g.InSync = slices.Clone(req.InSync)
	m.g.SyncVersion++
	m.altered = append(m.altered, slices.Clone(req.InSync))
	m.mu.Unlock()
	return m.group(), nil
}

func (m *memRegistry) inSync() []string { return m.group().InSync }

// setEpoch is the registry's new epoch reaching the master.
func (p *replPair) setEpoch(e uint32) {
	p.repl.setGroup(p.reg.set(func(g *routing.Group) { g.Epoch = e }), testMaster)
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
	var early atomic.Int64 // released before the slave's log held them
	for range 10 {
		for _, pos := range p.append(t, 10) {
			p.repl.await(pos.End, func(st protocol.Status) {
				if p.slave.EndOffset() < pos.End {
					early.Add(1)
				}
				done <- st
			})
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
	if n := early.Load(); n > 0 {
		t.Fatalf("%d HIGH messages were acknowledged before the slave had appended them", n)
	}
}

// With an empty sync set HIGH is refused before it is stored. With a
// member that never fetches, a HIGH message waits its whole HighWait, as
// the clock moves, and then completes SLAVE_SYNC_TIMEOUT.
func TestReplicationHighTimesOutOnTheClock(t *testing.T) {
	p := newReplPair(t)
	p.repl.setGroup(p.reg.set(func(g *routing.Group) { g.InSync = nil; g.SyncVersion++ }), testMaster)
	if !p.repl.refusesHigh() {
		t.Fatal("an empty sync set: HIGH must be refused at once")
	}
	p.repl.setGroup(p.reg.set(func(g *routing.Group) { g.InSync = []string{testSlave}; g.SyncVersion++ }), testMaster)
	if p.repl.refusesHigh() {
		t.Fatal("a sync set of one slave: HIGH must be taken")
	}
	p.run(t, false)
	done := make(chan protocol.Status, 1)
	pos := p.append(t, 1)
	p.repl.await(pos[0].End, func(st protocol.Status) { done <- st })

	p.clock.Advance(time.Second) // exactly HighWait: not yet past it
	p.repl.step(context.Background())
	select {
	case st := <-done:
		t.Fatalf("completed %v before its deadline", st)
	default:
	}
	p.clock.Advance(time.Millisecond)
	p.repl.step(context.Background())
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
	p.repl.step(context.Background())
	select {
	case a := <-rep:
		t.Fatalf("answered a fetch with nothing to send: %+v", a)
	default:
	}
	p.append(t, 3)
	p.repl.step(context.Background())
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
	p.repl.step(context.Background())
	if a := <-rep; a.err != nil || len(a.body) != protocol.HAFetchResponseHeaderSize {
		t.Fatalf("expired parked fetch: %d bytes, %v", len(a.body), a.err)
	}
	if s := p.repl.state(); s.LagBytes != 0 || s.LagTime != 0 || !s.Connected {
		t.Fatalf("a slave that just fetched everything: %+v", s)
	}
	p.clock.Advance(time.Second)
	if p.repl.state().Connected {
		t.Fatal("a slave silent for a second still counts as connected")
	}

	// A slave ahead of its master holds records the master does not: its
	// log is not a prefix of the master's.
	p.repl.handleFetch(rep, fetchAt(end+1, 0))
	if a := <-rep; !errors.Is(a.err, protocol.ErrLogDiverged) {
		t.Fatalf("slave ahead of the master: %v", a.err)
	}
}

// Only the group's slave, in the master's epoch, is served and counted: a
// stranger's fetch or acknowledgement (another id, or the right id in
// another epoch) is refused and releases no HIGH message; a fetch from a
// newer epoch fences the master.
func TestReplicationServesOnlyItsSlave(t *testing.T) {
	p := newReplPair(t)
	sess := &haRecorder{}
	p.repl.sess = sess
	done := make(chan protocol.Status, 1)
	pos := p.append(t, 1)
	p.repl.await(pos[0].End, func(st protocol.Status) { done <- st })
	rep := make(chanReplier, 1)
	for _, f := range []protocol.HAFetchRequest{
		{Offset: pos[0].End, Acked: pos[0].End, BrokerID: "stranger", Epoch: testEpoch},
		{Offset: pos[0].End, Acked: pos[0].End, BrokerID: "", Epoch: testEpoch},
		{Offset: pos[0].End, Acked: pos[0].End, BrokerID: testSlave, Epoch: testEpoch - 1},
	} {
		p.repl.handleFetch(rep, protocol.AppendHAFetchRequest(nil, &f))
		if a := <-rep; !errors.Is(a.err, protocol.ErrNotAuthorized) {
			t.Fatalf("fetch %+v: %v, want NOT_AUTHORIZED", f, a.err)
		}
		ack := protocol.HAAck{Acked: f.Acked, Epoch: f.Epoch, BrokerID: f.BrokerID}
		if err := (memLink{p.repl}).Ack(context.Background(), ack); !errors.Is(err, protocol.ErrNotAuthorized) {
			t.Fatalf("ack %+v: %v, want NOT_AUTHORIZED", ack, err)
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
	if got := p.stats.HAFetchRefused.Load(); got != 6 {
		t.Fatalf("HAFetchRefused %d, want 6", got)
	}
	// The fetches and acks in this epoch from brokers it does not know make
	// the master ask the registry (a former master may just have rejoined).
	if sess.kicks != 4 {
		t.Fatalf("the registry was asked %d times, want 4", sess.kicks)
	}
	newer := protocol.HAFetchRequest{Offset: 0, BrokerID: testSlave, Epoch: testEpoch + 1}
	p.repl.handleFetch(rep, protocol.AppendHAFetchRequest(nil, &newer))
	if a := <-rep; !errors.Is(a.err, protocol.ErrNotMaster) {
		t.Fatalf("fetch from a newer epoch: %v, want NOT_MASTER", a.err)
	}
	if len(sess.fenced) == 0 || sess.fenced[len(sess.fenced)-1] != testEpoch+1 {
		t.Fatalf("the master was not shown the newer epoch: %v", sess.fenced)
	}
	// The real slave releases it (its fetch, with nothing new, is parked
	// and answered empty once its wait passes).
	p.repl.handleFetch(rep, fetchAt(pos[0].End, 0))
	p.clock.Advance(time.Millisecond)
	p.repl.step(context.Background())
	if a := <-rep; a.err != nil {
		t.Fatal(a.err)
	}
	if st := <-done; st != protocol.StatusOK {
		t.Fatalf("HIGH after the slave's fetch: %v", st)
	}
}

// haRecorder records what replication tells its session.
type haRecorder struct {
	fenced []uint32
	kicks  int
}

func (h *haRecorder) fence(e uint32) { h.fenced = append(h.fenced, e) }
func (h *haRecorder) kick()          { h.kicks++ }

// gatedLog is a slave's log whose appends the test holds: while hold is
// set, an append announces its offset on entered and waits for the test's
// word on gate (true: append; false: fail without appending, as a process
// that dies before its write). After stop closes, appends fail; after
// stopped is set, any append is an error of the follower.
type gatedLog struct {
	*storage.Log
	t       *testing.T
	hold    atomic.Bool
	stopped atomic.Bool
	entered chan int64
	gate    chan bool
	stop    chan struct{}
}

var errAppendGated = errors.New("append failed (test)")

func newGatedLog(t *testing.T, l *storage.Log) *gatedLog {
	g := &gatedLog{Log: l, t: t, entered: make(chan int64), gate: make(chan bool), stop: make(chan struct{})}
	g.hold.Store(true)
	return g
}

func (g *gatedLog) AppendRaw(offset int64, data []byte, flush bool) (int64, error) {
	if g.stopped.Load() {
		g.t.Errorf("an append at %d after its follower stopped", offset)
	}
	if g.hold.Load() {
		select {
		case g.entered <- offset:
		case <-g.stop:
			return 0, errAppendGated
		}
		select {
		case ok := <-g.gate:
			if !ok {
				return 0, errAppendGated
			}
		case <-g.stop:
			return 0, errAppendGated
		}
	}
	return g.Log.AppendRaw(offset, data, flush)
}

// ackLink is a memLink that reports each HA_ACK's outcome on acks.
type ackLink struct {
	memLink
	acks chan error
}

func (l ackLink) Ack(ctx context.Context, a protocol.HAAck) error {
	err := l.memLink.Ack(ctx, a)
	l.acks <- err
	return err
}

// follow starts a follower of the pair's master at epoch over link, with
// log as the slave's log; stop cancels it and returns once it has stopped
// (it is also called at cleanup, after a gated log's stop closed).
func (p *replPair) follow(t *testing.T, log slaveLog, epoch uint32, link masterLink) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	f := &follower{id: testSlave, epoch: epoch, addr: "memory", log: log, dial: func(string) masterLink { return link },
		fetchBytes: 64 << 10, fetchWait: 50 * time.Millisecond, clock: p.clock, lg: hclog.NewNullLogger()}
	go func() { f.run(ctx); close(done) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	if g, ok := log.(*gatedLog); ok {
		t.Cleanup(func() { close(g.stop) }) // runs first: a held append fails
	}
	return stop
}

// runRepl runs r's loop until the test ends.
func runRepl(t *testing.T, r *replication) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// parkedFrom reports whether r holds a fetch parked at offset.
func parkedFrom(r *replication, offset int64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.parked {
		if p.fetch.Offset == offset {
			return true
		}
	}
	return false
}

// highWaits registers every position as a HIGH message on r; each outcome
// arrives on the returned channel, and a release before log held the
// message is an error of the test.
func highWaits(t *testing.T, r *replication, log *storage.Log, pos []storage.Position) <-chan protocol.Status {
	done := make(chan protocol.Status, len(pos))
	for _, p := range pos {
		r.await(p.End, func(st protocol.Status) {
			if st == protocol.StatusOK && log.EndOffset() < p.End {
				t.Errorf("a HIGH message ending at %d was acknowledged with the slave's log ending at %d", p.End, log.EndOffset())
			}
			done <- st
		})
	}
	return done
}

func expectAll(t *testing.T, done <-chan protocol.Status, n int, want protocol.Status) {
	t.Helper()
	for i := range n {
		if st := <-done; st != want {
			t.Fatalf("HIGH message %d: %v, want %v", i, st, want)
		}
	}
}

func expectNone(t *testing.T, done <-chan protocol.Status, what string) {
	t.Helper()
	select {
	case st := <-done:
		t.Fatalf("%s: a HIGH message completed %v", what, st)
	default:
	}
}

// The slave fetches the next bytes while it still appends the last ones,
// and the master counts only what the slave reports appended: a HIGH
// message whose bytes the slave has received, and asked past, is not
// acknowledged until its append is done.
func TestHighIsAckedOnlyOnceTheSlaveAppendedIt(t *testing.T) {
	p := newReplPair(t)
	p.run(t, false)
	g := newGatedLog(t, p.slave)
	p.follow(t, g, testEpoch, memLink{p.repl})
	pos := p.append(t, 3)
	done := highWaits(t, p.repl, p.slave, pos)
	end := pos[len(pos)-1].End

	if off := <-g.entered; off != 0 {
		t.Fatalf("the slave appends at %d, want 0", off)
	}
	// The pipelined fetch: from past the message, sent during its append.
	testwait.For(t, 5*time.Second, "a fetch from the end of the messages, parked", func() bool { return parkedFrom(p.repl, end) })
	expectNone(t, done, "the slave received the messages but has not appended them")
	if s := p.repl.state(); s.AckOffset != 0 || s.LagBytes != end {
		t.Fatalf("slave state %+v with nothing appended", s)
	}

	g.gate <- true
	expectAll(t, done, len(pos), protocol.StatusOK)
	if s := p.repl.state(); s.AckOffset != end || s.LagBytes != 0 {
		t.Fatalf("slave state %+v after its append", s)
	}
	// The slave told the master right after its append (an HA_ACK), not
	// with a fetch: its only fetch is the one still parked.
	if !parkedFrom(p.repl, end) {
		t.Fatal("the parked fetch was answered: the acknowledgement came from a new fetch")
	}
}

// A slave that dies in the middle of its pipeline (an append in progress, a
// fetch from past it parked at the master) and starts again copies from its
// own log end: what it had received but not appended is fetched again, and
// no HIGH message is acknowledged for bytes it lost.
func TestPipelineAcrossASlaveRestart(t *testing.T) {
	p := newReplPair(t)
	p.run(t, false)
	g := newGatedLog(t, p.slave)
	stop := p.follow(t, g, testEpoch, memLink{p.repl})

	first := p.append(t, 5)
	done := highWaits(t, p.repl, p.slave, first)
	<-g.entered
	g.gate <- true
	expectAll(t, done, len(first), protocol.StatusOK)
	appended := p.slave.EndOffset()

	second := p.append(t, 5)
	done = highWaits(t, p.repl, p.slave, second)
	if off := <-g.entered; off != appended {
		t.Fatalf("the slave appends at %d, want %d", off, appended)
	}
	testwait.For(t, 5*time.Second, "the pipelined fetch parked", func() bool { return parkedFrom(p.repl, second[len(second)-1].End) })
	g.gate <- false // the process dies before its write
	stop()
	g.stopped.Store(true)
	if p.slave.EndOffset() != appended || p.repl.state().AckOffset != appended {
		t.Fatalf("after the crash: slave end %d, acknowledged %d; want %d", p.slave.EndOffset(), p.repl.state().AckOffset, appended)
	}
	expectNone(t, done, "the slave lost the append")

	// Restarted: a new follower on the same log, as the broker's role loop
	// starts one.
	third := p.append(t, 5)
	done3 := highWaits(t, p.repl, p.slave, third)
	p.follow(t, p.slave, testEpoch, memLink{p.repl})
	expectAll(t, done, len(second), protocol.StatusOK)
	expectAll(t, done3, len(third), protocol.StatusOK)
	if !bytes.Equal(rawLog(t, p.master), rawLog(t, p.slave)) {
		t.Fatal("the slave's log differs from the master's")
	}
}

// An append that completes after the group moved to a new epoch is
// acknowledged in the old one, and the master, now serving the new epoch,
// refuses that acknowledgement (and the old follower's next fetch); the
// follower of the new epoch starts from the slave's log end and its first
// fetch acknowledges what the slave holds.
func TestPipelineAcrossAnEpochChange(t *testing.T) {
	p := newReplPair(t)
	p.run(t, false)
	g := newGatedLog(t, p.slave)
	acks := make(chan error, 16)
	stop := p.follow(t, g, testEpoch, ackLink{memLink{p.repl}, acks})
	pos := p.append(t, 3)
	done := highWaits(t, p.repl, p.slave, pos)
	end := pos[len(pos)-1].End
	<-g.entered
	testwait.For(t, 5*time.Second, "the pipelined fetch parked", func() bool { return parkedFrom(p.repl, end) })

	p.setEpoch(testEpoch + 1) // the registry's new epoch reaches the master
	g.gate <- true
	if err := <-acks; !errors.Is(err, protocol.ErrNotAuthorized) {
		t.Fatalf("an acknowledgement from the old epoch: %v, want NOT_AUTHORIZED", err)
	}
	expectNone(t, done, "the acknowledgement came in the old epoch")
	if s := p.repl.state(); s.AckOffset != 0 {
		t.Fatalf("an acknowledgement from the old epoch counted: %+v", s)
	}
	stop()
	g.stopped.Store(true)

	p.follow(t, p.slave, testEpoch+1, memLink{p.repl})
	expectAll(t, done, len(pos), protocol.StatusOK)
	more := p.append(t, 3)
	expectAll(t, highWaits(t, p.repl, p.slave, more), len(more), protocol.StatusOK)
	if !bytes.Equal(rawLog(t, p.master), rawLog(t, p.slave)) {
		t.Fatal("the slave's log differs from the master's")
	}
}

// A slave that rejoins under a new master cuts its log back to where the
// new epoch began (records the new master never had go) and copies from
// there; its old follower, stopped first with an append in progress, ends
// only once that append is done, and appends nothing after. The new
// master's HIGH messages are acknowledged only once the slave, cut back,
// has appended them.
func TestPipelineAcrossATruncation(t *testing.T) {
	p := newReplPair(t)
	p.run(t, false)
	g := newGatedLog(t, p.slave)
	stop := p.follow(t, g, testEpoch, memLink{p.repl})
	common := p.append(t, 4)
	<-g.entered
	g.gate <- true
	cut := common[len(common)-1].End
	testwait.For(t, 5*time.Second, "the slave to hold the common records", func() bool { return p.slave.EndOffset() == cut })

	// Records of the old epoch that the next master will not have: the
	// role loop stops the follower in the middle of their append.
	lost := p.append(t, 4)
	<-g.entered
	testwait.For(t, 5*time.Second, "the pipelined fetch parked", func() bool { return parkedFrom(p.repl, lost[len(lost)-1].End) })
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	g.gate <- true // the append in progress completes: stop waits for it
	<-stopped
	g.stopped.Store(true)
	if p.slave.EndOffset() != lost[len(lost)-1].End {
		t.Fatalf("slave end %d after its follower stopped, want %d", p.slave.EndOffset(), lost[len(lost)-1].End)
	}

	// The new master holds the common records and then its own.
	next := openLog(t)
	if _, err := next.AppendRaw(0, rawLog(t, p.master)[:cut], false); err != nil {
		t.Fatal(err)
	}
	entries := []storage.Entry{{Topic: "t", Queue: 0, Payload: []byte("new epoch")}, {Topic: "t", Queue: 1, Payload: []byte("new epoch")}}
	newPos, err := next.Append(entries, false)
	if err != nil {
		t.Fatal(err)
	}
	repl2 := newReplication(next, p.repl.cfg, &Stats{}, p.clock, hclog.NewNullLogger(), nil)
	repl2.setGroup(newMemRegistry(testEpoch+1, testSlave).group(), testMaster)
	runRepl(t, repl2)
	done := highWaits(t, repl2, p.slave, newPos)

	res, err := p.slave.Truncate(cut, t.TempDir()+"/cut.log")
	if err != nil || res.From != cut {
		t.Fatalf("truncate at %d: %+v, %v", cut, res, err)
	}
	p.follow(t, p.slave, testEpoch+1, memLink{repl2})
	expectAll(t, done, len(newPos), protocol.StatusOK)
	if !bytes.Equal(rawLog(t, next), rawLog(t, p.slave)) {
		t.Fatal("the slave's log differs from the new master's")
	}
}

// A slave whose appends stall (a stuck disk) delays nobody but its HIGH
// messages: the master keeps appending, and they time out on the clock
// with SLAVE_SYNC_TIMEOUT; with its pipeline full the slave stops fetching,
// its lag grows past the lag time, the master takes it out of the sync set
// through the registry, and later HIGH messages are refused at once (one
// copy is below the minimum of two). Once the disk moves again the slave
// catches up, the master puts it back, and HIGH messages are acknowledged.
func TestStalledSlaveTimesHighOutAndBlocksNothing(t *testing.T) {
	p := newReplPair(t)
	p.run(t, false)
	g := newGatedLog(t, p.slave)
	p.follow(t, g, testEpoch, memLink{p.repl})
	pos := p.append(t, 1)
	done := highWaits(t, p.repl, p.slave, pos)
	<-g.entered // the slave's disk stalls in this append

	// NORMAL appends go on, each waking the replication loop.
	for range 20 {
		p.append(t, 50)
	}
	p.clock.Advance(time.Second + time.Millisecond) // past HighWait, within the lag time
	p.repl.step(context.Background())
	expectAll(t, done, 1, protocol.StatusSlaveSyncTimeout)
	if in := p.reg.inSync(); len(in) != 1 || p.repl.refusesHigh() {
		t.Fatalf("within the lag time the slave left the set: %v", in)
	}
	p.clock.Advance(time.Second) // past the lag time
	testwait.For(t, 5*time.Second, "the master to take the slave out of the set", func() bool {
		p.repl.step(context.Background())
		return p.repl.refusesHigh()
	})
	if s := p.repl.state(); s.AckOffset != 0 || s.LagTime <= 2*time.Second || len(p.reg.inSync()) != 0 {
		t.Fatalf("a slave stuck in its first append: %+v, set %v", s, p.reg.inSync())
	}

	g.hold.Store(false)
	g.gate <- true
	end := p.master.EndOffset()
	testwait.For(t, 5*time.Second, "the slave to catch up", func() bool { return p.repl.state().AckOffset == end })
	testwait.For(t, 5*time.Second, "the master to put the slave back", func() bool {
		p.repl.step(context.Background())
		return !p.repl.refusesHigh()
	})
	if in := p.reg.inSync(); len(in) != 1 || in[0] != testSlave {
		t.Fatalf("the set after the slave caught up: %v", in)
	}
	more := p.append(t, 3)
	expectAll(t, highWaits(t, p.repl, p.slave, more), len(more), protocol.StatusOK)
}

// An acknowledgement past the master's log end counts for nothing.
func TestReplicationRefusesAnAckPastItsEnd(t *testing.T) {
	p := newReplPair(t)
	pos := p.append(t, 1)
	done := highWaits(t, p.repl, p.slave, pos)
	err := (memLink{p.repl}).Ack(context.Background(), protocol.HAAck{Acked: pos[0].End + 1, Epoch: testEpoch, BrokerID: testSlave})
	if !errors.Is(err, protocol.ErrInvalid) {
		t.Fatalf("an ack past the master's end: %v, want INVALID", err)
	}
	expectNone(t, done, "an ack past the master's end")
	if s := p.repl.state(); s.AckOffset != 0 {
		t.Fatalf("the ack counted: %+v", s)
	}
}

// BenchmarkReplicationHigh measures HIGH messages through a master's
// replication and a slave's follower joined by the real transport on
// loopback, over two real commit logs: 16 writers each append batches of
// 64 messages of 1 KiB to the master's log and wait until the slave has
// acknowledged the whole batch (1024 messages in flight, as BenchmarkSend's
// HIGH case), without the send path. b.N counts messages. "serial" is the
// protocol before the pipeline (fetch, append, fetch again: the next fetch
// is the acknowledgement); "pipelined" overlaps the slave's append with the
// next transfer and acknowledges each append at once; the size is the most
// one fetch asks for.
//
//	go test -run '^$' -bench BenchmarkReplicationHigh -benchtime 200000x ./broker
func BenchmarkReplicationHigh(b *testing.B) {
	for _, tc := range []struct {
		name   string
		serial bool
		chunk  int
	}{
		{"serial-4MiB", true, 4 << 20},
		{"pipelined-4MiB", false, 4 << 20},
		{"serial-1MiB", true, 1 << 20},
		{"pipelined-1MiB", false, 1 << 20},
	} {
		b.Run(tc.name, func(b *testing.B) { benchReplication(b, tc.serial, tc.chunk) })
	}
}

// processCPU is the CPU time (user and system) this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func benchReplication(b *testing.B, serial bool, chunk int) {
	open := func() *storage.Log {
		l, err := storage.Open(storage.Config{Dir: b.TempDir(), SegmentSize: 256 << 20, Logger: hclog.NewNullLogger()})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = l.Close() })
		return l
	}
	master, slave := open(), open()
	clock := clockwork.NewRealClock()
	repl := newReplication(master, replConfig{HighWait: 10 * time.Second, FetchBytes: 4 << 20, FetchWait: 100 * time.Millisecond,
		SlaveLagTime: time.Minute}, &Stats{}, clock, hclog.NewNullLogger(), nil)
	repl.setGroup(newMemRegistry(testEpoch, testSlave).group(), testMaster)
	srv := transport.NewServer(transport.ServerConfig{Workers: 2, MaxWriteBuffer: haWriteBuffer(4 << 20)})
	srv.HandleWithReply(protocol.CodeHAFetch, func(r *transport.Request) { repl.handleFetch(r, r.Body) },
		func([]byte) int { return haAnswerSize(4 << 20) })
	srv.Handle(protocol.CodeHAAck, func(r *transport.Request) { repl.handleAck(r, r.Body) })
	addr, err := srv.Listen("127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); repl.run(ctx) }()
	f := &follower{id: testSlave, epoch: testEpoch, addr: addr.String(), log: slave, dial: dialMaster, fetchBytes: chunk, serial: serial, fetchWait: 100 * time.Millisecond, clock: clock, lg: hclog.NewNullLogger()}
	go func() { defer wg.Done(); f.run(ctx) }()
	b.Cleanup(func() {
		cancel()
		wg.Wait()
		_ = srv.Close()
	})

	const writers, batch = 16, 64
	payload := make([]byte, 1024)
	entries := make([]storage.Entry, batch)
	for i := range entries {
		entries[i] = storage.Entry{Topic: "bench", Queue: uint32(i % 8), Payload: payload}
	}
	batches := (b.N + batch - 1) / batch
	var next atomic.Int64
	lat := make([][]time.Duration, writers)
	b.SetBytes(1024)
	b.ResetTimer()
	start, cpu0 := time.Now(), processCPU()
	var ws sync.WaitGroup
	for w := range writers {
		ws.Add(1)
		go func() {
			defer ws.Done()
			done := make(chan protocol.Status, batch)
			for next.Add(1) <= int64(batches) {
				t0 := time.Now()
				pos, err := master.Append(entries, false)
				if err != nil {
					b.Error(err)
					return
				}
				repl.notify()
				for _, p := range pos {
					repl.await(p.End, func(st protocol.Status) { done <- st })
				}
				for range pos {
					if st := <-done; st != protocol.StatusOK {
						b.Errorf("HIGH: %v", st)
						return
					}
				}
				lat[w] = append(lat[w], time.Since(t0))
			}
		}()
	}
	ws.Wait()
	elapsed, cpu := time.Since(start), processCPU()-cpu0
	b.StopTimer()
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	slices.Sort(all)
	if len(all) > 0 {
		b.ReportMetric(float64(len(all)*batch)/elapsed.Seconds(), "msgs/s")
		b.ReportMetric(float64(all[len(all)/2].Microseconds()), "p50-µs")
		b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-µs")
		// The master's and the slave's CPU (one process) per message.
		b.ReportMetric(float64(cpu.Nanoseconds())/float64(len(all)*batch), "cpu-ns/msg")
	}
}
