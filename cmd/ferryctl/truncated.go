package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/storage"
)

// truncatedJSON is one record of a side file as --json prints it.
type truncatedJSON struct {
	LogOffset   int64             `json:"log_offset"`
	Topic       string            `json:"topic"`
	Queue       uint32            `json:"queue"`
	QueueOffset int64             `json:"queue_offset"`
	StoreTime   int64             `json:"store_time"` // unix milliseconds
	ID          string            `json:"id,omitempty"`
	Key         string            `json:"key,omitempty"`
	Reliability string            `json:"reliability,omitempty"`
	Timestamp   int64             `json:"timestamp,omitempty"`
	Producer    *producerJSON     `json:"producer,omitempty"`
	Properties  map[string]string `json:"properties,omitempty"`
	BodySize    int               `json:"body_size"`
	Body        string            `json:"body"`
	// Error says why the stored payload is not a message (then only the
	// record's fields and the payload's size are set).
	Error string `json:"error,omitempty"`
}

type producerJSON struct {
	ID       uint64 `json:"id"`
	Epoch    uint16 `json:"epoch"`
	Sequence int64  `json:"sequence"`
}

func newTruncatedCommand(g *globalOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "truncated FILE",
		Short: "Print the records a broker cut from its log (a side file of a truncation)",
		Long: `Print the records of a side file: the records a broker that rejoined its group
as the slave cut from its commit log because the new master does not have them
(in the broker's data directory, truncated/<first log offset>-epoch-<n>.log).
Each record is printed with its log offset, topic, queue, queue offset, store
time and message. It reads the file only; it needs no cluster.`,
		Args:        usageArgs(cobra.ExactArgs(1)),
		Annotations: map[string]string{offline: "true"},
		RunE: func(cmd *cobra.Command, args []string) error {
			var out []truncatedJSON
			var rows [][]string
			readErr := storage.ReadRecordFile(args[0], func(r storage.RecordInfo) error {
				t := truncatedRecord(r)
				out = append(out, t)
				rows = append(rows, truncatedRow(t, r.Payload))
				return nil
			})
			if out == nil {
				out = []truncatedJSON{}
			}
			if readErr != nil && len(out) == 0 {
				return fmt.Errorf("truncated %s: %w", args[0], readErr)
			}
			if err := g.printer().print(out, []string{"LOG-OFFSET", "TOPIC", "QUEUE", "QUEUE-OFFSET", "STORED", "ID", "KEY", "RELIABILITY", "SIZE", "BODY"}, rows); err != nil {
				return err
			}
			if readErr != nil {
				return fmt.Errorf("truncated %s: after %d good records: %w", args[0], len(out), readErr)
			}
			return nil
		},
	}
}

// truncatedRecord decodes one record's message.
func truncatedRecord(r storage.RecordInfo) truncatedJSON {
	t := truncatedJSON{LogOffset: r.Offset, Topic: r.Topic, Queue: r.Queue, QueueOffset: r.QueueOffset, StoreTime: r.StoreTime}
	m, err := protocol.DecodeMessage(r.Payload)
	if err != nil {
		t.Error = err.Error()
		t.BodySize = len(r.Payload)
		return t
	}
	t.ID, t.Reliability, t.Timestamp = m.ID, m.Reliability.String(), m.Timestamp
	if !m.Producer.IsZero() {
		t.Producer = &producerJSON{ID: m.Producer.ID, Epoch: m.Producer.Epoch, Sequence: m.Producer.Seq}
	}
	for _, p := range m.Properties {
		if p.Key == "key" {
			t.Key = p.Value
		}
		if t.Properties == nil {
			t.Properties = map[string]string{}
		}
		t.Properties[p.Key] = p.Value
	}
	t.BodySize = len(m.Body)
	t.Body = string(m.Body)
	return t
}

func truncatedRow(t truncatedJSON, payload []byte) []string {
	stored := time.UnixMilli(t.StoreTime).UTC().Format("2006-01-02T15:04:05.000Z")
	body := preview(t.Body)
	if t.Error != "" {
		return []string{fmt.Sprint(t.LogOffset), t.Topic, fmt.Sprint(t.Queue), fmt.Sprint(t.QueueOffset), stored,
			"-", "-", "-", fmt.Sprint(t.BodySize), "not a message: " + t.Error + " " + preview(string(payload))}
	}
	return []string{fmt.Sprint(t.LogOffset), t.Topic, fmt.Sprint(t.Queue), fmt.Sprint(t.QueueOffset), stored,
		t.ID, orDash(t.Key), t.Reliability, fmt.Sprint(t.BodySize), body}
}

// preview is a short, printable, quoted form of a body.
func preview(s string) string {
	const limit = 40
	if len(s) > limit {
		s = strings.ToValidUTF8(s[:limit], "") + "..."
	}
	return fmt.Sprintf("%q", s)
}
