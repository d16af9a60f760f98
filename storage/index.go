package storage

// queueKey names one queue.
type queueKey struct {
	topic string
	queue uint32
}

// queueIndex maps the queue offsets of one queue to their records.
type queueIndex struct {
	base int64   // queue offset of pos[0]
	pos  []int64 // log offsets
	size []int32 // record sizes
}

func (q *queueIndex) next() int64 { return q.base + int64(len(q.pos)) }

// indexRaw indexes the records of a raw append placed at log offset at;
// l.mu is held.
func (l *Log) indexRaw(raw []byte, at int64) {
	for len(raw) > 0 {
		n, _ := recordLen(raw, maxRecordSize)
		rec, _ := decodeRecord(raw[:n]) // validated by placeRaw
		l.indexAdd(queueKey{rec.Topic, rec.Queue}, rec.QueueOffset, at, int32(n))
		at += int64(n)
		raw = raw[n:]
	}
}

// indexAdd records one record; l.mu is held (or the log is not yet shared).
func (l *Log) indexAdd(k queueKey, queueOffset, logOffset int64, size int32) {
	qi := l.index[k]
	if qi == nil {
		qi = &queueIndex{base: queueOffset}
		l.index[k] = qi
	}
	qi.pos = append(qi.pos, logOffset)
	qi.size = append(qi.size, size)
}

// complete finishes written appends: at once, or after the flush that covers
