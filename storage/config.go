package storage

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/ferrymq/ferrymq/storage/vfs"
)

// FlushMode says when an append is complete.
type FlushMode int

const (
	// FlushAsync completes an append once written to the page cache; a
	// flusher syncs every FlushInterval. The default.
	FlushAsync FlushMode = iota
	// FlushSync completes an append only after fdatasync covers it.
	FlushSync
)

func (m FlushMode) String() string {
	switch m {
	case FlushAsync:
		return "async"
	case FlushSync:
		return "sync"
	}
	return fmt.Sprintf("FlushMode(%d)", int(m))
}

// ParseFlushMode parses "async" or "sync".
func ParseFlushMode(s string) (FlushMode, error) {
	switch s {
	case "async":
		return FlushAsync, nil
	case "sync":
		return FlushSync, nil
	}
	return 0, fmt.Errorf("storage: unknown flush mode %q (want async or sync)", s)
}

// Defaults of Config.
const (
	DefaultSegmentSize    = 1 << 30
	DefaultFlushInterval  = 500 * time.Millisecond
	DefaultMaxPayloadSize = 16 << 20
	DefaultProducerIdle   = 7 * 24 * time.Hour
	// DefaultIndexChunkBytes is how much log one index chunk file covers.
	DefaultIndexChunkBytes = 64 << 20
	// DefaultPretouch is how far ahead of the writer segments are
	// pre-touched with FlushAsync.
	DefaultPretouch = 8 << 20
)

// MaxPayloadLimit is the largest MaxPayloadSize: a record, with the longest
// topic, must fit the format's 32-bit length.
const MaxPayloadLimit = math.MaxInt32 - recordHeaderSize - recordFixedSize - maxTopicLen

// Config configures a Log. Zero fields take their defaults; negative ones
// are refused (see Validate).
type Config struct {
	// Dir holds the segments and the checkpoint. Required.
	Dir string
	// FS is the file system. Default vfs.Default.
	FS vfs.FS
	// SegmentSize is the size at which a new segment starts. A record never
	// spans two segments, so a record larger than SegmentSize gets a segment
	// of its own: SegmentSize does not bound MaxPayloadSize. Default 1 GiB.
	SegmentSize int64
	// Flush is the flush mode. Default FlushAsync.
	Flush FlushMode
	// FlushInterval is how often FlushAsync syncs. Default 500 ms.
	FlushInterval time.Duration
	// MaxPayloadSize caps the payload of an entry given to Append or
	// AppendAsync, at most MaxPayloadLimit. It does not apply to records
	// already stored or copied with AppendRaw: a log written under a larger
	// cap reopens and reads. Default 16 MiB.
	MaxPayloadSize int
	// Logger gets recovery and error reports. Default: a null logger.
	Logger hclog.Logger
	// Now is the clock stamped into records. Default time.Now.
	Now func() time.Time
	// ProducerStamp reads the producer stamp of a stored record from its
	// payload, for recovery and AppendRaw, which rebuild the deduplication
	// state from the log (see the package doc). It must accept any bytes,
	// not keep the slice, and give for a record appended with a stamped
	// Entry exactly that Entry's Producer. nil: records carry none, and the
	// state of stamped appends lasts until Close.
	ProducerStamp func(payload []byte) (ProducerStamp, bool)
	// MessageID reads the message id of a stored record from its payload,
	// for Watch (nil: a Watch sees no ids, and recovered entries are
	// checked by their stamps alone). It must not keep the slice.
	MessageID func(payload []byte) (string, bool)
	// Fingerprint reads the fingerprint of a stored record from its
	// payload, which the queue index keeps beside each record so that
	// ReadMatching and CountMatching skip records by the index alone (the
	// broker sets it to the tag fingerprint of the message). It must accept
	// any bytes, not keep the slice, and give the same answer for the same
	// payload every time: recovery and AppendRaw compute it again. nil:
	// every record's fingerprint is 0.
	Fingerprint func(payload []byte) uint32
	// LookupKeys gives the keys of a stored record's payload, through
	// add, by which Lookup finds the record (the broker gives "i:" and the
	// message id, "k:" and each message key). Like Fingerprint, it must
	// accept any bytes, not keep the slices (add copies nothing it keeps:
	// it hashes the key) and give the same keys for the same payload every
	// time: recovery, AppendRaw and rebuilt key tables compute them again.
	// nil: nothing can be looked up.
	LookupKeys func(payload []byte, add func(key []byte))
	// ProducerIdle is how long a (producer, queue) pair is remembered after
	// its last record, by record times (Config.Now stamps). Default 7 days.
	ProducerIdle time.Duration
	// IndexChunkBytes is how much log each index chunk file covers (see
	// Index in the package doc): Open reads at most about this much of the
	// log past the last chunk, and the index in memory holds the entries
	// of about this much log. Default 64 MiB.
	IndexChunkBytes int64
	// Pretouch is how far ahead of the writer a goroutine writes zeros
	// into the active segment, so that appends land on pages the file
	// already has instead of extending it (see pretouch.go). The zeros are
	// never part of the log. Negative: off. Default (0): DefaultPretouch
	// with FlushAsync, off with FlushSync, whose frequent syncs would write
	// the zero pages to disk before the records overwrite them. (With
	// FlushAsync a log written slower than Pretouch per FlushInterval has
	// most zero pages synced before they are overwritten too: the disk
	// then writes those pages twice.)
	Pretouch int64
	// OnSync, if set, gets the duration of every sync of the segments (for
	// a latency histogram). It runs on the goroutine that synced, with the
	// log's sync lock held: it must be quick and must not call the log.
	OnSync func(time.Duration)
}

// ErrInvalidConfig is matched (with errors.Is) by every error of
// Config.Validate.
var ErrInvalidConfig = errors.New("storage: invalid config")

// ConfigError is one problem Config.Validate found.
type ConfigError struct {
	Field   string // the Config field, such as "SegmentSize"
	Problem string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("storage: Config.%s %s", e.Field, e.Problem)
}

// Unwrap returns ErrInvalidConfig.
func (e *ConfigError) Unwrap() error { return ErrInvalidConfig }

// Validate reports every problem of c at once (joined with errors.Join),
// each a *ConfigError naming its field. Zero values are valid: they mean
// the defaults. Open validates its Config.
func (c Config) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, &ConfigError{Field: field, Problem: fmt.Sprintf(format, args...)})
	}
	if c.Dir == "" {
		bad("Dir", "is required")
	}
	if c.SegmentSize < 0 {
		bad("SegmentSize", "is %d; it must not be negative (0 means the default, %d)", c.SegmentSize, DefaultSegmentSize)
	}
	if c.Flush != FlushAsync && c.Flush != FlushSync {
		bad("Flush", "is %d; it must be FlushAsync or FlushSync", int(c.Flush))
	}
	if c.FlushInterval < 0 {
		bad("FlushInterval", "is %v; it must not be negative (0 means the default, %v)", c.FlushInterval, DefaultFlushInterval)
	}
	if c.MaxPayloadSize < 0 {
		bad("MaxPayloadSize", "is %d; it must not be negative (0 means the default, %d)", c.MaxPayloadSize, DefaultMaxPayloadSize)
	}
	if c.MaxPayloadSize > MaxPayloadLimit {
		bad("MaxPayloadSize", "is %d; it must be at most %d (a record's length has 32 bits)", c.MaxPayloadSize, MaxPayloadLimit)
	}
	if c.ProducerIdle < 0 {
		bad("ProducerIdle", "is %v; it must not be negative (0 means the default, %v)", c.ProducerIdle, DefaultProducerIdle)
	}
	if c.IndexChunkBytes < 0 {
		bad("IndexChunkBytes", "is %d; it must not be negative (0 means the default, %d)", c.IndexChunkBytes, DefaultIndexChunkBytes)
	}
	return errors.Join(errs...)
}

func (c Config) withDefaults() Config {
	if c.FS == nil {
		c.FS = vfs.Default
	}
	if c.SegmentSize == 0 {
		c.SegmentSize = DefaultSegmentSize
	}
	if c.FlushInterval == 0 {
		c.FlushInterval = DefaultFlushInterval
	}
	if c.MaxPayloadSize == 0 {
		c.MaxPayloadSize = DefaultMaxPayloadSize
	}
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.ProducerIdle == 0 {
		c.ProducerIdle = DefaultProducerIdle
	}
	if c.IndexChunkBytes == 0 {
		c.IndexChunkBytes = DefaultIndexChunkBytes
	}
	switch {
	case c.Pretouch < 0 || c.Pretouch == 0 && c.Flush == FlushSync:
		c.Pretouch = 0
	case c.Pretouch == 0:
		c.Pretouch = DefaultPretouch
	}
	return c
}
