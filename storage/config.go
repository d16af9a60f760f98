package storage

import (
	"fmt"
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
	if m == FlushSync {
		return "sync"
	}
	return "async"
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

// Config configures a Log. Zero fields take their defaults.
type Config struct {
	// Dir holds the segments and the checkpoint. Required.
	Dir string
	// FS is the file system. Default vfs.Default.
	FS vfs.FS
	// SegmentSize is the size at which a new segment starts. Default 1 GiB.
	SegmentSize int64
	// Flush is the flush mode. Default FlushAsync.
	Flush FlushMode
	// FlushInterval is how often FlushAsync syncs. Default 500 ms.
	FlushInterval time.Duration
	// MaxPayloadSize caps one entry's payload. Default 16 MiB.
	MaxPayloadSize int
	// Logger gets recovery and error reports. Default: a null logger.
	Logger hclog.Logger
	// Now is the clock stamped into records. Default time.Now.
	Now func() time.Time
}

func (c Config) withDefaults() Config {
	if c.FS == nil {
		c.FS = vfs.Default
	}
	if c.SegmentSize <= 0 {
		c.SegmentSize = 1 << 30
	}
	if c.FlushInterval <= 0 {
		c.FlushInterval = 500 * time.Millisecond
	}
	if c.MaxPayloadSize <= 0 {
		c.MaxPayloadSize = defaultMaxPayload
	}
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}
