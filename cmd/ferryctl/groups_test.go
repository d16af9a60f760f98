package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/internal/transport"
	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/metaserver/client"
	"github.com/ferrymq/ferrymq/producer"
	"github.com/ferrymq/ferrymq/protocol"
	"github.com/ferrymq/ferrymq/routing"
	"github.com/ferrymq/ferrymq/sdk"
)

// Bad flags are refused with exit 2 before any network call: the
// metaserver address here answers nothing, which would be exit 3.
func TestGroupUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"group", "reset-offsets", "g", "--topic", "t"},
		{"group", "reset-offsets", "g", "--topic", "t", "--to-earliest", "--to-latest"},
		{"group", "reset-offsets", "g", "--topic", "t", "--to-offset", "3", "--to-time", "0"},
		{"group", "reset-offsets", "g", "--topic", "t", "--to-offset", "-1"},
		{"group", "reset-offsets", "g", "--topic", "t", "--to-time", "yesterday"},
		{"group", "reset-offsets", "g", "--topic", "t", "--to-offset", "x"},
		{"group", "reset-offsets", "g", "--to-earliest"},
		{"group", "reset-offsets", "g", "--topic", "", "--to-earliest"},
		{"group", "reset-offsets", "--topic", "t", "--to-earliest"},
		{"group", "describe"},
		{"group", "describe", "a", "b"},
		{"groups", "extra"},
	} {
		code, _, errOut := ctl(append([]string{"--meta", "127.0.0.1:1", "--timeout", "300ms"}, args...)...)
		if code != exitUsage || strings.Contains(errOut, "cannot reach") {
			t.Errorf("%v: exit %d, %q; want a usage error (2)", args, code, errOut)
		}
	}
	for _, args := range [][]string{{"groups"}, {"group", "describe", "g"}, {"group", "reset-offsets", "g", "--topic", "t", "--to-latest"}} {
		code, _, errOut := ctl(append([]string{"--meta", "127.0.0.1:1", "--timeout", "300ms"}, args...)...)
		if code != exitUnreachable {
			t.Errorf("%v against nothing: exit %d, %q", args, code, errOut)
		}
	}
}

func TestParseTime(t *testing.T) {
	for in, want := range map[string]int64{
		"0":                              0,
		"1700000000123":                  1700000000123,
		"2024-01-02T03:04:05Z":           time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC).UnixMilli(),
		"2024-01-02T03:04:05.25+01:00":   time.Date(2024, 1, 2, 2, 4, 5, 250e6, time.UTC).UnixMilli(),
		"2024-01-02T03:04:05.250000000Z": time.Date(2024, 1, 2, 3, 4, 5, 250e6, time.UTC).UnixMilli(),
	} {
		if got, err := parseTime(in); err != nil || got != want {
			t.Errorf("parseTime(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "-5", "2024-01-02", "noon"} {
		if _, err := parseTime(in); err == nil {
			t.Errorf("parseTime(%q) took it", in)
		}
	}
}

// offsetForTime finds the first offset stored at or after a time, also
// when store times repeat and when the log start moves up under it.
func TestOffsetForTime(t *testing.T) {
	times := []int64{10, 10, 20, 30, 30, 30, 40, 50, 60, 60}
	probeFrom := func(first *int64) func(int64) (protocol.PullResponse, error) {
		return func(off int64) (protocol.PullResponse, error) {
			off = max(off, *first)
			pr := protocol.PullResponse{MinOffset: *first, MaxOffset: int64(len(times))}
			if off < int64(len(times)) {
				pr.Messages = []protocol.StoredMessage{{QueueOffset: off, StoreTime: times[off]}}
			}
			return pr, nil
		}
	}
	for at, want := range map[int64]int64{0: 0, 10: 0, 11: 2, 20: 2, 30: 3, 31: 6, 45: 7, 60: 8, 61: 10, 1000: 10} {
		first := int64(0)
		probes := 0
		probe := probeFrom(&first)
		counted := func(off int64) (protocol.PullResponse, error) { probes++; return probe(off) }
		if got, err := offsetForTime(0, int64(len(times)), at, counted); err != nil || got != want {
			t.Errorf("at %d: %d, %v; want %d", at, got, err, want)
		}
		if probes > 5 {
			t.Errorf("at %d: %d probes for 10 messages", at, probes)
		}
	}
	// Retention deleted offsets 0..5 after the search began at 0.
	first := int64(6)
	if got, _ := offsetForTime(0, int64(len(times)), 20, probeFrom(&first)); got != 6 {
		t.Errorf("after retention: %d, want the log start 6", got)
	}
	if got, _ := offsetForTime(0, int64(len(times)), 55, probeFrom(&first)); got != 8 {
		t.Errorf("after retention, 55: %d, want 8", got)
	}
	// An empty queue.
	if got, _ := offsetForTime(4, 4, 1, probeFrom(&first)); got != 4 {
		t.Errorf("empty queue: %d", got)
	}
}

// sendN sends n messages to topic and returns how many went to each queue.
func sendN(t *testing.T, meta, topic string, n int) map[uint32]int64 {
	t.Helper()
	p, err := producer.New(sdk.MetaAddrs(meta))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	per := map[uint32]int64{}
	for i := range n {
		r, err := p.Send(context.Background(), &producer.Message{Topic: topic, Key: fmt.Sprint(i), Body: []byte(fmt.Sprintf("m%d", i))})
		if err != nil {
			t.Fatal(err)
		}
		per[r.Queue]++
	}
	return per
}

func metaClient(t *testing.T, addr string) *client.Client {
	t.Helper()
	cl, err := client.New(client.Config{Addrs: []string{addr}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	return cl
}

func TestGroups(t *testing.T) {
	c := testcluster.Start(t, testcluster.Opts{Groups: []string{"g1", "g2"}})
	addr := c.MetaAddr()
	meta := "--meta=" + addr

	// An empty cluster.
	out := mustCtl(t, meta, "groups")
	if !strings.Contains(out, "GROUP") || strings.Count(out, "\n") != 1 {
		t.Fatalf("groups on an empty cluster:\n%s", out)
	}
	if out = mustCtl(t, meta, "groups", "--json"); strings.TrimSpace(out) != "[]" {
		t.Fatalf("groups --json on an empty cluster: %s", out)
	}
	code, _, errOut := ctl(meta, "group", "describe", "nope")
	if code != exitError || !strings.Contains(errOut, `no consumer group "nope"`) {
		t.Fatalf("describe an unknown group: exit %d %q", code, errOut)
	}

	mustCtl(t, meta, "topic", "create", "orders", "--queues", "4")
	per := sendN(t, addr, "orders", 40)

	// A member joins and commits 1 on every queue it holds but the last.
	cl := metaClient(t, addr)
	ctx := context.Background()
	hb := api.ConsumerHeartbeat{Group: "readers", Member: "m1", Topics: []string{"orders"}, SessionMillis: 60_000}
	rep, err := cl.ConsumerHeartbeat(ctx, hb)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Assignment) != 4 {
		t.Fatalf("assignment %+v", rep)
	}
	commit := api.CommitRequest{Group: "readers", Member: "m1", Generation: rep.Generation}
	for _, a := range rep.Assignment[:3] {
		commit.Offsets = append(commit.Offsets, api.QueueOffset{Topic: a.Topic, Queue: a.Queue, Offset: 1})
	}
	if _, err := cl.CommitOffsets(ctx, commit); err != nil {
		t.Fatal(err)
	}
	uncommitted := rep.Assignment[3].Queue
	wantLag := per[uncommitted]
	for _, a := range rep.Assignment[:3] {
		wantLag += per[a.Queue] - 1
	}

	out = mustCtl(t, meta, "groups")
	if !strings.Contains(out, "readers") || !strings.Contains(out, "orders") || !strings.Contains(out, fmt.Sprint(wantLag)) {
		t.Fatalf("groups (want lag %d):\n%s", wantLag, out)
	}
	var groups []groupSummaryJSON
	if err := json.Unmarshal([]byte(mustCtl(t, meta, "groups", "--json")), &groups); err != nil || len(groups) != 1 ||
		groups[0].Members != 1 || groups[0].TotalLag == nil || *groups[0].TotalLag != wantLag || groups[0].Generation != rep.Generation {
		t.Fatalf("groups --json: %+v %v; want lag %d", groups, err, wantLag)
	}

	out = mustCtl(t, meta, "group", "describe", "readers")
	if !strings.Contains(out, "m1") || !strings.Contains(out, "ago") || !strings.Contains(out, "orders:0,1,2,3") || !strings.Contains(out, "LOG-END") {
		t.Fatalf("describe:\n%s", out)
	}
	var d groupDescribeJSON
	if err := json.Unmarshal([]byte(mustCtl(t, meta, "group", "describe", "readers", "--json")), &d); err != nil {
		t.Fatal(err)
	}
	if len(d.Members) != 1 || len(d.Queues) != 4 || d.TotalLag == nil || *d.TotalLag != wantLag {
		t.Fatalf("describe --json: %+v", d)
	}
	for _, q := range d.Queues {
		if q.Owner != "m1" || q.LogEnd == nil || *q.LogEnd != per[q.Queue] || q.Lag == nil {
			t.Fatalf("describe --json queue %+v (sent %d)", q, per[q.Queue])
		}
		want := per[q.Queue] - 1
		if q.Queue == uncommitted {
			want = per[q.Queue]
			if q.Committed != -1 {
				t.Fatalf("queue %d: committed %d, want -1", q.Queue, q.Committed)
			}
		}
		if *q.Lag != want {
			t.Fatalf("queue %d: lag %d, want %d", q.Queue, *q.Lag, want)
		}
	}

	// reset-offsets is refused while the member is live...
	code, _, errOut = ctl(meta, "group", "reset-offsets", "readers", "--topic", "orders", "--to-earliest")
	if code != exitError || !strings.Contains(errOut, "live members (m1) and must be stopped first") || !strings.Contains(errOut, "GROUP_ACTIVE") {
		t.Fatalf("reset with a live member: exit %d %q", code, errOut)
	}
	// ... and taken once it left.
	hb.Leave, hb.Generation = true, rep.Generation
	if _, err := cl.ConsumerHeartbeat(ctx, hb); err != nil {
		t.Fatal(err)
	}
	offsets := func() map[uint32]int64 {
		infos, err := cl.ConsumerGroups(ctx, "readers")
		if err != nil || len(infos) != 1 {
			t.Fatalf("groups: %v %v", infos, err)
		}
		m := map[uint32]int64{}
		for _, o := range infos[0].Offsets {
			m[o.Queue] = o.Offset
		}
		return m
	}
	reset := func(args ...string) resetJSON {
		t.Helper()
		var r resetJSON
		out := mustCtl(t, append([]string{meta, "group", "reset-offsets", "readers", "--topic", "orders", "--json"}, args...)...)
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		return r
	}
	check := func(what string, want func(q uint32) int64) {
		t.Helper()
		got := offsets()
		for q := range uint32(4) {
			if got[q] != want(q) {
				t.Fatalf("%s: offsets %v, want %d on queue %d (sent %v)", what, got, want(q), q, per)
			}
		}
	}
	r := reset("--to-latest")
	if !r.Applied || len(r.Offsets) != 4 {
		t.Fatalf("--to-latest: %+v", r)
	}
	check("--to-latest", func(q uint32) int64 { return per[q] })
	reset("--to-earliest")
	check("--to-earliest", func(uint32) int64 { return 0 })
	r = reset("--to-offset", "7")
	check("--to-offset 7", func(q uint32) int64 { return min(7, per[q]) })
	for _, o := range r.Offsets {
		if (per[o.Queue] < 7) != strings.Contains(o.Note, "past the log end") {
			t.Fatalf("--to-offset 7: queue %d (%d messages) note %q", o.Queue, per[o.Queue], o.Note)
		}
	}
	reset("--to-time", fmt.Sprint(time.Now().Add(time.Hour).UnixMilli()))
	check("--to-time in an hour", func(q uint32) int64 { return per[q] })
	reset("--to-time", "0")
	check("--to-time 0", func(uint32) int64 { return 0 })

	// --dry-run changes nothing; --queues limits the reset.
	if r = reset("--to-latest", "--dry-run"); r.Applied {
		t.Fatalf("dry run: %+v", r)
	}
	check("after a dry run", func(uint32) int64 { return 0 })
	reset("--to-latest", "--queues", "1,2")
	check("--queues 1,2", func(q uint32) int64 {
		if q == 1 || q == 2 {
			return per[q]
		}
		return 0
	})
	out = mustCtl(t, meta, "group", "reset-offsets", "readers", "--topic", "orders", "--to-earliest")
	if !strings.Contains(out, "PREVIOUS") || !strings.Contains(out, "NEW") {
		t.Fatalf("reset-offsets table:\n%s", out)
	}
	code, _, errOut = ctl(meta, "group", "reset-offsets", "readers", "--topic", "missing", "--to-earliest")
	if code != exitError || !strings.Contains(errOut, "UNKNOWN_TOPIC") {
		t.Fatalf("reset of an unknown topic: exit %d %q", code, errOut)
	}

	// A group with no members still lists, with its offsets.
	out = mustCtl(t, meta, "group", "describe", "readers")
	if !strings.Contains(out, "no live members") {
		t.Fatalf("describe after the member left:\n%s", out)
	}
}

// --to-time picks the first message stored at or after the time.
func TestResetToTime(t *testing.T) {
	c := testcluster.Start(t, testcluster.Opts{Groups: []string{"g1"}})
	addr := c.MetaAddr()
	meta := "--meta=" + addr
	mustCtl(t, meta, "topic", "create", "clock", "--queues", "1")
	sendN(t, addr, "clock", 5)
	// Store times are whole milliseconds: pick a time after the last of
	// the first 5 was stored, and store the next 3 after it.
	sent := time.Now().UnixMilli()
	testwait.For(t, time.Second, "the clock to pass the first messages", func() bool { return time.Now().UnixMilli() > sent })
	at := time.Now()
	testwait.For(t, time.Second, "the clock to pass the chosen time", func() bool { return time.Now().UnixMilli() > at.UnixMilli() })
	sendN(t, addr, "clock", 3)

	for _, arg := range []string{fmt.Sprint(at.UnixMilli()), at.UTC().Format(time.RFC3339Nano)} {
		var r resetJSON
		out := mustCtl(t, meta, "group", "reset-offsets", "late", "--topic", "clock", "--to-time", arg, "--create", "--json")
		if err := json.Unmarshal([]byte(out), &r); err != nil || len(r.Offsets) != 1 || r.Offsets[0].Offset != 5 || r.Offsets[0].LogEnd != 8 {
			t.Fatalf("--to-time %s: %+v %v\n%s", arg, r, err, out)
		}
	}
	// The reset made the group, with its offset and no members.
	out := mustCtl(t, meta, "group", "describe", "late")
	if !strings.Contains(out, "no live members") || !strings.Contains(out, "clock") {
		t.Fatalf("describe:\n%s", out)
	}
}

// The log range and a time's offset come from the slave when the master
// does not answer, and the search runs on the slave alone.
func TestQueueOffsetsFromTheSlave(t *testing.T) {
	times := []int64{100, 200, 300, 400}
	var masterCalls atomic.Int64
	notMaster := fakeBroker(t, func(protocol.PullRequest) (protocol.Status, []byte) {
		masterCalls.Add(1)
		return protocol.StatusNotMaster, []byte("demoted")
	})
	slave := fakeBroker(t, func(req protocol.PullRequest) (protocol.Status, []byte) {
		p := protocol.PullResponse{NextOffset: req.Offset, MinOffset: 1, MaxOffset: int64(len(times))}
		if off := max(req.Offset, 1); off < int64(len(times)) {
			p.NextOffset = off + 1
			p.Messages = []protocol.StoredMessage{{QueueOffset: off, StoreTime: times[off], Message: protocol.Message{ID: "x", Topic: req.Topic, Body: []byte("b")}}}
		}
		return protocol.StatusOK, protocol.AppendPullResponse(nil, &p)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	qr := routing.QueueRoute{Queue: 0, Group: "g1", Master: notMaster, Slave: slave}
	var stderr bytes.Buffer
	lo, hi, err := queueRange(ctx, qr, "t", 0, &stderr)
	if err != nil || lo != 1 || hi != 4 || !strings.Contains(stderr.String(), "read from the slave") {
		t.Fatalf("queueRange: %d %d %v; stderr %q", lo, hi, err, stderr.String())
	}
	stderr.Reset()
	masterCalls.Store(0)
	var r resetOffsetJSON
	err = onQueueBroker(ctx, qr, "t", &stderr, func(ctx context.Context, tc *transport.Client) error {
		return resetTargetOffset(ctx, tc, "t", 0, resetTarget{kind: "time", at: 250}, &r)
	})
	if err != nil || r.Offset != 2 || r.LogStart != 1 || r.LogEnd != 4 || masterCalls.Load() != 1 {
		t.Fatalf("to-time 250 from the slave: %+v %v (master asked %d times)", r, err, masterCalls.Load())
	}
	for _, c := range []struct {
		target resetTarget
		want   int64
		note   string
	}{
		{resetTarget{kind: "earliest"}, 1, ""},
		{resetTarget{kind: "latest"}, 4, ""},
		{resetTarget{kind: "offset", offset: 0}, 1, "before the log start 1"},
		{resetTarget{kind: "offset", offset: 3}, 3, ""},
		{resetTarget{kind: "offset", offset: 99}, 4, "past the log end 4"},
		{resetTarget{kind: "time", at: 50}, 1, ""},
		{resetTarget{kind: "time", at: 401}, 4, ""},
	} {
		var r resetOffsetJSON
		err := callBroker(ctx, slave, func(ctx context.Context, tc *transport.Client) error {
			return resetTargetOffset(ctx, tc, "t", 0, c.target, &r)
		})
		if err != nil || r.Offset != c.want || (c.note == "") != (r.Note == "") || !strings.Contains(r.Note, c.note) {
			t.Errorf("%+v: %+v %v; want %d, note %q", c.target, r, err, c.want, c.note)
		}
	}
}
