package e2e

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestClusterFilesAndStop runs the cluster of scripts/cluster.sh, writes
// to it, and then checks what an operator relies on: its files are its
// user's (data 0600 in 0700 directories, logs 0640 in a 0750 directory),
// and `cluster.sh stop` stops the 7 processes together, in about the time
// of one, and none of them (the metaservers last to go least of all) logs
// an ERROR for it.
func TestClusterFilesAndStop(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	c := startLocalCluster(t)
	c.ctl("topic", "create", "modes", "--queues", "4")
	for i := range 20 {
		c.ctl("send", "modes", "--body", "a body no other user reads", "--key", string(rune('a'+i)))
	}

	t.Run("files are private", func(t *testing.T) {
		check := func(root string, fileMax, dirMax os.FileMode) int {
			n := 0
			err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
				if err != nil {
					return err
				}
				info, err := d.Info()
				if err != nil {
					return err
				}
				want := fileMax
				if d.IsDir() {
					want = dirMax
				} else {
					n++
				}
				if perm := info.Mode().Perm(); perm&^want != 0 {
					t.Errorf("%s is %v; want no permission beyond %v", path, perm, want)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
		if n := check(filepath.Join(c.home, "data"), 0o600, 0o700); n < 10 {
			t.Fatalf("%d files under data/: the servers wrote too little to judge", n)
		}
		if n := check(filepath.Join(c.home, "logs"), 0o640, 0o750); n != 7 {
			t.Fatalf("%d logs, want 7", n)
		}
	})

	t.Run("stop in parallel without error", func(t *testing.T) {
		names := []string{"meta-m1", "meta-m2", "meta-m3", "g1-master", "g1-slave", "g2-master", "g2-slave"}
		pids := map[string]int{}
		for _, name := range names {
			pids[name] = c.pid(name)
		}
		start := time.Now()
		out := c.script("stop")
		took := time.Since(start)
		for _, name := range names {
			if !strings.Contains(out, "stopped "+name) {
				t.Fatalf("stop did not stop %s:\n%s", name, out)
			}
			if err := syscall.Kill(pids[name], 0); err == nil {
				t.Fatalf("%s (pid %d) still runs after stop", name, pids[name])
			}
		}
		if strings.Contains(out, "killing it") {
			t.Fatalf("stop had to kill:\n%s", out)
		}
		t.Logf("cluster.sh stop took %v for %d processes", took.Round(10*time.Millisecond), len(names))
		// One at a time, each took about 2 s (14 s in all); together they
		// take about as long as the slowest.
		if took > 7*time.Second {
			t.Fatalf("stop took %v: the processes were not stopped together", took)
		}
		for _, name := range names {
			b, err := os.ReadFile(filepath.Join(c.home, "logs", name+".log"))
			if err != nil {
				t.Fatal(err)
			}
			for _, line := range strings.Split(string(b), "\n") {
				if strings.Contains(line, "[ERROR]") {
					t.Errorf("%s logged an ERROR in a clean stop: %s", name, line)
				}
			}
		}
	})
}
