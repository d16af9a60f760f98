package storage

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestConfigValidate(t *testing.T) {
	dir := "/nonexistent/ferrymq-config-test" // Validate never touches the disk
	for _, c := range []struct {
		name   string
		cfg    Config
		fields []string // the fields named by the errors, in order; none: valid
	}{
		{"zero values take defaults", Config{Dir: dir}, nil},
		{"all set", Config{Dir: dir, SegmentSize: 1 << 20, Flush: FlushSync, FlushInterval: time.Second, MaxPayloadSize: 1 << 10, ProducerIdle: time.Minute}, nil},
		{"payload over a segment (it gets a segment of its own)", Config{Dir: dir, SegmentSize: 64 << 10, MaxPayloadSize: 16 << 20}, nil},
		{"largest payload", Config{Dir: dir, MaxPayloadSize: MaxPayloadLimit}, nil},
		{"no dir", Config{}, []string{"Dir"}},
		{"negative segment size", Config{Dir: dir, SegmentSize: -1}, []string{"SegmentSize"}},
		{"negative flush interval", Config{Dir: dir, FlushInterval: -time.Millisecond}, []string{"FlushInterval"}},
		{"negative payload cap", Config{Dir: dir, MaxPayloadSize: -5}, []string{"MaxPayloadSize"}},
		{"payload cap over the format's", Config{Dir: dir, MaxPayloadSize: MaxPayloadLimit + 1}, []string{"MaxPayloadSize"}},
		{"negative producer idle time", Config{Dir: dir, ProducerIdle: -time.Hour}, []string{"ProducerIdle"}},
		{"unknown flush mode", Config{Dir: dir, Flush: 7}, []string{"Flush"}},
		{"negative flush mode", Config{Dir: dir, Flush: -1}, []string{"Flush"}},
		{"everything wrong at once",
			Config{SegmentSize: -1, Flush: 2, FlushInterval: -1, MaxPayloadSize: -1, ProducerIdle: -1},
			[]string{"Dir", "SegmentSize", "Flush", "FlushInterval", "MaxPayloadSize", "ProducerIdle"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.cfg.Validate()
			if len(c.fields) == 0 {
				if err != nil {
					t.Fatalf("valid config refused: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("got %v, want ErrInvalidConfig", err)
			}
			joined, ok := err.(interface{ Unwrap() []error })
			if !ok {
				t.Fatalf("%T is not a joined error", err)
			}
			var fields []string
			for _, e := range joined.Unwrap() {
				var ce *ConfigError
				if !errors.As(e, &ce) {
					t.Fatalf("%v is not a *ConfigError", e)
				}
				fields = append(fields, ce.Field)
				if !strings.Contains(e.Error(), "Config."+ce.Field+" ") {
					t.Errorf("message %q does not name the field", e)
				}
			}
			if strings.Join(fields, ",") != strings.Join(c.fields, ",") {
				t.Fatalf("errors name %v, want %v:\n%v", fields, c.fields, err)
			}
			// Open refuses it the same way, before touching the disk.
			if _, oerr := Open(c.cfg); oerr == nil || oerr.Error() != err.Error() {
				t.Fatalf("Open: %v, want %v", oerr, err)
			}
		})
	}
}

func TestConfigDefaults(t *testing.T) {
	c := Config{Dir: "d"}.withDefaults()
	if c.SegmentSize != DefaultSegmentSize || c.FlushInterval != DefaultFlushInterval ||
		c.MaxPayloadSize != DefaultMaxPayloadSize || c.FS == nil || c.Logger == nil || c.Now == nil || c.Flush != FlushAsync ||
		c.ProducerIdle != 168*time.Hour {
		t.Fatalf("defaults: %+v", c)
	}
}

func TestFlushModeNames(t *testing.T) {
	for _, m := range []FlushMode{FlushAsync, FlushSync} {
		got, err := ParseFlushMode(m.String())
		if err != nil || got != m {
			t.Errorf("%v round-trips to %v, %v", m, got, err)
		}
	}
	if _, err := ParseFlushMode("sometimes"); err == nil {
		t.Error("an unknown flush mode parsed")
	}
	if s := FlushMode(7).String(); s != "FlushMode(7)" {
		t.Errorf("unknown mode prints %q", s)
	}
}
