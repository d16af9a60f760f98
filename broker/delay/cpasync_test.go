package delay

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/storage/vfs"
)

// gateFS holds every Sync of a bucket or far file while block is set,
// until gate is closed; syncing says one is held.
type gateFS struct {
	vfs.FS
	block   atomic.Bool
	syncing chan struct{}
	gate    chan struct{}
	open    sync.Once
}

// release lets the held syncs go, once.
func (g *gateFS) release() { g.open.Do(func() { close(g.gate) }) }

type gateFile struct {
	vfs.File
	fs *gateFS
}

func (g *gateFS) wrap(f vfs.File, err error) (vfs.File, error) {
	if err != nil {
		return nil, err
	}
	return &gateFile{File: f, fs: g}, nil
}

func (g *gateFS) Create(name string) (vfs.File, error) { return g.wrap(g.FS.Create(name)) }
func (g *gateFS) OpenRW(name string) (vfs.File, error) { return g.wrap(g.FS.OpenRW(name)) }

func (f *gateFile) Sync() error {
	if f.fs.block.Load() && strings.HasSuffix(f.Name(), ".dly") {
		select {
		case f.fs.syncing <- struct{}{}:
		default:
		}
		<-f.fs.gate
	}
	return f.File.Sync()
}

// checkpointW reads the W of the checkpoint file on disk.
func checkpointW(t *testing.T, dir string) int64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, checkpointName))
	if err != nil {
		t.Fatal(err)
	}
	return int64(binary.BigEndian.Uint64(b[16:]))
}

// within runs f and fails the test unless it returns within d (the
// syncs are let go then, so that the test ends).
func within(t *testing.T, g *gateFS, d time.Duration, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(d):
		g.release()
		t.Fatalf("%s waited for the checkpoint's syncs", what)
	}
}

// TestCheckpointDoesNotBlock: while a checkpoint's bucket files are being
// synced, Follow, Due, Pending, Claim, Release and State answer; the
// checkpoint on disk still has the old W until the syncs are done (the
// files are synced before the checkpoint names their items), and then
// the new one.
func TestCheckpointDoesNotBlock(t *testing.T) {
	dir := t.TempDir()
	l := openTestLog(t, filepath.Join(dir, "log"), 0)
	defer l.Close()
	gfs := &gateFS{FS: vfs.Default, syncing: make(chan struct{}, 1), gate: make(chan struct{})}
	clk := &clock{now: time.UnixMilli(1_800_000_000_000)}
	cfg := Config{Log: l, Dir: filepath.Join(dir, "delay"), Now: clk.Now, FS: gfs}
	x, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	defer gfs.release() // before Close, which waits for the checkpoint
	now := clk.now.UnixMilli()
	old := checkpointW(t, cfg.Dir)
	a := appendLog(t, l, true, delayedEntry("t", 0, now-1_000, -1), delayedEntry("t", 0, now-500, -1),
		delayedEntry("t", 1, now+86400_000, -1))
	gfs.block.Store(true)
	clk.now = clk.now.Add(time.Hour) // a checkpoint is due
	within(t, gfs, 10*time.Second, "Follow", func() {
		if err := x.Follow(); err != nil {
			t.Error(err)
		}
	})
	select { // the checkpoint's writer is in a bucket file's sync
	case <-gfs.syncing:
	case <-time.After(10 * time.Second):
		gfs.release()
		t.Fatal("no checkpoint syncs a bucket file")
	}
	within(t, gfs, 10*time.Second, "Due, Pending, Claim, Release and State", func() {
		if p := x.Pending("t"); p != 3 {
			t.Errorf("Pending = %d, want 3", p)
		}
		if es := x.Due(clk.now, 10); len(es) != 2 || es[0].At != a[0].LogOffset {
			t.Errorf("Due = %+v", es)
		}
		if _, _, ok, err := x.Claim(a[2].LogOffset, now+86400_000); !ok || err != nil {
			t.Errorf("Claim: %v %v", ok, err)
		}
		x.Release(a[2].LogOffset, false)
		if st, err := x.State(a[2].LogOffset, now+86400_000); err != nil || st.Kind != StatePending {
			t.Errorf("State = %+v, %v", st, err)
		}
		if err := x.Follow(); err != nil {
			t.Error(err)
		}
	})
	if w := checkpointW(t, cfg.Dir); w != old || x.Stats().Followed != old {
		t.Fatalf("before the bucket files are synced the checkpoint covers %d (Stats %d), want still %d", w, x.Stats().Followed, old)
	}
	gfs.release()
	x.checkpointWritten()
	if w, f := checkpointW(t, cfg.Dir), l.FlushedOffset(); w != f || x.Stats().Followed != f {
		t.Fatalf("after the syncs the checkpoint covers %d (Stats %d), want %d", w, x.Stats().Followed, f)
	}
}

// TestPendingDoesNotWaitForTheLock: Pending (the send path's quota check)
// answers while the index's lock is held, as Follow and Due hold it over
// their disk reads.
func TestPendingDoesNotWaitForTheLock(t *testing.T) {
	_, l, clk, x := testIndex(t, 0)
	appendLog(t, l, true, delayedEntry("t", 0, clk.now.UnixMilli()+60_000, -1))
	if err := x.Follow(); err != nil {
		t.Fatal(err)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	g := &gateFS{gate: make(chan struct{})}
	within(t, g, 10*time.Second, "Pending", func() {
		if p, pt := x.Pending(""), x.Pending("t"); p != 1 || pt != 1 {
			t.Errorf("Pending = %d, %d, want 1, 1", p, pt)
		}
	})
}

// TestCheckpointSyncFails: a checkpoint whose bucket file does not sync
// is not written (W stays), the next Follow returns the error, and after
// Reset the index is whole again and its next checkpoint covers the log.
func TestCheckpointSyncFails(t *testing.T) {
	dir := t.TempDir()
	l := openTestLog(t, filepath.Join(dir, "log"), 0)
	defer l.Close()
	efs := vfs.NewErrorFS(vfs.Default)
	clk := &clock{now: time.UnixMilli(1_800_000_000_000)}
	cfg := Config{Log: l, Dir: filepath.Join(dir, "delay"), Now: clk.Now, FS: efs}
	x, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	now := clk.now.UnixMilli()
	old := checkpointW(t, cfg.Dir)
	appendLog(t, l, true, delayedEntry("t", 0, now+5_000, -1), delayedEntry("t", 0, now+86400_000, -1))
	rule := vfs.Fail(vfs.OpSync).Path("*.dly")
	efs.Inject(rule)
	clk.now = clk.now.Add(time.Hour) // a checkpoint is due
	if err := x.Follow(); err != nil {
		t.Fatal(err) // it is written in the background
	}
	x.checkpointWritten()
	if rule.Fired() == 0 {
		t.Fatal("no bucket file was synced")
	}
	if w := checkpointW(t, cfg.Dir); w != old || x.Stats().Followed != old {
		t.Fatalf("a checkpoint whose files did not sync covers %d (Stats %d), want still %d", w, x.Stats().Followed, old)
	}
	if err := x.Follow(); err == nil || !errors.Is(err, vfs.ErrInjected) {
		t.Fatalf("Follow after the failed checkpoint: %v, want the sync's error", err)
	}
	efs.Drop(rule)
	if err := x.Reset(); err != nil {
		t.Fatal(err)
	}
	if w, f := checkpointW(t, cfg.Dir), l.FlushedOffset(); w != f || x.Pending("") != 2 {
		t.Fatalf("after Reset: checkpoint at %d (want %d), %d pending", w, f, x.Pending(""))
	}
}
