package delay

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"
)

// TestFarGroups: entries due more than an hour ahead cost no bucket of
// their own until their hour comes near, yet Buckets counts them per
// bucket (of all topics and of one), a checkpoint taken with some of
// them past W counts them as of W, and Due, with nothing else asking,
// returns them when they are due.
func TestFarGroups(t *testing.T) {
	dir := t.TempDir()
	l := openTestLog(t, filepath.Join(dir, "log"), 0)
	defer l.Close()
	clk := &clock{now: time.UnixMilli(1_800_000_000_000)}
	cfg := Config{Log: l, Dir: filepath.Join(dir, "delay"), Now: clk.Now}
	x, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hour := (clk.now.UnixMilli() + 2*86400_000) / 3600_000 * 3600_000 // two days ahead
	a := appendLog(t, l, true, delayedEntry("t", 0, hour+1_000, -1), delayedEntry("u", 1, hour+5_000, -1),
		delayedEntry("t", 2, hour+20*60_000, -1))
	appendLog(t, l, false, delayedEntry("t", 0, hour+20*60_000+1, -1)) // past W at the next checkpoint
	if err := x.Follow(); err != nil {
		t.Fatal(err)
	}
	checkFar := func(what string) {
		t.Helper()
		if s := x.Stats(); s.Pending != 4 || s.Buckets != 0 {
			t.Fatalf("%s: %+v, want 4 pending and no bucket", what, s)
		}
		for _, c := range []struct {
			topic string
			width time.Duration
			want  string
		}{
			{"", 10 * time.Second, fmt.Sprintf("[{%d 2} {%d 2}]", hour, hour+20*60_000)},
			{"t", 10 * time.Second, fmt.Sprintf("[{%d 1} {%d 2}]", hour, hour+20*60_000)},
			{"u", time.Minute, fmt.Sprintf("[{%d 1}]", hour)},
			{"", time.Hour, fmt.Sprintf("[{%d 4}]", hour)},
			{"t", 2 * time.Hour, fmt.Sprintf("[{%d 3}]", hour/7200_000*7200_000)},
		} {
			if got := fmt.Sprint(x.Buckets(c.topic, c.width, 10)); got != c.want {
				t.Fatalf("%s: Buckets(%q, %v) = %s, want %s", what, c.topic, c.width, got, c.want)
			}
		}
		if got := fmt.Sprint(x.Buckets("", 10*time.Second, 1)); got != fmt.Sprintf("[{%d 2}]", hour) {
			t.Fatalf("%s: Buckets limited to 1 = %s", what, got)
		}
	}
	checkFar("after the follow")
	if err := x.Close(); err != nil { // its checkpoint leaves the last entry past W
		t.Fatal(err)
	}
	if x, err = Open(cfg); err != nil {
		t.Fatal(err)
	}
	defer func() { x.Close() }()
	checkFar("reopened")
	// The hour comes: Due alone (no NextDue, no lookup) finds them.
	clk.now = time.UnixMilli(hour + 5_000)
	es := x.Due(clk.now, 10)
	if len(es) != 2 || es[0].At != a[0].LogOffset || es[1].At != a[1].LogOffset || es[1].Topic != "u" {
		t.Fatalf("Due = %+v", es)
	}
	if s := x.Stats(); s.Pending != 4 || s.Buckets == 0 {
		t.Fatalf("when due: %+v", s)
	}
}
