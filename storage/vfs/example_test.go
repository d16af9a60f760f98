package vfs_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/ferrymq/ferrymq/storage/vfs"
)

// The second write to a segment file fails as on a full disk, after writing
// half of its bytes; other files are not affected.
func ExampleErrorFS() {
	dir, err := os.MkdirTemp("", "vfs-example-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)

	fsys := vfs.NewErrorFS(vfs.Default)
	full := vfs.Fail(vfs.OpWrite).Path("*.log").Nth(2).Partial(2).With(syscall.ENOSPC)
	fsys.Inject(full)

	f, err := fsys.Create(filepath.Join(dir, "00000000000000000000.log"))
	if err != nil {
		panic(err)
	}
	defer f.Close()
	_, err = f.WriteAt([]byte("abcd"), 0)
	fmt.Println("first write:", err)
	n, err := f.WriteAt([]byte("efgh"), 4)
	fmt.Println("second write:", n, errors.Is(err, syscall.ENOSPC), errors.Is(err, vfs.ErrInjected))
	_, err = f.WriteAt([]byte("ij"), 6)
	fmt.Println("third write:", err)
	fmt.Println("rule saw", full.Seen(), "writes and failed", full.Fired())
	// Output:
	// first write: <nil>
	// second write: 2 true true
	// third write: <nil>
	// rule saw 3 writes and failed 1
}
