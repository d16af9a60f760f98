package producer

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ferrymq/ferrymq/internal/testcluster"
)

// answerDropper is a TCP proxy to one broker that can lose answers: while
// drops is positive, the first bytes a broker sends back on a connection
// are not forwarded, and both sides of that connection are closed (the
// broker has taken the request; the client sees a lost connection).
type answerDropper struct {
	l       net.Listener
	backend string
	drops   atomic.Int64
	dropped atomic.Int64
	mu      sync.Mutex
	conns   []net.Conn
	wg      sync.WaitGroup
}

func startDropper(t *testing.T, backend string) *answerDropper {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &answerDropper{l: l, backend: backend}
	d.wg.Add(1)
	go d.accept()
	t.Cleanup(func() {
		_ = l.Close()
		d.mu.Lock()
		for _, c := range d.conns {
			_ = c.Close()
		}
		d.mu.Unlock()
		d.wg.Wait()
	})
	return d
}

func (d *answerDropper) Addr() string { return d.l.Addr().String() }

func (d *answerDropper) accept() {
	defer d.wg.Done()
	for {
		c, err := d.l.Accept()
		if err != nil {
			return
		}
		b, err := net.Dial("tcp", d.backend)
		if err != nil {
			_ = c.Close()
			continue
		}
		d.mu.Lock()
		d.conns = append(d.conns, c, b)
		d.mu.Unlock()
		closeBoth := func() { _ = c.Close(); _ = b.Close() }
		d.wg.Add(2)
		go func() {
			defer d.wg.Done()
			defer closeBoth()
			_, _ = io.Copy(b, c)
		}()
		go func() {
			defer d.wg.Done()
			defer closeBoth()
			buf := make([]byte, 64<<10)
			for {
				n, err := b.Read(buf)
				if n > 0 {
					if d.drops.Load() > 0 && d.drops.Add(-1) >= 0 {
						d.dropped.Add(1)
						return
					}
					if _, werr := c.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
	}
}

// Against a real broker: answers lost after the broker stored the batch
// (the connection closed between store and answer) are retried with the
// same stamps, answered DUPLICATE from the broker's state with the original
// offsets, and every message id is stored exactly once.
func TestLostAnswersStoredOnce(t *testing.T) {
	c := start(t, false, "g1")
	route := c.Meta.CreateTopic(t, "lost", "g1", "g1", "g1", "g1")
	master := c.Master("g1").Addr()
	px := startDropper(t, master)
	p := newProducer(t, c, RetryBackoff(5e6), withDialAddr(func(a string) string {
		if a == master {
			return px.Addr()
		}
		return a
	}))
	ctx := context.Background()
	// Warm every queue (a broker's first message of a topic may be
	// answered NO_ROUTE).
	for q := range route.Queues {
		if _, err := p.Send(ctx, &Message{Topic: "lost", Key: keyFor(uint32(q), uint32(len(route.Queues))), Body: []byte("warm")}); err != nil {
			t.Fatal(err)
		}
	}

	// One message: its answer is lost, the retry is answered from state.
	px.drops.Store(1)
	r, err := p.Send(ctx, &Message{Topic: "lost", Body: []byte("once")})
	if err != nil {
		t.Fatal(err)
	}
	if px.dropped.Load() != 1 || !r.Duplicate || r.QueueOffset < 0 || r.PossibleDuplicate {
		t.Fatalf("dropped %d answers; result %+v: want a duplicate with the original offsets", px.dropped.Load(), r)
	}
	tc := testcluster.Dial(t, master)
	if got := pull(t, tc, r); got.ID != r.ID || string(got.Body) != "once" {
		t.Fatalf("the result's offsets hold %s %q", got.ID, got.Body)
	}

	// A stream, keyed and not, with answers lost now and then.
	pr := newPromises(t)
	const n = 2000
	for i := range n {
		if i%200 == 100 {
			px.drops.Add(1)
		}
		m := &Message{Topic: "lost", Body: []byte(fmt.Sprint("m-", i))}
		if i%2 == 0 {
			m.Key = fmt.Sprint("k", i%16)
		}
		p.SendAsync(ctx, m, pr.next(i))
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	pr.wg.Wait()
	if len(pr.errs) != 0 {
		t.Fatalf("%d failed; first: %v", len(pr.errs), pr.errs[0])
	}
	seen := map[string]int{}
	for _, q := range route.Queues {
		for _, sm := range testcluster.PullAll(t, tc, "lost", q.Queue) {
			seen[sm.Message.ID]++
		}
	}
	for id, res := range pr.results {
		if seen[id] != 1 {
			t.Fatalf("message %s (%+v) stored %d times", id, res, seen[id])
		}
		if res.PossibleDuplicate {
			t.Fatalf("message %s flagged a possible duplicate with no refusal", id)
		}
	}
	for id, k := range seen {
		if k != 1 {
			t.Fatalf("message %s stored %d times", id, k)
		}
	}
	st := p.Stats()
	t.Logf("dropped %d answers; stats %+v", px.dropped.Load(), st)
	if st.Duplicates == 0 || st.PossibleDuplicates != 0 {
		t.Fatalf("stats %+v", st)
	}
}
