package storage

import "strings"

// Recovered records. After a failover the old master cuts the records its
// slave never copied (NORMAL messages it acknowledged alone, and messages in
// flight). When it rejoins, it sends them to the new master, which appends
// them again as recovered entries. By then their producers have gone on:
// some retried a message at the new master with the same stamp, some took a
// new identity (after OUT_OF_ORDER_SEQUENCE) and sent it again under a new
// stamp, some moved their sequence on. So a recovered entry is appended
// only if neither its stamp nor its message id is stored already, and its
// stamp joins the deduplication state only where its producer's state
// expects exactly that sequence next (what a retry would have done): it
// never refuses, fences or renumbers a live producer.
//
// "Its message id is stored already" is decided by the caller up to a
// point of the log and by the writer after it: Watch registers the queues
// between two groups and returns the log end at that instant; the caller
// reads the queues' records before it, and the writer remembers the message
// id of every record it appends to a watched queue from then on, and skips
// a recovered entry whose id it has seen. Nothing is missed between the two.

// Watch remembers the message ids appended to a set of queues from its
// registration on (Config.MessageID reads them); see Recovered records.
type Watch struct {
	l *Log
	// End is the log end when the watch began: every record appended to the
	// watched queues before it is in the log below End, every one after it
	// is remembered.
	End  int64
	keys []queueKey
	ids  map[queueKey]map[string]struct{} // writer-owned
}

// QueueRef names one queue of a topic.
type QueueRef struct {
	Topic string
	Queue uint32
}

// Watch starts remembering the message ids appended to queues, between two
// groups of appends; Close stops it. The ids also count for recovered
// entries appended through any other watch of the same queue.
func (l *Log) Watch(queues []QueueRef) (*Watch, error) {
	w := &Watch{l: l, ids: make(map[queueKey]map[string]struct{}, len(queues))}
	for _, q := range queues {
		k := queueKey{strings.Clone(q.Topic), q.Queue}
		if _, dup := w.ids[k]; !dup {
			w.keys = append(w.keys, k)
			w.ids[k] = map[string]struct{}{}
		}
	}
	err := l.onWriter(func() {
		if l.watches == nil {
			l.watches = map[queueKey][]*Watch{}
		}
		for _, k := range w.keys {
			l.watches[k] = append(l.watches[k], w)
		}
		w.End = l.end.Load()
	})
	if err != nil {
		return nil, err
	}
	return w, nil
}

// Close stops the watch.
func (w *Watch) Close() error {
	l := w.l
	return l.onWriter(func() {
		for _, k := range w.keys {
			ws := l.watches[k]
			for i, x := range ws {
				if x == w {
					ws = append(ws[:i:i], ws[i+1:]...)
					break
				}
			}
			if len(ws) == 0 {
				delete(l.watches, k)
			} else {
				l.watches[k] = ws
			}
		}
		if len(l.watches) == 0 {
			l.watches = nil
		}
	})
}

// onWriter runs f on the writer (the holder of the writer token), between
// two groups of appends, and waits for it.
func (l *Log) onWriter(f func()) error {
	ch := make(chan error, 1)
	l.enqueue(&appendReq{run: f, done: func(_ []Position, err error) { ch <- err }})
	return <-ch
}

// noteWatched remembers the message id of a record appended to queue k for
// the watches of k (writer only).
func (l *Log) noteWatched(k queueKey, payload []byte) {
	ws := l.watches[k]
	if len(ws) == 0 || l.cfg.MessageID == nil {
		return
	}
	id, ok := l.cfg.MessageID(payload)
	if !ok {
		return
	}
	id = strings.Clone(id)
	for _, w := range ws {
		w.ids[k][id] = struct{}{}
	}
}

// watchedID reports whether a watch of queue k saw the message id of
// payload appended (writer only).
func (l *Log) watchedID(k queueKey, payload []byte) bool {
	ws := l.watches[k]
	if len(ws) == 0 || l.cfg.MessageID == nil {
		return false
	}
	id, ok := l.cfg.MessageID(payload)
	if !ok {
		return false
	}
	for _, w := range ws {
		if _, seen := w.ids[k][id]; seen {
			return true
		}
	}
	return false
}

// checkRecovered decides a recovered entry at record time now (writer
// only): skip it (stored already: its stamp by the deduplication state, or
// its id by a watch), or append it, its stamp joining the state only if
// the state takes it as its producer's next.
func (l *Log) checkRecovered(k queueKey, e Entry, now int64) (skip, applyStamp bool) {
	if l.watchedID(k, e.Payload) {
		return true, false
	}
	if e.Producer.ID == 0 {
		return false, false
	}
	_, st := l.prod.find(k, e.Producer.ID)
	switch v, qo, _ := l.prod.check(st, e.Producer, now); v {
	case duplicate:
		// Stored only if a remembered run holds it: a sequence below the
		// runs may be one the state never had (the producer's first
		// messages to this queue were all in the cut tail, and its next one
		// started the state here). The message id checks (the caller's
		// read of the log, and the watch) decide those.
		return qo >= 0, false
	case accept:
		return false, true
	}
	return false, false
}

// replayRecovered is producerTable.replay for a recovered record: its stamp
// joins the state as it did when it was appended (only where the state took
// it as next), so recovery and a slave rebuild what the master held.
func (t *producerTable) replayRecovered(k queueKey, payload []byte, qo, storeTime int64) {
	if t.stamp == nil {
		return
	}
	ps, ok := t.stamp(payload)
	if !ok || ps.ID == 0 {
		return
	}
	_, st := t.find(k, ps.ID)
	if v, _, _ := t.check(st, ps, storeTime); v != accept {
		return
	}
	if !t.inGroup {
		t.sweep(storeTime)
	}
	t.apply(k, ps, qo, storeTime)
}
