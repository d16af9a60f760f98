package storage

import (
	"os"
	"path/filepath"
	"testing"
)

// testMessageID reads a test payload's message id: its body after the
// stamp prefix (the whole payload when unstamped).
func testMessageID(p []byte) (string, bool) {
	if _, ok := testStamp(p); ok {
		return string(p[stampPrefix:]), true
	}
	return string(p), len(p) > 0
}

// msg is a stamped entry with message id id.
func msg(queue uint32, ps ProducerStamp, id string) Entry {
	return Entry{Topic: "r", Queue: queue, Producer: ps, Payload: stampedPayload(ps, id)}
}

func recovered(e Entry) Entry { e.Recovered = true; return e }

// The rules for recovered entries, and that a reopened log and a slave fed
// the master's bytes rebuild the same deduplication state.
func TestRecoveredEntries(t *testing.T) {
	cfg := Config{Dir: t.TempDir(), ProducerStamp: testStamp, MessageID: testMessageID}
	l := openLog(t, cfg)
	p1 := func(seq int64) ProducerStamp { return ProducerStamp{ID: 1, Epoch: 0, Seq: seq} }
	mustAppend(t, l, []Entry{msg(0, p1(0), "m0"), msg(0, p1(1), "m1")}, false)

	// The producer's own retry of m1 reached the new master; the old master's
	// copy of m1 and its m2 (acknowledged there, never copied) come back.
	pos := mustAppend(t, l, []Entry{recovered(msg(0, p1(1), "m1")), recovered(msg(0, p1(2), "m2"))}, false)
	if !pos[0].Duplicate || pos[1].Duplicate || pos[1].QueueOffset != 2 {
		t.Fatalf("a stored stamp, then the next one: %+v", pos)
	}
	// m2's stamp joined the state: the producer's late retry of m2 is a
	// duplicate of the recovered record.
	pos2 := mustAppend(t, l, []Entry{msg(0, p1(2), "m2")}, false)
	checkPositions(t, "the producer's retry of a recovered message", pos2, []Position{dupOf(pos[1])})

	// A recovered stamp past a gap (the producer moved on meanwhile: 3 and
	// 4 were lost elsewhere) is stored, and the state does not take it: the
	// live producer's next sequence, 3, is still accepted.
	pos = mustAppend(t, l, []Entry{recovered(msg(0, p1(5), "m5"))}, false)
	if pos[0].Duplicate || pos[0].Err != nil {
		t.Fatalf("a recovered stamp past a gap: %+v", pos[0])
	}
	if p := mustAppend(t, l, []Entry{msg(0, p1(3), "m3")}, false); p[0].Duplicate || p[0].Err != nil {
		t.Fatalf("the live producer after a recovered gap: %+v", p[0])
	}
	// An older epoch (the producer restarted under its name) is stored and
	// fences nothing.
	old := ProducerStamp{ID: 2, Epoch: 3, Seq: 0}
	mustAppend(t, l, []Entry{msg(1, ProducerStamp{ID: 2, Epoch: 4, Seq: 0}, "n0")}, false)
	if p := mustAppend(t, l, []Entry{recovered(msg(1, old, "old0"))}, false); p[0].Duplicate || p[0].Err != nil {
		t.Fatalf("a recovered older epoch: %+v", p[0])
	}
	if p := mustAppend(t, l, []Entry{msg(1, ProducerStamp{ID: 2, Epoch: 4, Seq: 1}, "n1")}, false); p[0].Err != nil {
		t.Fatalf("the live producer after a recovered older epoch: %+v", p[0])
	}

	// A watch: m6, sent again by its producer under a new identity after the
	// watch began, makes the old stamp's recovered copy a duplicate; m7,
	// appended before the watch, is the caller's to find (the writer does
	// not), and a recovered m9 twice in one append is stored once.
	mustAppend(t, l, []Entry{msg(0, ProducerStamp{ID: 9, Seq: 0}, "m7")}, false)
	w, err := l.Watch([]QueueRef{{"r", 0}})
	if err != nil {
		t.Fatal(err)
	}
	if w.End != l.EndOffset() {
		t.Fatalf("watch from %d, the log ends at %d", w.End, l.EndOffset())
	}
	mustAppend(t, l, []Entry{msg(0, ProducerStamp{ID: 9, Seq: 1}, "m6")}, false)
	pos = mustAppend(t, l, []Entry{recovered(msg(0, p1(6), "m6")), recovered(msg(0, p1(7), "m7")),
		recovered(msg(0, p1(9), "m9")), recovered(msg(0, p1(9), "m9"))}, false)
	if !pos[0].Duplicate || pos[1].Duplicate || pos[2].Duplicate || !pos[3].Duplicate {
		t.Fatalf("with a watch: %+v", pos)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if p := mustAppend(t, l, []Entry{recovered(msg(0, ProducerStamp{ID: 10}, "m6"))}, false); p[0].Duplicate {
		t.Fatal("a closed watch still skips")
	}
	if len(l.watches) != 0 {
		t.Fatalf("watches left: %v", l.watches)
	}

	// A producer whose first message to a queue was only in the cut tail:
	// its next one started the state here, and the recovered first one,
	// below the state's run, is stored, not taken for a duplicate.
	p3 := func(seq int64) ProducerStamp { return ProducerStamp{ID: 3, Epoch: 0, Seq: seq} }
	mustAppend(t, l, []Entry{msg(2, p3(1), "q1")}, false)
	if p := mustAppend(t, l, []Entry{recovered(msg(2, p3(0), "q0"))}, false); p[0].Duplicate {
		t.Fatal("a recovered message below its producer's first run here was dropped as a duplicate")
	}
	if p := mustAppend(t, l, []Entry{recovered(msg(2, p3(1), "q1"))}, false); !p[0].Duplicate {
		t.Fatal("a recovered message of a remembered run was stored again")
	}

	// Reads say which records were recovered.
	es, err := l.Read("r", 0, 0, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	var flagged []string
	for _, e := range es {
		if e.Recovered {
			id, _ := testMessageID(e.Payload)
			flagged = append(flagged, id)
		}
	}
	if want := []string{"m2", "m5", "m7", "m9", "m6"}; !equalStrings(flagged, want) {
		t.Fatalf("recovered records %v, want %v", flagged, want)
	}

	// A slave fed the bytes, and the log reopened, hold the same state.
	want := dumpProducers(l)
	raw := rawFrom(t, l, l.StartOffset())
	slave := openLog(t, Config{Dir: t.TempDir(), ProducerStamp: testStamp, MessageID: testMessageID})
	if _, err := slave.AppendRaw(0, raw, false); err != nil {
		t.Fatal(err)
	}
	if got := dumpProducers(slave); got != want {
		t.Fatalf("the slave's state:\n%s\nthe master's:\n%s", got, want)
	}
	_ = slave.Close()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(cfg.Dir, "index")); err != nil { // Open replays every record
		t.Fatal(err)
	}
	again := openLog(t, cfg)
	defer again.Close()
	if got := dumpProducers(again); got != want {
		t.Fatalf("reopened state:\n%s\nbefore:\n%s", got, want)
	}
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
