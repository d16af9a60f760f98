package protocol

// LookupRequest is the body of LOOKUP (JSON): the messages of a broker
// group found by one of Offset (a handle's log offset: the record there),
// ID (a message id) or Key (a message key), the last two within a window
// of store times, newest first, a page at a time.
type LookupRequest struct {
	Offset *int64 `json:"offset,omitempty"`
	ID     string `json:"id,omitempty"`
	Key    string `json:"key,omitempty"`
	// Since and Until bound the store times searched (unix ms; Until 0:
	// now). A search reads key tables of the log ranges in the window only.
	Since int64 `json:"since,omitempty"`
	Until int64 `json:"until,omitempty"`
	// Before is the cursor a previous page answered (0: the newest first).
	Before int64 `json:"before,omitempty"`
	Limit  int   `json:"limit,omitempty"` // most messages a page (0: 20; at most MaxLookupLimit)
}

// MaxLookupLimit bounds a LOOKUP page.
const MaxLookupLimit = 1000

// LookupReply answers LOOKUP. Messages are what the principal may read
// (consume on the message's topic); Hidden counts those found it may not.
// Next is the cursor of the next page (LookupRequest.Before): 0 when the
// window was searched to its start.
type LookupReply struct {
	Group    string         `json:"group"`
	Messages []FoundMessage `json:"messages"`
	Hidden   int            `json:"hidden,omitempty"`
	Next     int64          `json:"next"`
	// ScannedBytes is what the search read of key tables and records.
	ScannedBytes int64 `json:"scanned_bytes"`
}

// FoundMessage is one message LOOKUP found, where it is stored and what it
// holds. A pending delayed message is found at its pending record (its
// Topic is the target topic, InternalTopic the pending queue's).
type FoundMessage struct {
	Handle        string            `json:"handle"`
	Topic         string            `json:"topic"`
	InternalTopic string            `json:"internal_topic,omitempty"`
	Queue         uint32            `json:"queue"`
	QueueOffset   int64             `json:"queue_offset"`
	LogOffset     int64             `json:"log_offset"`
	StoreTime     int64             `json:"store_time"`
	ID            string            `json:"id"`
	Key           string            `json:"key,omitempty"`
	Tag           string            `json:"tag,omitempty"`
	Timestamp     int64             `json:"timestamp"`
	Reliability   string            `json:"reliability"`
	Producer      *ProducerStamp    `json:"producer,omitempty"`
	Schedule      *Schedule         `json:"schedule,omitempty"`
	Recovered     bool              `json:"recovered,omitempty"`
	Properties    map[string]string `json:"properties,omitempty"`
	Body          []byte            `json:"body"`
	// HeldBy are the group's brokers that hold the record, as the answering
	// broker knows (a master: itself and each slave that acknowledged it; a
	// slave: itself).
	HeldBy []string `json:"held_by"`
	// Deliveries are the reads of the message's queue that included it, as
	// the answering broker remembers them (a bounded record in memory: a
	// restart or a failover forgets it; the latest reads of a queue).
	Deliveries []Delivery `json:"deliveries,omitempty"`
}

// Delivery is a read of a queue's offsets [From, To) by a member of a
// consumer group, as its PULL named them, first answered at At (unix ms).
type Delivery struct {
	Group  string `json:"group"`
	Member string `json:"member"`
	From   int64  `json:"from"`
	To     int64  `json:"to"`
	At     int64  `json:"at"`
}

// KeyProperty is the property that holds a message's key (the producer
// SDK's Message.Key).
const KeyProperty = "key"

// The properties that name the message a dead letter or a retry copy is
// of (the consumer SDK writes them): a lookup by id finds those too.
const (
	DeadLetterOriginID = "DLQ_ORIGIN_ID"
	RetryOriginID      = "RETRY_ORIGIN_ID"
)

// LookupKeys calls add with what one encoded message can be looked up by:
// its id, its key (KeyProperty), and the id of the message it is a dead
// letter or a retry of. The slices alias raw. A malformed message gives
// what could be read of it.
func LookupKeys(raw []byte, add func(key []byte)) {
	r := reader{b: raw}
	if id := r.span(int(r.u16("message id")), "message id"); len(id) > 0 {
		add(id)
	}
	r = reader{b: raw}
	r.peekTag()
	for range int(r.u16("property count")) {
		k := r.span(int(r.u16("property key")), "property key")
		v := r.span(int(r.u16("property value")), "property value")
		if r.err != nil {
			return
		}
		if len(v) > 0 && (string(k) == KeyProperty || string(k) == DeadLetterOriginID || string(k) == RetryOriginID) {
			add(v)
		}
	}
}
