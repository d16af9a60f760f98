package vfs

import (
	"errors"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
)

// ErrPowerOff is the error of every call on a MemFS after its power was cut
// (CutPower, CutPowerAt).
var ErrPowerOff = errors.New("vfs: the power is off")

// MemFS is an in-memory FS that remembers, besides what its files and
// directories hold, what of it a power loss would keep: per file, the bytes
// as of its last Sync; per directory, its entries as of its last SyncDir.
// CrashClone returns the file system a power loss would leave; CutPower and
// CutPowerAt also make every later call fail, as a machine that lost its
// power does nothing more. See the package documentation for the model.
// It is safe for concurrent use.
type MemFS struct {
	mu   sync.Mutex
	root *memNode

	mutations int64 // mutating calls that ran
	// The power cut armed by CutPowerAt: the cutAt-th mutating call takes
	// the image instead of running (0: none armed).
	cutAt   int64
	cutOpts CrashOptions
	image   *MemFS // set once the power is off
}

// CrashOptions says what of the changes that were not synced a power loss
// keeps. The zero value keeps none of them.
type CrashOptions struct {
	// Rand, if not nil, keeps a random part of what was not synced: each
	// page of a file holds its contents as of a random number of the writes
	// and truncations since its last Sync (so none, all, or the first few of
	// them), each page chosen on its own, except that a truncation at or
	// before a page's start changes the page only once a later write
	// touches it (the system drops such a page rather than write it back);
	// the file's size is its size as of yet another random number of them;
	// and each directory holds its entries as of a random number of the
	// creations, removals and renames since its last SyncDir.
	Rand *rand.Rand
	// PageSize is the unit in which file data survives with Rand. Default
	// 4096.
	PageSize int
}

// memNode is a file or a directory. Files reachable from several names
// (a rename not yet synced in one of its directories) share their node.
type memNode struct {
	dir bool

	// A file: what reads see, what its last Sync made durable, and the
	// changes since then, in order.
	data    []byte
	synced  []byte
	pending []fileChange

	// A directory: what List sees, what its last SyncDir made durable, and
	// the changes since then, in order.
	entries map[string]*memNode
	durable map[string]*memNode
	changes []dirChange
}

// fileChange is a write (data at off) or, with trunc, a truncation to off.
type fileChange struct {
	off   int64
	data  []byte
	trunc bool
}

// dirChange sets name to node (nil: removes name); a rename within a
// directory also removes from.
type dirChange struct {
	name string
	node *memNode
	from string
}

func newDir() *memNode {
	return &memNode{dir: true, entries: map[string]*memNode{}, durable: map[string]*memNode{}}
}

func (n *memNode) apply(c dirChange) {
	if c.from != "" {
		delete(n.entries, c.from)
	}
	if c.node == nil {
		delete(n.entries, c.name)
	} else {
		n.entries[c.name] = c.node
	}
	n.changes = append(n.changes, c)
}

// NewMemFS returns an empty MemFS: its root directory "/" exists, and is
// durable. Relative paths are taken from the root.
func NewMemFS() *MemFS { return &MemFS{root: newDir()} }

// split returns the components of path from the root.
func split(path string) []string {
	path = filepath.Clean(string(filepath.Separator) + path)
	if path == string(filepath.Separator) {
		return nil
	}
	return strings.Split(path[1:], string(filepath.Separator))
}

func pathErr(op, path string, err error) error { return &fs.PathError{Op: op, Path: path, Err: err} }

// lookup returns the node at path; m.mu is held.
func (m *MemFS) lookup(op, path string) (*memNode, error) {
	n := m.root
	for _, c := range split(path) {
		if !n.dir {
			return nil, pathErr(op, path, syscall.ENOTDIR)
		}
		if n = n.entries[c]; n == nil {
			return nil, pathErr(op, path, fs.ErrNotExist)
		}
	}
	return n, nil
}

// parent returns the directory holding path and path's last component.
func (m *MemFS) parent(op, path string) (*memNode, string, error) {
	cs := split(path)
	if len(cs) == 0 {
		return nil, "", pathErr(op, path, syscall.EINVAL) // the root
	}
	d, err := m.lookup(op, filepath.Join(append([]string{"/"}, cs[:len(cs)-1]...)...))
	if err != nil {
		return nil, "", err
	}
	if !d.dir {
		return nil, "", pathErr(op, path, syscall.ENOTDIR)
	}
	return d, cs[len(cs)-1], nil
}

// begin starts a call under m.mu: it fails once the power is off, and a
// mutating call counts towards an armed power cut, which it may trigger.
func (m *MemFS) begin(op, path string, mutates bool) error {
	if m.image != nil {
		return pathErr(op, path, ErrPowerOff)
	}
	if !mutates {
		return nil
	}
	if m.cutAt > 0 && m.mutations+1 >= m.cutAt {
		m.image = m.crashImage(m.cutOpts)
		return pathErr(op, path, ErrPowerOff)
	}
	m.mutations++
	return nil
}

// Mutations returns how many calls that change the file system (creations,
// removals, renames, MkdirAll, SyncDir, writes, syncs, truncations) ran.
func (m *MemFS) Mutations() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.mutations
}

// CrashClone returns the file system a power loss now would leave, with
// everything in it durable. m itself is not changed.
func (m *MemFS) CrashClone(o CrashOptions) *MemFS {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.crashImage(o)
}

// CutPower cuts the power now: it returns what CrashClone would, and every
// later call on m, and on the files open on it, fails with ErrPowerOff. A
// power that is already off stays off, and the image it left is returned.
func (m *MemFS) CutPower(o CrashOptions) *MemFS {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.image == nil {
		m.image = m.crashImage(o)
	}
	return m.image
}

// CutPowerAt arms a power cut just before the nth mutating call from now
// (n >= 1; see Mutations): that call does not run, the image is taken
// then, and that call and every later one fail with ErrPowerOff. PowerCut
// returns the image.
func (m *MemFS) CutPowerAt(n int64, o CrashOptions) {
	if n < 1 {
		panic("vfs: CutPowerAt needs n >= 1")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cutAt, m.cutOpts = m.mutations+n, o
}

// CancelPowerCut disarms the power cut CutPowerAt armed, if the power is
// still on.
func (m *MemFS) CancelPowerCut() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cutAt = 0
}

// PowerCut returns the file system the power cut left, or nil while the
// power is on.
func (m *MemFS) PowerCut() *MemFS {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.image
}

// crashImage builds the file system a power loss leaves; m.mu is held.
func (m *MemFS) crashImage(o CrashOptions) *MemFS {
	if o.PageSize <= 0 {
		o.PageSize = 4096
	}
	c := crasher{o: o, done: map[*memNode]*memNode{}}
	return &MemFS{root: c.dir(m.root)}
}

type crasher struct {
	o    CrashOptions
	done map[*memNode]*memNode // a node reachable under two names is cloned once
}

func (c *crasher) node(n *memNode) *memNode {
	if d, ok := c.done[n]; ok {
		return d
	}
	var d *memNode
	if n.dir {
		d = c.dir(n)
	} else {
		d = c.file(n)
	}
	c.done[n] = d
	return d
}

func (c *crasher) dir(n *memNode) *memNode {
	kept := make(map[string]*memNode, len(n.durable))
	for name, child := range n.durable {
		kept[name] = child
	}
	if c.o.Rand != nil {
		for _, ch := range n.changes[:c.o.Rand.IntN(len(n.changes)+1)] {
			if ch.from != "" {
				delete(kept, ch.from)
			}
			if ch.node == nil {
				delete(kept, ch.name)
			} else {
				kept[ch.name] = ch.node
			}
		}
	}
	d := newDir()
	c.done[n] = d
	names := make([]string, 0, len(kept))
	for name := range kept {
		names = append(names, name)
	}
	sort.Strings(names) // the same Rand gives the same image
	for _, name := range names {
		child := c.node(kept[name])
		d.entries[name] = child
		d.durable[name] = child
	}
	return d
}

func (c *crasher) file(n *memNode) *memNode {
	var b []byte
	if c.o.Rand == nil || len(n.pending) == 0 {
		b = clone(n.synced)
	} else {
		b = c.torn(n)
	}
	return &memNode{data: b, synced: clone(b)}
}

// torn returns the contents of a file whose unsynced changes survive in
// part: each page as of its own number of the changes, the size as of
// another.
func (c *crasher) torn(n *memNode) []byte {
	r, ps, ch := c.o.Rand, int64(c.o.PageSize), n.pending
	size := int64(len(n.synced))
	for _, x := range ch[:r.IntN(len(ch)+1)] {
		size = x.size(size)
	}
	out := make([]byte, size)
	copy(out, n.synced)
	for p := int64(0); p < size; p += ps {
		pe := p + ps
		page := make([]byte, ps) // the page as the file had it, zeros past its end
		copy(page, n.synced[min(p, int64(len(n.synced))):])
		written := ch[:r.IntN(len(ch)+1)]
		// A page that a truncation dropped whole is not written back until
		// a write makes it again: trailing truncations at or before its
		// start leave it as it was.
		for len(written) > 0 {
			if x := written[len(written)-1]; x.trunc && x.off <= p {
				written = written[:len(written)-1]
				continue
			}
			break
		}
		for _, x := range written {
			if x.trunc {
				if x.off < pe {
					clear(page[max(x.off-p, 0):])
				}
				continue
			}
			lo, hi := max(x.off, p), min(x.off+int64(len(x.data)), pe)
			if lo < hi {
				copy(page[lo-p:hi-p], x.data[lo-x.off:])
			}
		}
		copy(out[p:min(pe, size)], page)
	}
	return out
}

// size returns the size of a file of size s after the change.
func (x fileChange) size(s int64) int64 {
	if x.trunc {
		return x.off
	}
	return max(s, x.off+int64(len(x.data)))
}

func clone(b []byte) []byte { return append([]byte(nil), b...) }

// Create implements FS.
func (m *MemFS) Create(name string) (File, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.begin("create", name, true); err != nil {
		return nil, err
	}
	d, base, err := m.parent("create", name)
	if err != nil {
		return nil, err
	}
	if d.entries[base] != nil {
		return nil, pathErr("create", name, fs.ErrExist)
	}
	n := &memNode{}
	d.apply(dirChange{name: base, node: n})
	return &memFile{fs: m, n: n, name: name}, nil
}

// OpenRW implements FS.
func (m *MemFS) OpenRW(name string) (File, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.begin("open", name, false); err != nil {
		return nil, err
	}
	n, err := m.lookup("open", name)
	if err != nil {
		return nil, err
	}
	if n.dir {
		return nil, pathErr("open", name, syscall.EISDIR)
	}
	return &memFile{fs: m, n: n, name: name}, nil
}

// Remove implements FS. It removes a file or an empty directory.
func (m *MemFS) Remove(name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.begin("remove", name, true); err != nil {
		return err
	}
	d, base, err := m.parent("remove", name)
	if err != nil {
		return err
	}
	n := d.entries[base]
	if n == nil {
		return pathErr("remove", name, fs.ErrNotExist)
	}
	if n.dir && len(n.entries) > 0 {
		return pathErr("remove", name, syscall.ENOTEMPTY)
	}
	d.apply(dirChange{name: base})
	return nil
}

// Rename implements FS. A rename within a directory is one change of it;
// one across directories is a removal in one and a creation in the other,
// each made durable by its own directory's SyncDir.
func (m *MemFS) Rename(oldname, newname string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.begin("rename", oldname, true); err != nil {
		return err
	}
	od, obase, err := m.parent("rename", oldname)
	if err != nil {
		return err
	}
	n := od.entries[obase]
	if n == nil {
		return pathErr("rename", oldname, fs.ErrNotExist)
	}
	nd, nbase, err := m.parent("rename", newname)
	if err != nil {
		return err
	}
	if old := nd.entries[nbase]; old != nil && old.dir && old != n {
		return pathErr("rename", newname, syscall.EEXIST)
	}
	if od == nd {
		if obase != nbase {
			od.apply(dirChange{name: nbase, node: n, from: obase})
		}
		return nil
	}
	od.apply(dirChange{name: obase})
	nd.apply(dirChange{name: nbase, node: n})
	return nil
}

// List implements FS.
func (m *MemFS) List(dir string) ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.begin("list", dir, false); err != nil {
		return nil, err
	}
	n, err := m.lookup("list", dir)
	if err != nil {
		return nil, err
	}
	if !n.dir {
		return nil, pathErr("list", dir, syscall.ENOTDIR)
	}
	names := make([]string, 0, len(n.entries))
	for name := range n.entries {
		names = append(names, name)
	}
	sort.Strings(names)
	return names, nil
}

// MkdirAll implements FS. Like mkdir(2), it makes nothing durable: each
// directory it creates is an unsynced change of its parent.
func (m *MemFS) MkdirAll(dir string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.begin("mkdir", dir, true); err != nil {
		return err
	}
	n := m.root
	for _, c := range split(dir) {
		next := n.entries[c]
		if next == nil {
			next = newDir()
			n.apply(dirChange{name: c, node: next})
		} else if !next.dir {
			return pathErr("mkdir", dir, syscall.ENOTDIR)
		}
		n = next
	}
	return nil
}

// SyncDir implements FS: dir's entries as they are now survive a power
// loss (if dir itself does).
func (m *MemFS) SyncDir(dir string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.begin("syncdir", dir, true); err != nil {
		return err
	}
	n, err := m.lookup("syncdir", dir)
	if err != nil {
		return err
	}
	if !n.dir {
		return pathErr("syncdir", dir, syscall.ENOTDIR)
	}
	n.durable = make(map[string]*memNode, len(n.entries))
	for name, c := range n.entries {
		n.durable[name] = c
	}
	n.changes = nil
	return nil
}

// memFile is a File open on a MemFS node. It goes on working on a node
// that was removed, as on POSIX systems.
type memFile struct {
	fs     *MemFS
	n      *memNode
	name   string
	closed bool
}

// begin starts a call on the file under f.fs.mu.
func (f *memFile) begin(op string, mutates bool) error {
	if f.closed {
		return pathErr(op, f.name, os.ErrClosed)
	}
	return f.fs.begin(op, f.name, mutates)
}

func (f *memFile) ReadAt(p []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.begin("read", false); err != nil {
		return 0, err
	}
	if off < 0 {
		return 0, pathErr("read", f.name, syscall.EINVAL)
	}
	if off >= int64(len(f.n.data)) {
		return 0, io.EOF
	}
	n := copy(p, f.n.data[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (f *memFile) WriteAt(p []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.begin("write", true); err != nil {
		return 0, err
	}
	if off < 0 {
		return 0, pathErr("write", f.name, syscall.EINVAL)
	}
	if end := off + int64(len(p)); end > int64(len(f.n.data)) {
		f.n.data = append(f.n.data, make([]byte, end-int64(len(f.n.data)))...)
	}
	copy(f.n.data[off:], p)
	f.n.pending = append(f.n.pending, fileChange{off: off, data: clone(p)})
	return len(p), nil
}

// Sync makes the file's data and size durable.
func (f *memFile) Sync() error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.begin("sync", true); err != nil {
		return err
	}
	f.n.synced = clone(f.n.data)
	f.n.pending = nil
	return nil
}

func (f *memFile) Truncate(size int64) error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.begin("truncate", true); err != nil {
		return err
	}
	if size < 0 {
		return pathErr("truncate", f.name, syscall.EINVAL)
	}
	if size <= int64(len(f.n.data)) {
		clear(f.n.data[size:])
		f.n.data = f.n.data[:size]
	} else {
		f.n.data = append(f.n.data, make([]byte, size-int64(len(f.n.data)))...)
	}
	f.n.pending = append(f.n.pending, fileChange{off: size, trunc: true})
	return nil
}

func (f *memFile) Size() (int64, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.begin("size", false); err != nil {
		return 0, err
	}
	return int64(len(f.n.data)), nil
}

// Close closes the file, with the power off too.
func (f *memFile) Close() error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if f.closed {
		return pathErr("close", f.name, os.ErrClosed)
	}
	f.closed = true
	return nil
}

func (f *memFile) Name() string { return f.name }
