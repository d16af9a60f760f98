package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
	"github.com/ferrymq/ferrymq/storage"
)

// sideFile makes a log of a few messages, truncates it after the first, and
// returns the side file and the log offset of the cut.
func sideFile(t *testing.T) (string, int64) {
	t.Helper()
	dir := t.TempDir()
	l, err := storage.Open(storage.Config{Dir: dir, ProducerStamp: func(p []byte) (storage.ProducerStamp, bool) {
		s, ok := protocol.PeekProducerStamp(p)
		return storage.ProducerStamp{ID: s.ID, Epoch: s.Epoch, Seq: s.Seq}, ok
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	msgs := []protocol.Message{
		{ID: "kept", Topic: "orders", Queue: 1, Body: []byte("before the cut")},
		{ID: "m-1", Topic: "orders", Queue: 1, Reliability: protocol.High, Timestamp: 1700000000000,
			Properties: []protocol.Property{{Key: "key", Value: "customer-7"}, {Key: "a", Value: "b"}},
			Body:       []byte("the first cut message, with a body long enough to be cut short in the table")},
		{ID: "m-2", Topic: "orders", Queue: 1, Producer: protocol.ProducerStamp{ID: 9, Epoch: 2, Seq: 0}, Body: []byte{0, 1, 2, 0xff}},
	}
	var entries []storage.Entry
	for i := range msgs {
		m := &msgs[i]
		entries = append(entries, storage.Entry{Topic: m.Topic, Queue: m.Queue, Payload: protocol.AppendMessage(nil, m),
			Producer: storage.ProducerStamp{ID: m.Producer.ID, Epoch: m.Producer.Epoch, Seq: m.Producer.Seq}})
	}
	entries = append(entries, storage.Entry{Topic: "raw", Payload: []byte("not a message")})
	pos, err := l.Append(entries, false)
	if err != nil {
		t.Fatal(err)
	}
	cut := pos[1].LogOffset
	side := filepath.Join(dir, "truncated", storage.SideFileName(cut, 4))
	res, err := l.Truncate(cut, side)
	if err != nil || res.Records != 3 {
		t.Fatalf("truncate: %+v %v", res, err)
	}
	return side, cut
}

func TestTruncated(t *testing.T) {
	side, cut := sideFile(t)

	out := mustCtl(t, "truncated", side)
	for _, want := range []string{"LOG-OFFSET", "QUEUE-OFFSET", "m-1", "customer-7", "HIGH", "m-2", `"the first cut message, with a body long ..."`,
		`"\x00\x01\x02\xff"`, "not a message", "orders", "1 "} {
		if !strings.Contains(out, want) {
			t.Fatalf("truncated: no %q in\n%s", want, out)
		}
	}
	if strings.Contains(out, "kept") {
		t.Fatalf("truncated shows a record before the cut:\n%s", out)
	}
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 4 || !strings.HasPrefix(lines[1], strconv.FormatInt(cut, 10)+" ") {
		t.Fatalf("truncated: want a header and 3 records from log offset %d:\n%s", cut, out)
	}

	var recs []truncatedJSON
	if err := json.Unmarshal([]byte(mustCtl(t, "truncated", side, "--json")), &recs); err != nil {
		t.Fatal(err)
	}
	if len(recs) != 3 {
		t.Fatalf("--json: %d records", len(recs))
	}
	r := recs[0]
	if r.LogOffset != cut || r.Topic != "orders" || r.Queue != 1 || r.QueueOffset != 1 || r.ID != "m-1" || r.Key != "customer-7" ||
		r.Reliability != "HIGH" || r.Timestamp != 1700000000000 || r.Properties["a"] != "b" || r.BodySize != 75 || r.StoreTime <= 0 || r.Error != "" {
		t.Fatalf("--json record 0: %+v", r)
	}
	if p := recs[1].Producer; p == nil || *p != (producerJSON{ID: 9, Epoch: 2, Sequence: 0}) || recs[1].LogOffset <= cut || recs[1].BodySize != 4 {
		t.Fatalf("--json record 1: %+v", recs[1])
	}
	if recs[2].Topic != "raw" || recs[2].Error == "" || recs[2].BodySize != len("not a message") {
		t.Fatalf("--json record 2: %+v", recs[2])
	}

	code, _, errOut := ctl("truncated", filepath.Join(t.TempDir(), "missing.log"))
	if code != exitError || !strings.Contains(errOut, "no such file") {
		t.Fatalf("missing file: exit %d %q", code, errOut)
	}
	b, err := os.ReadFile(side)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-3] ^= 0xff // the last record's payload
	bad := filepath.Join(t.TempDir(), filepath.Base(side))
	if err := os.WriteFile(bad, b, 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = ctl("truncated", bad)
	if code != exitError || !strings.Contains(errOut, "corrupt record") || !strings.Contains(errOut, "after 2 good records") || !strings.Contains(out, "m-2") {
		t.Fatalf("corrupt file: exit %d\n%s\n%s", code, out, errOut)
	}
	if err := os.WriteFile(bad, []byte("garbage!garbage!"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := ctl("truncated", bad); code != exitError || out != "" || !strings.Contains(errOut, "corrupt record") {
		t.Fatalf("garbage file: exit %d %q %q", code, out, errOut)
	}
	if code, _, _ := ctl("truncated"); code != exitUsage {
		t.Fatalf("no file: exit %d", code)
	}
}

// fakeBroker answers every PULL with answer.
func fakeBroker(t *testing.T, answer func(req protocol.PullRequest) (protocol.Status, []byte)) string {
	t.Helper()
	s := transport.NewServer(transport.ServerConfig{})
	s.Handle(protocol.CodePull, func(r *transport.Request) {
		req, err := protocol.DecodePullRequest(r.Body)
		if err != nil {
			r.ReplyError(err)
			return
		}
		status, body := answer(req)
		_ = r.ReplyStatus(status, body)
	})
	addr, err := s.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return addr.String()
}

// servesOne answers with one message at the requested offset, then nothing.
func servesOne(id string) func(req protocol.PullRequest) (protocol.Status, []byte) {
	return func(req protocol.PullRequest) (protocol.Status, []byte) {
		p := protocol.PullResponse{NextOffset: req.Offset, MaxOffset: 1}
		if req.Offset == 0 {
			p.NextOffset = 1
			p.Messages = []protocol.StoredMessage{{Message: protocol.Message{ID: id, Topic: req.Topic, Queue: req.Queue, Body: []byte("x")}}}
		}
		return protocol.StatusOK, protocol.AppendPullResponse(nil, &p)
	}
}

func deadAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

func TestReadFallsBackToTheSlave(t *testing.T) {
	slave := fakeBroker(t, servesOne("from-slave"))
	master := fakeBroker(t, servesOne("from-master"))
	notMaster := fakeBroker(t, func(protocol.PullRequest) (protocol.Status, []byte) {
		return protocol.StatusNotMaster, []byte("demoted")
	})
	shutting := fakeBroker(t, func(protocol.PullRequest) (protocol.Status, []byte) {
		return protocol.StatusShuttingDown, nil
	})
	unknown := fakeBroker(t, func(protocol.PullRequest) (protocol.Status, []byte) {
		return protocol.StatusUnknownTopic, []byte("no topic")
	})
	dead := deadAddr(t)

	for _, c := range []struct {
		name          string
		master, slave string
		want          string // the message id read, or "" for an error
		fellBack      bool
	}{
		{"master up", master, slave, "from-master", false},
		{"master refuses connections", dead, slave, "from-slave", true},
		{"not the master", notMaster, slave, "from-slave", true},
		{"shutting down", shutting, slave, "from-slave", true},
		{"no master", "", slave, "from-slave", true},
		{"a real error is not a reason", unknown, slave, "", false},
		{"no slave", dead, "", "", false},
		{"both down", dead, deadAddr(t), "", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			var stderr bytes.Buffer
			qr := routing.QueueRoute{Queue: 2, Group: "g1", Master: c.master, Slave: c.slave}
			msgs, err := readQueue(ctx, qr, protocol.PullRequest{Topic: "t", Queue: 2, MaxBytes: 1 << 20}, 10, &stderr)
			if c.want == "" {
				if err == nil {
					t.Fatalf("read %v, want an error", msgs)
				}
			} else if err != nil || len(msgs) != 1 || msgs[0].Message.ID != c.want {
				t.Fatalf("read %v, %v; want %s", msgs, err, c.want)
			}
			if said := strings.Contains(stderr.String(), "slave "+c.slave); said != c.fellBack {
				t.Fatalf("stderr %q (fell back: want %v)", stderr.String(), c.fellBack)
			}
			if c.want == "from-slave" && !strings.Contains(stderr.String(), "read from the slave") {
				t.Fatalf("stderr %q does not say it read from the slave", stderr.String())
			}
			if c.name == "both down" && !errors.Is(err, transport.ErrConnLost) {
				t.Fatalf("both down: %v", err)
			}
		})
	}
}

// A master that does not answer in time gives way to the slave, within the
// command's deadline.
func TestReadFallsBackWhenTheMasterHangs(t *testing.T) {
	slave := fakeBroker(t, servesOne("from-slave"))
	release := make(chan struct{})
	s := transport.NewServer(transport.ServerConfig{})
	s.Handle(protocol.CodePull, func(r *transport.Request) {
		go func() {
			<-release
			r.ReplyError(protocol.ErrShuttingDown)
		}()
	})
	addr, err := s.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { close(release); _ = s.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var stderr bytes.Buffer
	msgs, err := readQueue(ctx, routing.QueueRoute{Master: addr.String(), Slave: slave}, protocol.PullRequest{Topic: "t", MaxBytes: 1 << 20}, 10, &stderr)
	if err != nil || len(msgs) != 1 || msgs[0].Message.ID != "from-slave" || !strings.Contains(stderr.String(), "read from the slave") {
		t.Fatalf("read %v, %v; stderr %q", msgs, err, stderr.String())
	}
}
