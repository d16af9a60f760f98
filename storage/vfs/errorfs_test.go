package vfs_test

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/ferrymq/ferrymq/storage/vfs"
)

// fixture is a directory holding a.log ("hello"), open as f through efs.
type fixture struct {
	dir    string
	efs    *vfs.ErrorFS
	f      vfs.File
	opened []vfs.File // closed at the end of the test
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	x := &fixture{dir: t.TempDir(), efs: vfs.NewErrorFS(vfs.Default)}
	f, err := x.efs.Create(x.path("a.log"))
	must(t, err)
	_, err = f.WriteAt([]byte("hello"), 0)
	must(t, err)
	x.f = f
	x.opened = append(x.opened, f)
	t.Cleanup(func() {
		x.efs.DropAll()
		for _, f := range x.opened {
			_ = f.Close()
		}
	})
	return x
}

func (x *fixture) path(name string) string { return filepath.Join(x.dir, name) }

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func exists(t testing.TB, path string) bool {
	t.Helper()
	_, err := os.Stat(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	return err == nil
}

func content(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	must(t, err)
	return string(b)
}

// opCase is one operation of each kind: call runs it on the fixture, and
// unchanged checks that a failed call left the disk as it was.
var opCases = []struct {
	op        vfs.Op
	call      func(x *fixture) error
	unchanged func(t *testing.T, x *fixture)
}{
	{vfs.OpCreate, func(x *fixture) error {
		f, err := x.efs.Create(x.path("new.log"))
		if err == nil {
			x.opened = append(x.opened, f)
		}
		return err
	}, func(t *testing.T, x *fixture) {
		if exists(t, x.path("new.log")) {
			t.Error("a failed create made the file")
		}
	}},
	{vfs.OpOpen, func(x *fixture) error {
		f, err := x.efs.OpenRW(x.path("a.log"))
		if err == nil {
			x.opened = append(x.opened, f)
		}
		return err
	}, nil},
	{vfs.OpRemove, func(x *fixture) error { return x.efs.Remove(x.path("a.log")) }, func(t *testing.T, x *fixture) {
		if !exists(t, x.path("a.log")) {
			t.Error("a failed remove removed the file")
		}
	}},
	{vfs.OpRename, func(x *fixture) error { return x.efs.Rename(x.path("a.log"), x.path("b.log")) }, func(t *testing.T, x *fixture) {
		if !exists(t, x.path("a.log")) || exists(t, x.path("b.log")) {
			t.Error("a failed rename renamed the file")
		}
	}},
	{vfs.OpList, func(x *fixture) error {
		names, err := x.efs.List(x.dir)
		if err == nil && fmt.Sprint(names) != "[a.log]" {
			err = fmt.Errorf("listed %v", names)
		}
		return err
	}, nil},
	{vfs.OpMkdirAll, func(x *fixture) error { return x.efs.MkdirAll(x.path("sub/dir")) }, func(t *testing.T, x *fixture) {
		if exists(t, x.path("sub")) {
			t.Error("a failed mkdir made the directory")
		}
	}},
	{vfs.OpSyncDir, func(x *fixture) error { return x.efs.SyncDir(x.dir) }, nil},
	{vfs.OpRead, func(x *fixture) error {
		b := make([]byte, 5)
		n, err := x.f.ReadAt(b, 0)
		if err == nil && string(b[:n]) != "hello" {
			err = fmt.Errorf("read %q", b[:n])
		}
		return err
	}, nil},
	{vfs.OpWrite, func(x *fixture) error {
		n, err := x.f.WriteAt([]byte("HELLO"), 0)
		if err != nil && n != 0 {
			return fmt.Errorf("a failed write reports %d bytes written", n)
		}
		return err
	}, func(t *testing.T, x *fixture) {
		if got := content(t, x.path("a.log")); got != "hello" {
			t.Errorf("a failed write changed the file to %q", got)
		}
	}},
	{vfs.OpSync, func(x *fixture) error { return x.f.Sync() }, nil},
	{vfs.OpTruncate, func(x *fixture) error { return x.f.Truncate(2) }, func(t *testing.T, x *fixture) {
		if got := content(t, x.path("a.log")); got != "hello" {
			t.Errorf("a failed truncate changed the file to %q", got)
		}
	}},
	{vfs.OpSize, func(x *fixture) error {
		n, err := x.f.Size()
		if err == nil && n != 5 {
			err = fmt.Errorf("size %d", n)
		}
		return err
	}, nil},
	{vfs.OpClose, func(x *fixture) error { return x.f.Close() }, func(t *testing.T, x *fixture) {
		// Like close(2), a failed Close still closes the file.
		if _, err := x.f.ReadAt(make([]byte, 1), 0); !errors.Is(err, os.ErrClosed) {
			t.Errorf("read after a failed close: %v, want os.ErrClosed", err)
		}
	}},
}

func TestEveryOpKindFails(t *testing.T) {
	covered := vfs.Op(0)
	for _, c := range opCases {
		covered |= c.op
		t.Run(c.op.String(), func(t *testing.T) {
			x := newFixture(t)
			r := vfs.Fail(c.op)
			x.efs.Inject(r)
			passed := x.efs.Calls(c.op) // the fixture's own calls
			err := c.call(x)
			var ie *vfs.InjectedError
			if !errors.Is(err, vfs.ErrInjected) || !errors.As(err, &ie) {
				t.Fatalf("got %v, want an injected error", err)
			}
			if ie.Call.Op != c.op || ie.Err != nil {
				t.Fatalf("injected error names %v with cause %v", ie.Call, ie.Err)
			}
			if c.op != vfs.OpList && c.op != vfs.OpMkdirAll && c.op != vfs.OpSyncDir && ie.Call.Path != x.path("a.log") && ie.Call.Path != x.path("new.log") {
				t.Fatalf("injected error names path %q", ie.Call.Path)
			}
			if r.Seen() != 1 || r.Fired() != 1 || x.efs.Calls(c.op) != passed {
				t.Fatalf("seen %d fired %d passed %d, want 1 1 0", r.Seen(), r.Fired(), x.efs.Calls(c.op)-passed)
			}
			if c.unchanged != nil {
				c.unchanged(t, x)
			}
			if c.op == vfs.OpClose {
				return
			}
			// Dropped, the rule fails nothing.
			x.efs.Drop(r)
			if err := c.call(x); err != nil {
				t.Fatalf("after Drop: %v", err)
			}
			if x.efs.Calls(c.op) != passed+1 {
				t.Fatalf("%d calls passed, want 1", x.efs.Calls(c.op)-passed)
			}
		})
		t.Run(c.op.String()+"/others", func(t *testing.T) {
			// A rule for every other kind leaves this one alone.
			x := newFixture(t)
			x.efs.Inject(vfs.Fail(vfs.OpAll &^ c.op))
			if err := c.call(x); err != nil {
				t.Fatal(err)
			}
		})
	}
	if covered != vfs.OpAll {
		t.Fatalf("cases cover %v, not every op (%v)", covered, vfs.OpAll)
	}
}

func TestOpString(t *testing.T) {
	for op, want := range map[vfs.Op]string{
		vfs.OpWrite:               "write",
		vfs.OpWrite | vfs.OpSync:  "write|sync",
		vfs.OpSyncDir | vfs.OpAll: vfs.OpAll.String(),
		0:                         "Op(0)",
		1 << 30:                   "Op(0x40000000)",
	} {
		if got := op.String(); got != want {
			t.Errorf("%#x: %q, want %q", uint32(op), got, want)
		}
	}
	if !strings.HasPrefix(vfs.OpAll.String(), "create|open|") || strings.Contains(vfs.OpAll.String(), "Op(") {
		t.Errorf("OpAll: %q", vfs.OpAll)
	}
}

func TestPathSelection(t *testing.T) {
	x := newFixture(t)
	idx, err := x.efs.Create(x.path("a.idx"))
	must(t, err)
	defer idx.Close()
	must(t, x.efs.MkdirAll(x.path("sub")))
	sub, err := x.efs.Create(x.path("sub/a.log"))
	must(t, err)
	defer sub.Close()

	// A pattern without a separator matches the last element.
	logs := vfs.Fail(vfs.OpWrite).Path("*.log")
	x.efs.Inject(logs)
	if _, err := x.f.WriteAt([]byte("x"), 0); !errors.Is(err, vfs.ErrInjected) {
		t.Errorf("write to a.log: %v", err)
	}
	if _, err := sub.WriteAt([]byte("x"), 0); !errors.Is(err, vfs.ErrInjected) {
		t.Errorf("write to sub/a.log: %v", err)
	}
	if _, err := idx.WriteAt([]byte("x"), 0); err != nil {
		t.Errorf("write to a.idx: %v", err)
	}
	if logs.Seen() != 2 {
		t.Errorf("the rule saw %d calls, want 2 (not the write to a.idx)", logs.Seen())
	}
	x.efs.Drop(logs)

	// One with a separator matches the whole path.
	inSub := vfs.Fail(vfs.OpWrite).Path(filepath.Join(x.dir, "sub", "*"))
	x.efs.Inject(inSub)
	if _, err := sub.WriteAt([]byte("x"), 0); !errors.Is(err, vfs.ErrInjected) {
		t.Errorf("write to sub/a.log: %v", err)
	}
	if _, err := x.f.WriteAt([]byte("x"), 0); err != nil {
		t.Errorf("write to a.log: %v", err)
	}
	x.efs.DropAll()

	// A rename matches by either name.
	x.efs.Inject(vfs.Fail(vfs.OpRename).Path("queues"))
	if err := x.efs.Rename(x.path("a.idx"), x.path("queues")); !errors.Is(err, vfs.ErrInjected) {
		t.Errorf("rename onto queues: %v", err)
	}
	if err := x.efs.Rename(x.path("a.idx"), x.path("b.idx")); err != nil {
		t.Errorf("rename a.idx: %v", err)
	}
	x.efs.DropAll()

	// A predicate sees the whole call.
	var seen []vfs.Call
	far := vfs.Fail(vfs.OpWrite | vfs.OpTruncate).Where(func(c vfs.Call) bool {
		seen = append(seen, c)
		return c.Offset >= 100
	})
	x.efs.Inject(far)
	if _, err := x.f.WriteAt([]byte("near"), 10); err != nil {
		t.Errorf("write at 10: %v", err)
	}
	if _, err := x.f.WriteAt([]byte("far"), 100); !errors.Is(err, vfs.ErrInjected) {
		t.Errorf("write at 100: %v", err)
	}
	if err := x.f.Truncate(200); !errors.Is(err, vfs.ErrInjected) {
		t.Errorf("truncate to 200: %v", err)
	}
	want := fmt.Sprint([]vfs.Call{
		{Op: vfs.OpWrite, Path: x.path("a.log"), Offset: 10, Len: 4},
		{Op: vfs.OpWrite, Path: x.path("a.log"), Offset: 100, Len: 3},
		{Op: vfs.OpTruncate, Path: x.path("a.log"), Offset: 200},
	})
	if fmt.Sprint(seen) != want {
		t.Errorf("predicate saw %v, want %v", seen, want)
	}

	defer func() {
		if recover() == nil {
			t.Error("a malformed pattern did not panic")
		}
	}()
	vfs.Fail(vfs.OpWrite).Path("[")
}

// writes calls WriteAt n times and returns which calls (from 1) failed.
func writes(t *testing.T, f vfs.File, n int) []int {
	t.Helper()
	var failed []int
	for i := 1; i <= n; i++ {
		if _, err := f.WriteAt([]byte("x"), int64(i)); err != nil {
			if !errors.Is(err, vfs.ErrInjected) {
				t.Fatal(err)
			}
			failed = append(failed, i)
		}
	}
	return failed
}

func TestCountSelection(t *testing.T) {
	for _, c := range []struct {
		name  string
		rule  *vfs.Rule
		fails string
	}{
		{"every", vfs.Fail(vfs.OpWrite), "[1 2 3 4 5 6]"},
		{"nth", vfs.Fail(vfs.OpWrite).Nth(3), "[3]"},
		{"after", vfs.Fail(vfs.OpWrite).After(2), "[3 4 5 6]"},
		{"after and times", vfs.Fail(vfs.OpWrite).After(1).Times(2), "[2 3]"},
		{"times", vfs.Fail(vfs.OpWrite).Times(1), "[1]"},
	} {
		t.Run(c.name, func(t *testing.T) {
			x := newFixture(t)
			x.efs.Inject(c.rule)
			failed := writes(t, x.f, 6)
			if fmt.Sprint(failed) != c.fails {
				t.Fatalf("calls %v failed, want %s", failed, c.fails)
			}
			if c.rule.Seen() != 6 || c.rule.Fired() != int64(len(failed)) {
				t.Fatalf("seen %d fired %d", c.rule.Seen(), c.rule.Fired())
			}
			if x.efs.Calls(vfs.OpWrite) != int64(6-len(failed))+1 { // +1: the fixture's write
				t.Fatalf("%d writes passed", x.efs.Calls(vfs.OpWrite))
			}
		})
	}

	t.Run("counts only matching calls", func(t *testing.T) {
		x := newFixture(t)
		idx, err := x.efs.Create(x.path("a.idx"))
		must(t, err)
		defer idx.Close()
		second := vfs.Fail(vfs.OpWrite).Path("*.log").Nth(2)
		x.efs.Inject(second)
		for i := range 3 {
			if _, err := idx.WriteAt([]byte("i"), int64(i)); err != nil {
				t.Fatal(err)
			}
			_, err := x.f.WriteAt([]byte("l"), int64(i))
			if (i == 1) != errors.Is(err, vfs.ErrInjected) {
				t.Fatalf("log write %d: %v", i+1, err)
			}
		}
	})

	t.Run("first failing rule decides", func(t *testing.T) {
		x := newFixture(t)
		once := vfs.Fail(vfs.OpSync).Nth(1).With(syscall.EIO)
		always := vfs.Fail(vfs.OpSync).With(syscall.ENOSPC)
		x.efs.Inject(once, always)
		if err := x.f.Sync(); !errors.Is(err, syscall.EIO) || errors.Is(err, syscall.ENOSPC) {
			t.Fatalf("first sync: %v, want EIO", err)
		}
		if always.Seen() != 0 {
			t.Fatal("a rule after the one that failed the call counted it")
		}
		if err := x.f.Sync(); !errors.Is(err, syscall.ENOSPC) {
			t.Fatalf("second sync: %v, want ENOSPC", err)
		}
		if once.Seen() != 2 || once.Fired() != 1 || always.Seen() != 1 || always.Fired() != 1 {
			t.Fatalf("once %d/%d always %d/%d", once.Seen(), once.Fired(), always.Seen(), always.Fired())
		}
		x.efs.Drop(always)
		must(t, x.f.Sync())
	})

	for _, bad := range []func(){
		func() { vfs.Fail(vfs.OpWrite).Nth(0) },
		func() { vfs.Fail(vfs.OpWrite).Times(0) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Error("a count of 0 did not panic")
				}
			}()
			bad()
		}()
	}
}

func TestInjectedErrorMatches(t *testing.T) {
	x := newFixture(t)
	x.efs.Inject(vfs.Fail(vfs.OpWrite).With(syscall.ENOSPC))
	_, err := x.f.WriteAt([]byte("x"), 0)
	if !errors.Is(err, syscall.ENOSPC) || !errors.Is(err, vfs.ErrInjected) || errors.Is(err, syscall.EIO) {
		t.Fatalf("got %v, want ENOSPC and ErrInjected only", err)
	}
	wrapped := fmt.Errorf("storage: write: %w", err)
	if !errors.Is(wrapped, syscall.ENOSPC) || !errors.Is(wrapped, vfs.ErrInjected) {
		t.Fatalf("wrapped, the error no longer matches: %v", wrapped)
	}
	if msg := err.Error(); !strings.Contains(msg, "injected") || !strings.Contains(msg, "write "+x.path("a.log")) ||
		!strings.Contains(msg, syscall.ENOSPC.Error()) {
		t.Fatalf("message %q does not say what failed", msg)
	}
	x.efs.DropAll()
	x.efs.Inject(vfs.Fail(vfs.OpRemove).With(fs.ErrPermission))
	if err := x.efs.Remove(x.path("a.log")); !errors.Is(err, fs.ErrPermission) {
		t.Fatalf("remove: %v", err)
	}
}

func TestPartialWrite(t *testing.T) {
	x := newFixture(t)
	x.efs.Inject(vfs.Fail(vfs.OpWrite).Partial(3).With(syscall.ENOSPC))
	n, err := x.f.WriteAt([]byte("HELLO"), 0)
	if n != 3 || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("wrote %d, %v; want 3, ENOSPC", n, err)
	}
	if got := content(t, x.path("a.log")); got != "HELlo" {
		t.Fatalf("file holds %q, want the first 3 bytes written", got)
	}
	// A partial length over the buffer writes it all and still fails.
	x.efs.DropAll()
	x.efs.Inject(vfs.Fail(vfs.OpWrite).Partial(100))
	if n, err := x.f.WriteAt([]byte("ab"), 5); n != 2 || !errors.Is(err, vfs.ErrInjected) {
		t.Fatalf("wrote %d, %v", n, err)
	}
	if got := content(t, x.path("a.log")); got != "HELloab" {
		t.Fatalf("file holds %q", got)
	}
}

// TestConcurrentCalls runs writes from many goroutines while rules come and
// go: the counts stay exact (run it with -race).
func TestConcurrentCalls(t *testing.T) {
	x := newFixture(t)
	const goroutines, each = 8, 200
	after := vfs.Fail(vfs.OpWrite).Path("*.log").After(500)
	nth := vfs.Fail(vfs.OpWrite).Path("*.idx").Nth(77)
	x.efs.Inject(after, nth)
	var wg sync.WaitGroup
	var mu sync.Mutex
	failed := map[string]int{}
	for g := range goroutines {
		ext := []string{"log", "idx"}[g%2]
		f, err := x.efs.Create(x.path(fmt.Sprintf("%d.%s", g, ext)))
		must(t, err)
		defer f.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if _, err := f.WriteAt([]byte{byte(i)}, int64(i)); err != nil {
					mu.Lock()
					failed[ext]++
					mu.Unlock()
				}
			}
		}()
	}
	// Rules that match nothing written come and go meanwhile.
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			r := vfs.Fail(vfs.OpSync | vfs.OpRemove)
			x.efs.Inject(r)
			_ = r.Seen()
			x.efs.Drop(r)
		}
	}()
	wg.Wait()
	close(stop)
	<-done
	logWrites := int64(goroutines / 2 * each) // the fixture wrote a.log before the rules
	if failed["log"] != int(logWrites-500) || after.Fired() != logWrites-500 || after.Seen() != logWrites {
		t.Errorf("log writes: %d failed, rule fired %d and saw %d; want %d of %d", failed["log"], after.Fired(), after.Seen(), logWrites-500, logWrites)
	}
	if failed["idx"] != 1 || nth.Fired() != 1 || nth.Seen() != goroutines/2*each {
		t.Errorf("idx writes: %d failed, rule fired %d and saw %d", failed["idx"], nth.Fired(), nth.Seen())
	}
	if got, want := x.efs.Calls(vfs.OpWrite), int64(goroutines*each+1)-int64(failed["log"]+failed["idx"]); got != want {
		t.Errorf("%d writes passed, want %d", got, want)
	}
}

// TestContract checks Default, and an ErrorFS with no rules, against what
// the package documentation asks of an FS.
func TestContract(t *testing.T) {
	for name, fsys := range map[string]vfs.FS{"Default": vfs.Default, "ErrorFS": vfs.NewErrorFS(vfs.Default)} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "a", "b")
			must(t, fsys.MkdirAll(dir))
			p := func(n string) string { return filepath.Join(dir, n) }
			f, err := fsys.Create(p("x"))
			must(t, err)
			if f.Name() != p("x") {
				t.Errorf("Name %q", f.Name())
			}
			if _, err := fsys.Create(p("x")); !errors.Is(err, fs.ErrExist) {
				t.Errorf("Create of an existing file: %v, want fs.ErrExist", err)
			}
			if _, err := fsys.OpenRW(p("missing")); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("OpenRW of a missing file: %v, want fs.ErrNotExist", err)
			}
			if err := fsys.Remove(p("missing")); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("Remove of a missing file: %v, want fs.ErrNotExist", err)
			}
			_, err = f.WriteAt([]byte("0123456789"), 0)
			must(t, err)
			must(t, f.Sync())
			must(t, f.Truncate(4))
			if n, err := f.Size(); err != nil || n != 4 {
				t.Errorf("Size after Truncate(4): %d, %v", n, err)
			}
			b := make([]byte, 8)
			if n, err := f.ReadAt(b, 0); n != 4 || !errors.Is(err, io.EOF) || string(b[:n]) != "0123" {
				t.Errorf("ReadAt past the end: %d %q, %v; want 4 \"0123\", io.EOF", n, b[:n], err)
			}
			must(t, f.Close())

			g, err := fsys.Create(p("y"))
			must(t, err)
			must(t, g.Close())
			must(t, fsys.Rename(p("x"), p("y"))) // replaces y
			names, err := fsys.List(dir)
			must(t, err)
			if fmt.Sprint(names) != "[y]" {
				t.Errorf("List after a replacing rename: %v", names)
			}
			for _, n := range []string{"c", "a", "b"} {
				h, err := fsys.Create(p(n))
				must(t, err)
				must(t, h.Close())
			}
			if names, _ := fsys.List(dir); fmt.Sprint(names) != "[a b c y]" {
				t.Errorf("List: %v, want sorted names", names)
			}
			h, err := fsys.OpenRW(p("y"))
			must(t, err)
			if n, err := h.ReadAt(b[:4], 0); n != 4 || err != nil || string(b[:4]) != "0123" {
				t.Errorf("reopened y: %q, %v", b[:n], err)
			}
			must(t, h.Close())
			must(t, fsys.Remove(p("y")))
			must(t, fsys.SyncDir(dir))
		})
	}
}
