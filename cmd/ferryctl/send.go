package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/producer"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/sdk"
)

type sendOptions struct {
	body        string
	bodyFile    string
	key         string
	tag         string
	props       []string
	reliability string
	at          string        // --at, RFC 3339 (checked when parsed)
	after       time.Duration // --after
}

// sendJSON is what send --json prints.
type sendJSON struct {
	ID          string `json:"id"`
	Topic       string `json:"topic"`
	Queue       uint32 `json:"queue"`
	QueueOffset int64  `json:"queue_offset"`
	LogOffset   int64  `json:"log_offset"`
	Group       string `json:"group"`
	Broker      string `json:"broker"`
	// Duplicate: the broker had already stored this message and answered
	// with the original's offsets.
	Duplicate         bool   `json:"duplicate"`
	PossibleDuplicate bool   `json:"possible_duplicate"`
	ProducerID        uint64 `json:"producer_id"`
	Epoch             uint16 `json:"epoch"`
	Seq               int64  `json:"seq"`
	// Handle names the stored record, GROUP@LOG-OFFSET: for a delayed
	// message the pending one (delayed get and delayed cancel take it).
	Handle string `json:"handle"`
	// Delayed: sent with --at or --after; DueAt (unix milliseconds) is when
	// it is due. QueueOffset is then its offset in the internal queue of
	// pending messages.
	Delayed bool  `json:"delayed,omitempty"`
	DueAt   int64 `json:"due_at,omitempty"`
}

func newSendCommand(g *globalOptions) *cobra.Command {
	o := &sendOptions{}
	cmd := &cobra.Command{
		Use:   "send TOPIC (--body B | --body-file FILE | --body -)",
		Short: "Send one message and print where it was stored",
		Long: `Send one message and print where it was stored. The body is --body B,
the contents of --body-file FILE, or stdin with --body -; it must not be
empty and may be at most 4 MiB (protocol.MaxMessageSize).

With --at TIME (RFC 3339, e.g. 2026-12-24T09:00:00Z) or --after DUR (e.g.
30m), the message is a delayed one: stored now, pending, and released into
its queue at that time (--after counts from now; a time in the past is due
at once). It prints the handle of the pending record (GROUP@OFFSET/DUE), which
delayed get and delayed cancel take.`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			rel, err := protocol.ParseReliability(o.reliability)
			if err != nil {
				return usageError{err}
			}
			deliverAt, err := o.deliverAt(cmd, time.Now())
			if err != nil {
				return err
			}
			props := map[string]string{}
			for _, kv := range o.props {
				k, v, _ := strings.Cut(kv, "=") // checked when parsed
				props[k] = v
			}
			body, err := o.readBody(cmd, g.in)
			if err != nil {
				return err
			}
			p, err := producer.New(sdk.MetaAddrs(g.addrs()...), producer.DeliveryTimeout(g.timeout), producer.RequestTimeout(g.timeout),
				producer.Linger(0), sdk.TLS(g.tls.config), sdk.Token(g.token))
			if err != nil {
				return usageError{err}
			}
			defer p.Close()
			r, err := p.Send(cmd.Context(), &producer.Message{Topic: args[0], Key: o.key, Tag: o.tag, Properties: props, Body: body, Reliability: rel,
				DeliverAt: deliverAt})
			if err != nil {
				return err
			}
			out := sendJSON{ID: r.ID, Topic: r.Topic, Queue: r.Queue, QueueOffset: r.QueueOffset, LogOffset: r.LogOffset, Group: r.Group,
				Broker: r.Broker, Duplicate: r.Duplicate, PossibleDuplicate: r.PossibleDuplicate, ProducerID: r.ProducerID, Epoch: r.Epoch, Seq: r.Seq,
				Handle: r.Handle.String(), Delayed: r.Delayed}
			if r.Delayed {
				out.DueAt = r.DueAt.UnixMilli()
				return g.printer().print(out, []string{"ID", "TOPIC", "QUEUE", "HANDLE", "DUE", "BROKER"},
					[][]string{{r.ID, r.Topic, fmt.Sprint(r.Queue), r.Handle.String(), formatMillis(out.DueAt), r.Broker}})
			}
			return g.printer().print(out, []string{"ID", "TOPIC", "QUEUE", "QUEUE-OFFSET", "LOG-OFFSET", "GROUP", "BROKER"},
				[][]string{{r.ID, r.Topic, fmt.Sprint(r.Queue), fmt.Sprint(r.QueueOffset), fmt.Sprint(r.LogOffset), r.Group, r.Broker}})
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.body, "body", "", "message body; - reads it from stdin")
	f.StringVar(&o.bodyFile, "body-file", "", "read the message body from this file")
	f.StringVar(&o.key, "key", "", "message key (picks the queue)")
	f.StringVar(&o.tag, "tag", "", "message tag, which consumer groups can filter on")
	f.StringSliceVar(&o.props, "prop", nil, "a property key=value (repeatable, or comma-separated)")
	f.StringVar(&o.reliability, "reliability", "normal", "normal or high (answered after the slave has it)")
	f.StringVar(&o.at, "at", "", "deliver at this time: a delayed message")
	f.DurationVar(&o.after, "after", 0, "deliver this long from now: a delayed message")
	c := g.checker(f)
	c.wrap("at", "a time in RFC 3339, e.g. 2026-12-24T09:00:00Z", func(s string) error {
		if t, err := time.Parse(time.RFC3339Nano, s); err != nil || t.UnixMilli() <= 0 {
			return errWant
		}
		return nil
	})
	c.wrap("after", "a duration of 0s or more, e.g. 30m", func(s string) error {
		if d, err := time.ParseDuration(s); err != nil || d < 0 {
			return errWant
		}
		return nil
	})
	c.name("body-file", "a file name", func(s string) error {
		if s == "" {
			return errors.New("want a file name")
		}
		return nil
	})
	c.name("tag", fmt.Sprintf("1 to %d letters, digits or %q", protocol.MaxTagLen, protocol.TagChars), protocol.ValidateTag)
	c.name("key", fmt.Sprintf("at most %d bytes", protocol.MaxPropertyLen), func(s string) error {
		if len(s) > protocol.MaxPropertyLen {
			return fmt.Errorf("a key of %d bytes is over the cap %d", len(s), protocol.MaxPropertyLen)
		}
		return nil
	})
	c.name("prop", fmt.Sprintf("key=value, the key 1 to %d bytes and the value at most %d", protocol.MaxPropertyLen, protocol.MaxPropertyLen), func(s string) error {
		if len(o.props) > protocol.MaxProperties-1 {
			return fmt.Errorf("%d properties are over the cap %d", len(o.props), protocol.MaxProperties-1)
		}
		items := strings.Split(s, ",")
		for i, kv := range items {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" || len(k) > protocol.MaxPropertyLen || len(v) > protocol.MaxPropertyLen {
				// The flag's value is in the message already: name the
				// item only when it is one of several.
				item := ""
				if len(items) > 1 {
					item = fmt.Sprintf("item %d of %d: ", i+1, len(items))
				}
				return fmt.Errorf("%swant key=value, the key 1 to %d bytes and the value at most %d (this key %d bytes, value %d)",
					item, protocol.MaxPropertyLen, protocol.MaxPropertyLen, len(k), len(v))
			}
			if k == "key" {
				return errors.New(`the property "key" is the message key: give it with --key`)
			}
		}
		return nil
	})
	c.wrap("reliability", "normal or high", func(s string) error {
		if _, err := protocol.ParseReliability(s); err != nil {
			return errWant
		}
		return nil
	})
	return cmd
}

// deliverAt is the delivery time --at or --after (from now) gives, the
// zero time for neither; both is a usage error.
func (o *sendOptions) deliverAt(cmd *cobra.Command, now time.Time) (time.Time, error) {
	at, after := cmd.Flags().Changed("at"), cmd.Flags().Changed("after")
	switch {
	case at && after:
		return time.Time{}, usageError{errors.New("give only one of --at and --after")}
	case at:
		return time.Parse(time.RFC3339Nano, o.at) // checked when parsed
	case after:
		return now.Add(o.after), nil
	}
	return time.Time{}, nil
}

// readBody returns the body that --body or --body-file gives: exactly one
// of them, not empty and at most protocol.MaxMessageSize bytes.
func (o *sendOptions) readBody(cmd *cobra.Command, stdin io.Reader) ([]byte, error) {
	fromFlag, fromFile := cmd.Flags().Changed("body"), cmd.Flags().Changed("body-file")
	if fromFlag && fromFile {
		return nil, usageError{errors.New("give only one of --body and --body-file")}
	}
	var body []byte
	var err error
	what := "--body"
	switch {
	case fromFile:
		what = "--body-file " + shown(o.bodyFile)
		body, err = readCapped(o.bodyFile, nil)
	case fromFlag && o.body == "-":
		what = "--body - (stdin)"
		if stdin == nil {
			stdin = strings.NewReader("")
		}
		body, err = readCapped("", stdin)
	default:
		body = []byte(o.body)
	}
	if err != nil {
		return nil, usageError{fmt.Errorf("%s: %w", what, err)}
	}
	if len(body) > protocol.MaxMessageSize {
		return nil, usageError{fmt.Errorf("%s: a body of %d bytes is over the cap of %d bytes (4 MiB)", what, len(body), protocol.MaxMessageSize)}
	}
	if len(body) == 0 {
		return nil, usageError{fmt.Errorf("a message needs a body: give --body B, --body-file FILE or --body - (stdin); %s is empty", what)}
	}
	return body, nil
}

// errTooLarge reports a body over the cap without reading all of it.
type errTooLarge struct{ size int64 }

func (e errTooLarge) Error() string {
	if e.size < 0 {
		return fmt.Sprintf("a body over the cap of %d bytes (4 MiB)", protocol.MaxMessageSize)
	}
	return fmt.Sprintf("a body of %d bytes is over the cap of %d bytes (4 MiB)", e.size, protocol.MaxMessageSize)
}

// readCapped reads the file name (or r when name is "") up to one byte
// past protocol.MaxMessageSize.
func readCapped(name string, r io.Reader) ([]byte, error) {
	if name != "" {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		if st, err := f.Stat(); err == nil && st.Mode().IsRegular() && st.Size() > protocol.MaxMessageSize {
			return nil, errTooLarge{st.Size()}
		}
		r = f
	}
	b, err := io.ReadAll(io.LimitReader(r, protocol.MaxMessageSize+1))
	if err != nil {
		return nil, err
	}
	if len(b) > protocol.MaxMessageSize {
		return nil, errTooLarge{-1}
	}
	return b, nil
}
