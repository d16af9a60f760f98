package vfs_test

import (
	"errors"
	"io"
	"io/fs"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"github.com/ferrymq/ferrymq/storage/vfs"
)

// The contract the package doc states, checked on every FS: the OS's
// (in a temporary directory) and a MemFS.
func TestFSContract(t *testing.T) {
	for _, c := range []struct {
		name string
		fs   vfs.FS
		dir  func(t *testing.T) string
	}{
		{"os", vfs.Default, func(t *testing.T) string { return t.TempDir() }},
		{"mem", vfs.NewMemFS(), func(*testing.T) string { return "/tmp/contract" }},
	} {
		t.Run(c.name, func(t *testing.T) {
			fsys, dir := c.fs, c.dir(t)
			p := func(name string) string { return filepath.Join(dir, name) }
			must(t, fsys.MkdirAll(p("sub/deeper")))
			must(t, fsys.MkdirAll(p("sub/deeper"))) // exists: fine

			f, err := fsys.Create(p("a.log"))
			must(t, err)
			if _, err := fsys.Create(p("a.log")); !errors.Is(err, fs.ErrExist) {
				t.Fatalf("create of an existing file: %v", err)
			}
			if _, err := fsys.OpenRW(p("missing")); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("open of a missing file: %v", err)
			}
			if err := fsys.Remove(p("missing")); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("remove of a missing file: %v", err)
			}
			if _, err := fsys.Create(p("nodir/x")); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("create in a missing directory: %v", err)
			}
			_, err = f.WriteAt([]byte("hello"), 0)
			must(t, err)
			_, err = f.WriteAt([]byte("!"), 7) // a hole of zeros
			must(t, err)
			if n, err := f.Size(); err != nil || n != 8 {
				t.Fatalf("size %d, %v", n, err)
			}
			buf := make([]byte, 10)
			n, err := f.ReadAt(buf, 0)
			if n != 8 || !errors.Is(err, io.EOF) || string(buf[:n]) != "hello\x00\x00!" {
				t.Fatalf("read past the end: %d %q %v", n, buf[:n], err)
			}
			must(t, f.Truncate(2))
			must(t, f.Sync())
			n, _ = f.ReadAt(buf, 0)
			if string(buf[:n]) != "he" {
				t.Fatalf("after truncate: %q", buf[:n])
			}

			// Rename replaces; a removed file stays usable through f.
			g, err := fsys.Create(p("b.log"))
			must(t, err)
			must(t, g.Close())
			must(t, fsys.Rename(p("a.log"), p("b.log")))
			names, err := fsys.List(dir)
			must(t, err)
			if !slices.Equal(names, []string{"b.log", "sub"}) {
				t.Fatalf("list: %q", names)
			}
			must(t, fsys.Remove(p("b.log")))
			_, err = f.WriteAt([]byte("y"), 2)
			must(t, err)
			n, _ = f.ReadAt(buf, 0)
			if string(buf[:n]) != "hey" {
				t.Fatalf("a removed file read back %q", buf[:n])
			}
			must(t, f.Close())
			must(t, fsys.SyncDir(dir))
			if _, err := fsys.List(p("missing")); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("list of a missing directory: %v", err)
			}
		})
	}
}

func write(t *testing.T, fsys vfs.FS, name, data string, sync bool) vfs.File {
	t.Helper()
	f, err := fsys.OpenRW(name)
	if errors.Is(err, fs.ErrNotExist) {
		f, err = fsys.Create(name)
	}
	must(t, err)
	size, err := f.Size()
	must(t, err)
	_, err = f.WriteAt([]byte(data), size)
	must(t, err)
	if sync {
		must(t, f.Sync())
	}
	return f
}

func read(t *testing.T, fsys vfs.FS, name string) (string, bool) {
	t.Helper()
	f, err := fsys.OpenRW(name)
	if errors.Is(err, fs.ErrNotExist) {
		return "", false
	}
	must(t, err)
	defer f.Close()
	size, err := f.Size()
	must(t, err)
	b := make([]byte, size)
	if _, err := f.ReadAt(b, 0); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	return string(b), true
}

// A power loss keeps exactly what was synced: file data as of the file's
// last Sync, directory entries as of the directory's last SyncDir.
func TestMemFSCrashKeepsWhatWasSynced(t *testing.T) {
	m := vfs.NewMemFS()
	must(t, vfs.MkdirAllDurable(m, "/d"))
	a := write(t, m, "/d/a", "synced", true)
	_, err := a.WriteAt([]byte(" and not"), 6)
	must(t, err)
	b := write(t, m, "/d/b", "b", true) // synced data, its name not yet
	must(t, b.Close())
	must(t, m.SyncDir("/d"))
	c := write(t, m, "/d/c", "c", true) // data synced, name never
	must(t, c.Close())
	must(t, m.Rename("/d/b", "/d/b2")) // never synced: b stays b
	must(t, m.Remove("/d/a"))          // never synced: a comes back
	must(t, m.MkdirAll("/e/f"))        // never synced: gone, with what is in it
	must(t, m.SyncDir("/e/f"))
	write(t, m, "/e/f/g", "g", true)
	must(t, m.SyncDir("/e/f"))

	img := m.CrashClone(vfs.CrashOptions{})
	if got, ok := read(t, img, "/d/a"); !ok || got != "synced" {
		t.Fatalf("/d/a after the crash: %q %v", got, ok)
	}
	for name, want := range map[string]bool{"/d/b": true, "/d/b2": false, "/d/c": false} {
		if _, ok := read(t, img, name); ok != want {
			t.Fatalf("%s exists after the crash: %v, want %v", name, ok, want)
		}
	}
	if names, err := img.List("/"); err != nil || !slices.Equal(names, []string{"d"}) {
		t.Fatalf("root after the crash: %q %v", names, err)
	}
	// m itself is as it was; the image is all durable.
	if got, _ := read(t, m, "/e/f/g"); got != "g" {
		t.Fatalf("the crash clone changed its source: %q", got)
	}
	again := img.CrashClone(vfs.CrashOptions{})
	if got, ok := read(t, again, "/d/a"); !ok || got != "synced" {
		t.Fatalf("an image is not durable: %q %v", got, ok)
	}
}

// A directory MkdirAll created is lost to a power loss, and everything in
// it, until its parent is synced; MkdirAllDurable syncs every parent.
func TestMkdirAllDurable(t *testing.T) {
	for _, durable := range []bool{false, true} {
		m := vfs.NewMemFS()
		must(t, m.MkdirAll("/srv"))
		must(t, m.SyncDir("/"))
		mk := m.MkdirAll
		if durable {
			mk = func(dir string) error { return vfs.MkdirAllDurable(m, dir) }
		}
		must(t, mk("/srv/ferrymq/data"))
		write(t, m, "/srv/ferrymq/data/log", "x", true)
		must(t, m.SyncDir("/srv/ferrymq/data"))
		got, ok := read(t, m.CrashClone(vfs.CrashOptions{}), "/srv/ferrymq/data/log")
		if ok != durable || durable && got != "x" {
			t.Fatalf("durable %v: the file after a power loss: %q, %v", durable, got, ok)
		}
	}

	// A directory that exists but was never synced (its creator died
	// first) is made durable too.
	m := vfs.NewMemFS()
	must(t, m.MkdirAll("/a/b"))
	must(t, vfs.MkdirAllDurable(m, "/a/b"))
	if _, err := m.CrashClone(vfs.CrashOptions{}).List("/a/b"); err != nil {
		t.Fatalf("an existing, unsynced directory: %v", err)
	}

	// A parent that existed and cannot be synced for want of permission is
	// skipped; the parent of a directory created now is not.
	e := vfs.NewErrorFS(vfs.NewMemFS())
	must(t, e.MkdirAll("/x"))
	e.Inject(vfs.Fail(vfs.OpSyncDir).Where(func(c vfs.Call) bool { return c.Path == "/" }).With(syscall.EACCES))
	must(t, vfs.MkdirAllDurable(e, "/x/y"))
	if err := vfs.MkdirAllDurable(e, "/z"); !errors.Is(err, syscall.EACCES) {
		t.Fatalf("the parent of a new directory cannot be synced: %v", err)
	}
}

// With a Rand, each page holds the file as of some number of its unsynced
// writes, and the size is that of some number of them; each directory
// holds its entries as of some number of its unsynced changes.
func TestMemFSTornCrash(t *testing.T) {
	const page = 8
	writes := []struct {
		off  int64
		data string
	}{{0, "aaaaaaaaaaaa"}, {12, "bbbbbbbbbbbb"}, {4, "cc"}, {24, "dddd"}}
	// versions[k] is the file after the first k writes (version 0: synced).
	versions := []string{"0123"}
	for _, w := range writes {
		v := []byte(versions[len(versions)-1])
		if end := int(w.off) + len(w.data); end > len(v) {
			v = append(v, make([]byte, end-len(v))...)
		}
		copy(v[w.off:], w.data)
		versions = append(versions, string(v))
	}
	seen := map[string]bool{}
	for seed := range uint64(2000) {
		m := vfs.NewMemFS()
		f := write(t, m, "/f", versions[0], true)
		must(t, m.SyncDir("/"))
		for _, w := range writes {
			_, err := f.WriteAt([]byte(w.data), w.off)
			must(t, err)
		}
		must(t, m.MkdirAll("/d1"))
		must(t, m.MkdirAll("/d2"))
		img := m.CrashClone(vfs.CrashOptions{Rand: rand.New(rand.NewPCG(seed, 1)), PageSize: page})
		got, ok := read(t, img, "/f")
		if !ok {
			t.Fatal("a synced file lost")
		}
		sizeOK := false
		for _, v := range versions {
			sizeOK = sizeOK || len(v) == len(got)
		}
		if !sizeOK {
			t.Fatalf("seed %d: size %d is no version's", seed, len(got))
		}
		for p := 0; p < len(got); p += page {
			pg := got[p:min(p+page, len(got))]
			match := false
			for _, v := range versions {
				v += string(make([]byte, max(len(got)-len(v), 0)))
				match = match || v[p:p+len(pg)] == pg
			}
			if !match {
				t.Fatalf("seed %d: page at %d is %q, no version's", seed, p, pg)
			}
		}
		seen[got] = true
		names, err := img.List("/")
		must(t, err)
		if !slices.Equal(names, []string{"f"}) && !slices.Equal(names, []string{"d1", "f"}) && !slices.Equal(names, []string{"d1", "d2", "f"}) {
			t.Fatalf("seed %d: root holds %q: not a prefix of its changes", seed, names)
		}
		seen["dirs "+string(rune('0'+len(names)))] = true
		must(t, f.Close())
	}
	if !seen[versions[0]] || !seen[versions[len(versions)-1]] || len(seen) < 10 || !seen["dirs 1"] || !seen["dirs 3"] {
		t.Fatalf("2000 torn crashes gave only %d outcomes", len(seen))
	}
}

// A truncation not synced may zero the rest of the page it cuts, but a page
// it drops whole keeps its old bytes unless a later write makes it again.
func TestMemFSTornTruncation(t *testing.T) {
	const page = 8
	seen := map[string]bool{}
	for seed := range uint64(500) {
		for _, rewrite := range []bool{false, true} {
			m := vfs.NewMemFS()
			f := write(t, m, "/f", "AAAAAAAABBBBBBBBCCCCCCCC", true)
			must(t, m.SyncDir("/"))
			must(t, f.Truncate(12))
			if rewrite {
				_, err := f.WriteAt([]byte("x"), 20)
				must(t, err)
			}
			got, _ := read(t, m.CrashClone(vfs.CrashOptions{Rand: rand.New(rand.NewPCG(seed, 2)), PageSize: page}), "/f")
			must(t, f.Close())
			ok := []string{"AAAAAAAABBBB", "AAAAAAAABBBBBBBBCCCCCCCC", "AAAAAAAABBBB\x00\x00\x00\x00CCCCCCCC"}
			if rewrite {
				// The size may come back past the cut while page 2 was not
				// written again: its old bytes show.
				ok = append(ok, "AAAAAAAABBBBBBBBCCCCC", "AAAAAAAABBBB\x00\x00\x00\x00CCCCC",
					"AAAAAAAABBBBBBBB\x00\x00\x00\x00x", "AAAAAAAABBBB\x00\x00\x00\x00\x00\x00\x00\x00x",
					"AAAAAAAABBBBBBBB\x00\x00\x00\x00x\x00\x00\x00", "AAAAAAAABBBB\x00\x00\x00\x00\x00\x00\x00\x00x\x00\x00\x00")
			}
			if !slices.Contains(ok, got) {
				t.Fatalf("seed %d, rewrite %v: %q is no state a crash can leave", seed, rewrite, got)
			}
			seen[got] = true
		}
	}
	if len(seen) < 6 {
		t.Fatalf("1000 torn crashes gave only %d outcomes: %v", len(seen), seen)
	}
}

// CutPowerAt stops the file system just before the nth mutating call: it
// and every later call fail with ErrPowerOff, and the image is what a power
// loss at that point keeps.
func TestMemFSCutPowerAt(t *testing.T) {
	m := vfs.NewMemFS()
	f := write(t, m, "/a", "1", true) // create, write, sync
	must(t, m.SyncDir("/"))
	if n := m.Mutations(); n != 4 {
		t.Fatalf("%d mutations, want 4", n)
	}
	m.CutPowerAt(2, vfs.CrashOptions{})
	_, err := f.WriteAt([]byte("2"), 1)
	must(t, err)
	if m.PowerCut() != nil {
		t.Fatal("the power went before the 2nd call")
	}
	if err := f.Sync(); !errors.Is(err, vfs.ErrPowerOff) {
		t.Fatalf("sync at the cut: %v", err)
	}
	if _, err := f.ReadAt(make([]byte, 1), 0); !errors.Is(err, vfs.ErrPowerOff) {
		t.Fatalf("read after the cut: %v", err)
	}
	if _, err := m.List("/"); !errors.Is(err, vfs.ErrPowerOff) {
		t.Fatalf("list after the cut: %v", err)
	}
	must(t, f.Close())
	img := m.PowerCut()
	if img == nil || m.CutPower(vfs.CrashOptions{}) != img {
		t.Fatal("no image, or a second one")
	}
	if got, _ := read(t, img, "/a"); got != "1" {
		t.Fatalf("after the cut: %q, want the synced %q", got, "1")
	}
	if m.Mutations() != 5 {
		t.Fatalf("%d mutations ran, want 5", m.Mutations())
	}
}
