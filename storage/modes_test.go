package storage

import (
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// TestFilesArePrivate: what the log creates on the operating system's file
// system, its directory, segments, index chunks, checkpoint and a cut's
// side file, is for its owner alone: files 0600, directories 0700 (no
// other local user reads message bodies). The umask can only take bits
// away, so the modes are checked for no bit beyond those.
func TestFilesArePrivate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data", "broker")
	l := openLog(t, Config{Dir: dir, SegmentSize: 4 << 10})
	for i := range 200 {
		mustAppend(t, l, []Entry{{Topic: "t", Queue: uint32(i % 3), Payload: payloadFor("t", uint32(i%3), int64(i/3), 100)}}, i%20 == 0)
	}
	if _, err := l.Truncate(l.EndOffset()/2, filepath.Join(dir, "truncated", "cut.log")); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	var files, dirs []string
	err := filepath.WalkDir(filepath.Dir(dir), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(filepath.Dir(dir), path)
		perm := info.Mode().Perm()
		switch {
		case d.IsDir():
			dirs = append(dirs, rel)
			if perm&^0o700 != 0 {
				t.Errorf("directory %s is %v; want no permission beyond 0700", rel, perm)
			}
		default:
			files = append(files, rel)
			if perm&^0o600 != 0 {
				t.Errorf("file %s is %v; want no permission beyond 0600", rel, perm)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("directories %v, files %v", dirs, files)
	joined := strings.Join(files, " ")
	if strings.Count(joined, ".log") < 3 || !strings.Contains(joined, "truncated/") || len(dirs) < 3 {
		t.Fatalf("the log made too little to judge: directories %v, files %v", dirs, files)
	}
}
