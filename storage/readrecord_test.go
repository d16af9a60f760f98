package storage

import (
	"errors"
	"testing"
)

// ReadRecordAt gives back the record an append placed, with its queue
// offset and payload; an offset inside a record or past the log is an
// error, never another record's bytes taken for it.
func TestReadRecordAt(t *testing.T) {
	l := openLog(t, Config{Dir: t.TempDir()})
	defer l.Close()
	pos, err := l.Append([]Entry{{Topic: "a", Queue: 1, Payload: []byte("one")}, {Topic: "bb", Queue: 2, Payload: []byte("two!")}}, false)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []struct {
		topic   string
		payload string
	}{{"a", "one"}, {"bb", "two!"}} {
		ri, err := l.ReadRecordAt(pos[i].LogOffset)
		if err != nil || ri.Topic != want.topic || string(ri.Payload) != want.payload || ri.QueueOffset != pos[i].QueueOffset ||
			int64(ri.Size) != pos[i].End-pos[i].LogOffset || RecordSize(want.topic, len(want.payload)) != ri.Size {
			t.Fatalf("record %d: %+v %v (placed at %+v)", i, ri, err, pos[i])
		}
	}
	if _, err := l.ReadRecordAt(pos[0].LogOffset + 3); err == nil {
		t.Fatal("read a record inside another")
	}
	if _, err := l.ReadRecordAt(pos[1].End); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("at the end: %v, want ErrOutOfRange", err)
	}
}
