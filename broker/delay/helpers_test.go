package delay

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/storage"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// tb is what the helpers need of a *testing.T or a *rapid.T.
type tb interface {
	Helper()
	Fatalf(format string, args ...any)
}

func openTestLog(t tb, dir string, segSize int64) *storage.Log {
	t.Helper()
	l, err := storage.Open(storage.Config{Dir: dir, SegmentSize: segSize, FlushInterval: time.Hour, Pretouch: -1})
	if err != nil {
		t.Fatalf("open log: %v", err)
	}
	return l
}

// encode makes the payload of a record of topic/queue with sc (and body).
func encode(topic string, queue uint32, sc protocol.Schedule, body []byte) []byte {
	m := protocol.Message{ID: "m", Topic: topic, Queue: queue, Timestamp: 1, Schedule: sc, Body: body}
	return protocol.AppendMessage(nil, &m)
}

func delayedEntry(topic string, queue uint32, dueAt, ref int64) storage.Entry {
	return storage.Entry{Topic: protocol.DelayTopic(topic), Queue: queue,
		Payload: encode(topic, queue, protocol.Schedule{Kind: protocol.ScheduleDelayed, At: dueAt, Ref: ref}, []byte("body"))}
}

// movedEntry is what retention's move of the pending record at ref
// appends: the message again, naming ref, with its origin (the first
// pending record) as a property.
func movedEntry(topic string, queue uint32, dueAt, ref, origin int64) storage.Entry {
	m := protocol.Message{ID: "m", Topic: topic, Queue: queue, Timestamp: 1, Body: []byte("body"),
		Schedule:   protocol.Schedule{Kind: protocol.ScheduleDelayed, At: dueAt, Ref: ref},
		Properties: []protocol.Property{{Key: protocol.DelayedOriginProperty, Value: fmt.Sprint(origin)}}}
	return storage.Entry{Topic: protocol.DelayTopic(topic), Queue: queue, Payload: protocol.AppendMessage(nil, &m)}
}

// releaseEntries is what the broker appends to release the entry e: the
// released copy and the release mark, in one append.
func releaseEntries(e Entry) []storage.Entry {
	rel := storage.Entry{Topic: e.Topic, Queue: e.Queue,
		Payload: encode(e.Topic, e.Queue, protocol.Schedule{Kind: protocol.ScheduleReleased, At: e.DueAt, Ref: e.At}, []byte("body"))}
	var size [4]byte
	binary.BigEndian.PutUint32(size[:], uint32(storage.RecordSize(rel.Topic, len(rel.Payload))))
	mark := storage.Entry{Topic: protocol.DelayTopic(e.Topic), Queue: e.Queue,
		Payload: encode(e.Topic, e.Queue, protocol.Schedule{Kind: protocol.ScheduleReleaseMark, At: e.DueAt, Ref: e.At}, size[:])}
	return []storage.Entry{rel, mark}
}

func cancelEntry(e Entry) storage.Entry {
	return storage.Entry{Topic: protocol.DelayTopic(e.Topic), Queue: e.Queue,
		Payload: encode(e.Topic, e.Queue, protocol.Schedule{Kind: protocol.ScheduleCancelMark, At: e.DueAt, Ref: e.At}, nil)}
}

func appendLog(t tb, l *storage.Log, flush bool, es ...storage.Entry) []storage.Position {
	t.Helper()
	pos, err := l.Append(es, flush)
	if err != nil {
		t.Fatalf("append: %v", err)
	}
	for _, p := range pos {
		if p.Err != nil {
			t.Fatalf("append: %v", p.Err)
		}
	}
	return pos
}

// clock is a test clock.
type clock struct{ now time.Time }

func (c *clock) Now() time.Time { return c.now }

// mEntry is the model's entry.
type mEntry struct {
	Entry
	st     State
	origin int64 // the first pending record of its message (its own offset unless moved)
}

// model is what the index must say: every entry the log holds and what
// became of it.
type model struct {
	entries map[int64]*mEntry
	// gone are the moved entries retention deleted: MovedTo still finds
	// where their messages are.
	gone map[int64]*mEntry
	// noLookups: check does not ask State of every entry (a lookup
	// splits the group of a far entry; without them groups stay whole).
	noLookups bool
}

func (m *model) pending() []*mEntry {
	var out []*mEntry
	for _, e := range m.entries {
		if e.st.Kind == StatePending {
			out = append(out, e)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].DueAt != out[j].DueAt {
			return out[i].DueAt < out[j].DueAt
		}
		return out[i].At < out[j].At
	})
	return out
}

func (m *model) buckets(topic string, width int64, limit int) []Bucket {
	sums := map[int64]int64{}
	for _, e := range m.pending() {
		if topic == "" || e.Topic == topic {
			sums[max(e.DueAt, 0)/width*width]++
		}
	}
	var out []Bucket
	for s, c := range sums {
		out = append(out, Bucket{Start: s, Pending: c})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Start < out[j].Start })
	if len(out) > limit {
		out = out[:limit]
	}
	return out
}

// check compares everything the index says with the model (no claim
// outstanding).
func check(t tb, x *Index, m *model, topics []string, what string) {
	t.Helper()
	pend := m.pending()
	if got := x.Pending(""); got != int64(len(pend)) {
		var ms string
		for _, e := range pend {
			ms += fmt.Sprint(" ", e.At)
		}
		t.Fatalf("%s: Pending(\"\") = %d, want %d (%s)\n%s", what, got, len(pend), ms, x.dump())
	}
	for _, tp := range topics {
		var n int64
		for _, e := range pend {
			if e.Topic == tp {
				n++
			}
		}
		if got := x.Pending(tp); got != n {
			t.Fatalf("%s: Pending(%q) = %d, want %d", what, tp, got, n)
		}
		if got, want := x.Buckets(tp, x.cfg.BucketWidth, 1000), m.buckets(tp, x.widthMs, 1000); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%s: Buckets(%q) = %v, want %v", what, tp, got, want)
		}
	}
	w3 := 3 * x.cfg.BucketWidth
	if got, want := x.Buckets("", w3, 5), m.buckets("", w3.Milliseconds(), 5); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("%s: Buckets(3 widths) = %v, want %v", what, got, want)
	}
	due, ok := x.NextDue()
	if len(pend) == 0 {
		if ok {
			t.Fatalf("%s: NextDue = %d, want none", what, due)
		}
	} else if !ok || due != pend[0].DueAt {
		t.Fatalf("%s: NextDue = %d %v, want %d", what, due, ok, pend[0].DueAt)
	}
	for at, e := range m.entries {
		if m.noLookups {
			break
		}
		st, err := x.State(at, e.DueAt)
		if err != nil {
			t.Fatalf("%s: State(%d): %v", what, at, err)
		}
		if st != e.st {
			t.Fatalf("%s: State(%d, due %d) = %+v, want %+v", what, at, e.DueAt, st, e.st)
		}
	}
	for at, e := range m.gone {
		to := e.st.MovedTo
		for {
			n := m.entries[to]
			if n == nil {
				n = m.gone[to]
			}
			if n == nil || n.st.Kind != StateMoved {
				break
			}
			to = n.st.MovedTo
		}
		if m.entries[to] == nil || m.noLookups {
			continue // the newest record is gone too (its bucket may be)
		}
		if got, ok, err := x.MovedTo(at, e.DueAt); err != nil || !ok || got != to {
			t.Fatalf("%s: MovedTo(%d, due %d) = %d %v %v, want %d\n%s", what, at, e.DueAt, got, ok, err, to, x.dump())
		}
	}
	if s := x.Stats(); s.Pending != int64(len(pend)) {
		t.Fatalf("%s: Stats().Pending = %d, want %d", what, s.Pending, len(pend))
	}
}

// testIndex opens an index on a fresh log (segments of segSize, 0: the
// default) in a temporary directory dir, at a fake clock; both close when
// the test ends.
func testIndex(t *testing.T, segSize int64) (dir string, l *storage.Log, clk *clock, x *Index) {
	t.Helper()
	dir = t.TempDir()
	l = openTestLog(t, filepath.Join(dir, "log"), segSize)
	t.Cleanup(func() { l.Close() })
	clk = &clock{now: time.UnixMilli(1_800_000_000_000)}
	x, err := Open(Config{Log: l, Dir: filepath.Join(dir, "delay"), Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { x.Close() })
	return dir, l, clk, x
}

func removeAll(t tb, dir string) {
	t.Helper()
	if err := os.RemoveAll(dir); err != nil {
		t.Fatalf("remove %s: %v", dir, err)
	}
}

func sideFile(dir string, off int64) string {
	return filepath.Join(dir, "truncated", storage.SideFileName(off, 1))
}
