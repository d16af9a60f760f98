package vfs

import (
	"errors"
	"fmt"
	"math/bits"
	"path/filepath"
	"strings"
	"sync"
)

// Op is a kind of operation on an FS or a File. Ops are bits: a set of kinds
// is their union, such as OpWrite|OpSync.
type Op uint32

// The operations an ErrorFS can fail.
const (
	OpCreate   Op = 1 << iota // FS.Create
	OpOpen                    // FS.OpenRW
	OpRemove                  // FS.Remove
	OpRename                  // FS.Rename
	OpList                    // FS.List
	OpMkdirAll                // FS.MkdirAll
	OpSyncDir                 // FS.SyncDir
	OpRead                    // File.ReadAt
	OpWrite                   // File.WriteAt
	OpSync                    // File.Sync
	OpTruncate                // File.Truncate
	OpSize                    // File.Size
	OpClose                   // File.Close

	opEnd

	// OpAll is every operation.
	OpAll = opEnd - 1
	// OpMutations is every operation that changes what is on disk.
	OpMutations = OpCreate | OpRemove | OpRename | OpMkdirAll | OpSyncDir | OpWrite | OpSync | OpTruncate
)

var opNames = [...]string{"create", "open", "remove", "rename", "list", "mkdirall", "syncdir",
	"read", "write", "sync", "truncate", "size", "close"}

// String names the operation, or the operations of a set joined by "|".
func (o Op) String() string {
	var names []string
	for i, n := range opNames {
		if o&(1<<i) != 0 {
			names = append(names, n)
		}
	}
	if o == 0 {
		return "Op(0)"
	}
	if rest := o &^ OpAll; rest != 0 {
		names = append(names, fmt.Sprintf("Op(%#x)", uint32(rest)))
	}
	return strings.Join(names, "|")
}

// Call is one operation about to run on an ErrorFS, as a rule sees it.
type Call struct {
	Op      Op     // one kind
	Path    string // the file or directory; for OpRename, the old name
	NewPath string // OpRename: the new name
	Offset  int64  // OpRead, OpWrite: the offset; OpTruncate: the new size
	Len     int    // OpRead, OpWrite: the length of the buffer
}

func (c Call) String() string {
	if c.Op == OpRename {
		return fmt.Sprintf("rename %s %s", c.Path, c.NewPath)
	}
	return c.Op.String() + " " + c.Path
}

// ErrInjected is matched (with errors.Is) by every error an ErrorFS injects.
var ErrInjected = errors.New("vfs: injected error")

// InjectedError is the error an ErrorFS returns for a call a rule fails.
// errors.Is matches it with ErrInjected and with the rule's error, if the
// rule has one (syscall.ENOSPC, say).
type InjectedError struct {
	Call Call
	Err  error // the rule's error; nil if it set none
}

func (e *InjectedError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("%s: %v", ErrInjected, e.Call)
	}
	return fmt.Sprintf("%s: %v: %v", ErrInjected, e.Call, e.Err)
}

// Unwrap returns ErrInjected and the rule's error.
func (e *InjectedError) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrInjected}
	}
	return []error{ErrInjected, e.Err}
}

// Rule chooses calls to fail. Make one with Fail and narrow it with its
// methods, then give it to ErrorFS.Inject. A rule counts the calls it
// matches (of its kinds, on its paths, passing its predicate); of those, the
// first After are let through, and the ones after fail, at most Times of
// them. Without After and Times, every matching call fails.
//
// The methods that configure a rule must be called before it is injected.
// Seen and Fired may be called at any time, from any goroutine.
type Rule struct {
	ops     Op
	glob    string
	pred    func(Call) bool
	skip    int64
	limit   int64 // 0: no limit
	err     error
	partial int

	mu    sync.Mutex
	seen  int64
	fired int64
}

// Fail returns a rule failing every call of the given kinds.
func Fail(ops Op) *Rule { return &Rule{ops: ops} }

// Path limits the rule to calls on paths matching the glob pattern (the
// syntax of filepath.Match). A pattern without a separator is matched
// against the last element of the path ("*.log"), one with a separator
// against the whole path. A rename matches if either of its names does. It
// panics on a malformed pattern.
func (r *Rule) Path(pattern string) *Rule {
	if _, err := filepath.Match(pattern, ""); err != nil {
		panic(fmt.Sprintf("vfs: bad path pattern %q: %v", pattern, err))
	}
	r.glob = pattern
	return r
}

// Where limits the rule to calls for which pred returns true. pred runs
// with the ErrorFS's lock held: it must not call into that ErrorFS.
func (r *Rule) Where(pred func(Call) bool) *Rule {
	r.pred = pred
	return r
}

// After lets the first n matching calls through: the rule fails calls from
// the (n+1)th on.
func (r *Rule) After(n int) *Rule {
	r.skip = int64(n)
	return r
}

// Times makes the rule fail at most n calls (n > 0).
func (r *Rule) Times(n int) *Rule {
	if n <= 0 {
		panic("vfs: Rule.Times needs n > 0")
	}
	r.limit = int64(n)
	return r
}

// Nth makes the rule fail only the nth matching call (counting from 1):
// After(n-1).Times(1).
func (r *Rule) Nth(n int) *Rule {
	if n <= 0 {
		panic("vfs: Rule.Nth needs n > 0")
	}
	return r.After(n - 1).Times(1)
}

// With sets the cause of the injected error, such as syscall.ENOSPC or
// syscall.EIO: errors.Is matches the injected error with it.
func (r *Rule) With(err error) *Rule {
	r.err = err
	return r
}

// Partial makes a failed WriteAt write the first n bytes of its buffer
// before it fails, as a disk that fills up in the middle of a write does.
// It only affects OpWrite.
func (r *Rule) Partial(n int) *Rule {
	r.partial = n
	return r
}

// Seen returns how many calls the rule matched (failed or not).
func (r *Rule) Seen() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seen
}

// Fired returns how many calls the rule failed.
func (r *Rule) Fired() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.fired
}

func (r *Rule) matches(c Call) bool {
	if r.ops&c.Op == 0 {
		return false
	}
	if r.glob != "" && !matchPath(r.glob, c.Path) && (c.NewPath == "" || !matchPath(r.glob, c.NewPath)) {
		return false
	}
	return r.pred == nil || r.pred(c)
}

func matchPath(pattern, path string) bool {
	if !strings.ContainsRune(pattern, filepath.Separator) {
		path = filepath.Base(path)
	}
	ok, _ := filepath.Match(pattern, path)
	return ok
}

// check counts c if it matches and reports whether the rule fails it.
func (r *Rule) check(c Call) bool {
	if !r.matches(c) {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen++
	if r.seen <= r.skip || (r.limit > 0 && r.fired >= r.limit) {
		return false
	}
	r.fired++
	return true
}

// ErrorFS wraps an FS and fails the calls its rules choose, to test how a
// program survives a full disk or an I/O error. A call a rule fails does not
// reach the wrapped FS (but see Rule.Partial, and OpClose, which closes the
// file and then reports the error, as close(2) does). With no rules, every
// call goes through. It is safe for concurrent use, and rules may be
// injected and dropped while calls run.
type ErrorFS struct {
	fs FS

	mu    sync.Mutex
	rules []*Rule
	calls [32]int64 // per op bit: calls passed to fs
}

// NewErrorFS wraps fs.
func NewErrorFS(fs FS) *ErrorFS { return &ErrorFS{fs: fs} }

// Inject adds rules. Rules are checked in the order they were injected; the
// first that fails a call ends the check, so later rules do not count it.
func (e *ErrorFS) Inject(rules ...*Rule) {
	e.mu.Lock()
	e.rules = append(e.rules, rules...)
	e.mu.Unlock()
}

// Drop removes rules; the calls they would have failed go through again.
func (e *ErrorFS) Drop(rules ...*Rule) {
	e.mu.Lock()
	defer e.mu.Unlock()
	kept := e.rules[:0]
	for _, r := range e.rules {
		dropped := false
		for _, d := range rules {
			dropped = dropped || r == d
		}
		if !dropped {
			kept = append(kept, r)
		}
	}
	clear(e.rules[len(kept):])
	e.rules = kept
}

// DropAll removes every rule.
func (e *ErrorFS) DropAll() {
	e.mu.Lock()
	e.rules = nil
	e.mu.Unlock()
}

// Calls returns how many calls of the given kinds were passed to the wrapped
// FS (whatever it answered). Calls that a rule failed are not counted, not
// even a partial write.
func (e *ErrorFS) Calls(ops Op) int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	var n int64
	for o := ops & OpAll; o != 0; o &= o - 1 {
		n += e.calls[bits.TrailingZeros32(uint32(o))]
	}
	return n
}

// check returns the error to inject for c, or counts c as passed through.
func (e *ErrorFS) check(c Call) (*Rule, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, r := range e.rules {
		if r.check(c) {
			return r, &InjectedError{Call: c, Err: r.err}
		}
	}
	e.calls[bits.TrailingZeros32(uint32(c.Op))]++
	return nil, nil
}

func (e *ErrorFS) wrap(f File, err error) (File, error) {
	if err != nil {
		return nil, err
	}
	return &errorFile{f: f, fs: e}, nil
}

// Create implements FS.
func (e *ErrorFS) Create(name string) (File, error) {
	if _, err := e.check(Call{Op: OpCreate, Path: name}); err != nil {
		return nil, err
	}
	return e.wrap(e.fs.Create(name))
}

// OpenRW implements FS.
func (e *ErrorFS) OpenRW(name string) (File, error) {
	if _, err := e.check(Call{Op: OpOpen, Path: name}); err != nil {
		return nil, err
	}
	return e.wrap(e.fs.OpenRW(name))
}

// Remove implements FS.
func (e *ErrorFS) Remove(name string) error {
	if _, err := e.check(Call{Op: OpRemove, Path: name}); err != nil {
		return err
	}
	return e.fs.Remove(name)
}

// Rename implements FS.
func (e *ErrorFS) Rename(oldname, newname string) error {
	if _, err := e.check(Call{Op: OpRename, Path: oldname, NewPath: newname}); err != nil {
		return err
	}
	return e.fs.Rename(oldname, newname)
}

// List implements FS.
func (e *ErrorFS) List(dir string) ([]string, error) {
	if _, err := e.check(Call{Op: OpList, Path: dir}); err != nil {
		return nil, err
	}
	return e.fs.List(dir)
}

// MkdirAll implements FS.
func (e *ErrorFS) MkdirAll(dir string) error {
	if _, err := e.check(Call{Op: OpMkdirAll, Path: dir}); err != nil {
		return err
	}
	return e.fs.MkdirAll(dir)
}

// SyncDir implements FS.
func (e *ErrorFS) SyncDir(dir string) error {
	if _, err := e.check(Call{Op: OpSyncDir, Path: dir}); err != nil {
		return err
	}
	return e.fs.SyncDir(dir)
}

type errorFile struct {
	f  File
	fs *ErrorFS
}

func (f *errorFile) ReadAt(p []byte, off int64) (int, error) {
	if _, err := f.fs.check(Call{Op: OpRead, Path: f.f.Name(), Offset: off, Len: len(p)}); err != nil {
		return 0, err
	}
	return f.f.ReadAt(p, off)
}

func (f *errorFile) WriteAt(p []byte, off int64) (int, error) {
	r, err := f.fs.check(Call{Op: OpWrite, Path: f.f.Name(), Offset: off, Len: len(p)})
	if err == nil {
		return f.f.WriteAt(p, off)
	}
	n := min(r.partial, len(p))
	if n <= 0 {
		return 0, err
	}
	if n, werr := f.f.WriteAt(p[:n], off); werr != nil {
		return n, werr
	}
	return n, err
}

func (f *errorFile) Sync() error {
	if _, err := f.fs.check(Call{Op: OpSync, Path: f.f.Name()}); err != nil {
		return err
	}
	return f.f.Sync()
}

func (f *errorFile) Truncate(size int64) error {
	if _, err := f.fs.check(Call{Op: OpTruncate, Path: f.f.Name(), Offset: size}); err != nil {
		return err
	}
	return f.f.Truncate(size)
}

func (f *errorFile) Size() (int64, error) {
	if _, err := f.fs.check(Call{Op: OpSize, Path: f.f.Name()}); err != nil {
		return 0, err
	}
	return f.f.Size()
}

func (f *errorFile) Close() error {
	_, err := f.fs.check(Call{Op: OpClose, Path: f.f.Name()})
	cerr := f.f.Close() // a failed close(2) still releases the file
	if err != nil {
		return err
	}
	return cerr
}

func (f *errorFile) Name() string { return f.f.Name() }
