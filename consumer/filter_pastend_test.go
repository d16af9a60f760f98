package consumer

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/metaserver/api"
	"github.com/ferrymq/ferrymq/protocol"
)

type filterCoord struct{ *fakeCoord }

func (f filterCoord) ConsumerHeartbeat(ctx context.Context, hb api.ConsumerHeartbeat) (api.ConsumerHeartbeatReply, error) {
	r, err := f.fakeCoord.ConsumerHeartbeat(ctx, hb)
	r.Filter = "A"
	return r, err
}

// pastEndScript answers PULLs: the first with message 5 (tag A) and next 10
// (6..9 skipped by the filter), then the log is shorter (ends at 8: a
// tail lost without an epoch to tell), then from 8 it waits.
type pastEndScript struct {
	mu      sync.Mutex
	offsets []int64
	at8     chan struct{}
	once    sync.Once
}

func (s *pastEndScript) Pull(ctx context.Context, addr string, req *protocol.PullRequest, _ *protocol.PullDecoder) (protocol.PullResponse, error) {
	s.mu.Lock()
	s.offsets = append(s.offsets, req.Offset)
	s.mu.Unlock()
	switch {
	case req.Offset < 10 && req.Offset != 8:
		m := protocol.Message{ID: "m5", Topic: "t", Tag: "A", Body: []byte("five")}
		return protocol.PullResponse{NextOffset: 10, MinOffset: 0, MaxOffset: 10,
			Messages: []protocol.StoredMessage{{QueueOffset: 5, Message: m}}}, nil
	case req.Offset == 10:
		return protocol.PullResponse{NextOffset: 10, MinOffset: 0, MaxOffset: 8}, nil
	}
	s.once.Do(func() { close(s.at8) })
	select {
	case <-ctx.Done():
		return protocol.PullResponse{}, ctx.Err()
	case <-time.After(time.Duration(req.WaitMillis) * time.Millisecond):
		return protocol.PullResponse{NextOffset: 8, MinOffset: 0, MaxOffset: 8}, nil
	}
}

func (s *pastEndScript) Close() error { return nil }

// TestFilteredSkipsNotCommittedPastAShorterLog: a member that read message 5 (A) with 6..9 skipped, then found the log
// ending at 8 (past-end branch), commits no further than 8 once 5 is
// processed: offsets 8 and 9 of the shorter log are new messages it has
// not read.
func TestFilteredSkipsNotCommittedPastAShorterLog(t *testing.T) {
	co := filterCoord{newFakeCoord(map[string]int{"t": 1})}
	s := &pastEndScript{at8: make(chan struct{})}
	all := []Opt{withCoordinator(co), withRouter(fakeRouter{1}), withPuller(s), withDeadLetterer(&fakeDLQ{}),
		Heartbeat(50 * time.Millisecond), Session(time.Second), AutoCommit(time.Hour), ManualCommit(),
		PollWait(100 * time.Millisecond)}
	c, err := New("grp", []string{"t"}, all...)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	msgs, err := c.Poll(ctx)
	if err != nil || len(msgs) != 1 || msgs[0].Offset != 5 {
		t.Fatalf("poll: %v %v", msgs, err)
	}
	select {
	case <-s.at8:
	case <-ctx.Done():
		t.Fatal("no PULL from 8")
	}
	c.MarkProcessed(msgs[0])
	if err := c.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	co.mu.Lock()
	got := co.committed[qkey{"t", 0}]
	co.mu.Unlock()
	if got > 8 {
		t.Fatalf("committed %d with the log ending at 8 and offsets 8.. never read", got)
	}
}
