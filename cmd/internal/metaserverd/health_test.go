package metaserverd

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/cmd/internal/brokerd"
	"github.com/ferrymq/ferrymq/internal/testcluster"
	"github.com/ferrymq/ferrymq/internal/testwait"
)

// get returns a health endpoint's status code and body.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// TestHealthEndpoints: /healthz and /readyz on -metrics-addr, as the
// Kubernetes probes in deploy/k8s use them. A metaserver is ready once it
// knows a leader, and not while it cannot elect one; a broker is ready once
// the metaserver named it master or slave, and not while it cannot reach a
// metaserver; both are live throughout.
func TestHealthEndpoints(t *testing.T) {
	// A metaserver of three whose two peers do not exist never has a leader.
	rpc, raft := testcluster.FreeAddr(t), testcluster.FreeAddr(t)
	lonely := run(t, "lonely metaserver", Run, "-id", "m1", "-dir", t.TempDir(), "-rpc-addr", rpc, "-raft-addr", raft,
		"-peers", fmt.Sprintf("m1=%s/%s,m2=127.0.0.1:1/127.0.0.1:1,m3=127.0.0.1:2/127.0.0.1:2", raft, rpc), "-metrics-addr", "127.0.0.1:0")
	addr := lonely.logged(t, `serving metrics: addr=(\S+)`)
	if code, body := get(t, "http://"+addr+"/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Fatalf("a leaderless metaserver's /healthz: %d %q, want 200 ok (it is alive)", code, body)
	}
	if code, body := get(t, "http://"+addr+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "not ready") {
		t.Fatalf("a leaderless metaserver's /readyz: %d %q, want 503 saying why", code, body)
	}

	// A broker whose metaserver does not answer is never named.
	orphan := run(t, "orphan broker", brokerd.Run, "-id", "b1", "-group", "g1", "-dir", t.TempDir(),
		"-addr", "127.0.0.1:0", "-ha-addr", "127.0.0.1:0", "-meta", "127.0.0.1:1", "-metrics-addr", "127.0.0.1:0")
	addr = orphan.logged(t, `serving metrics: addr=(\S+)`)
	if code, _ := get(t, "http://"+addr+"/healthz"); code != http.StatusOK {
		t.Fatalf("an unnamed broker's /healthz: %d, want 200", code)
	}
	if code, body := get(t, "http://"+addr+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "has not named this broker") {
		t.Fatalf("an unnamed broker's /readyz: %d %q, want 503 saying it is not named yet", code, body)
	}

	// A working cluster: every server turns ready.
	lc := startLive(t)
	for _, a := range []string{lc.meta, lc.master, lc.slave} {
		testwait.For(t, 20*time.Second, a+"/readyz to answer 200", func() bool {
			code, _ := get(t, "http://"+a+"/readyz")
			return code == http.StatusOK
		})
		if code, _ := get(t, "http://"+a+"/healthz"); code != http.StatusOK {
			t.Fatalf("%s/healthz: %d, want 200", a, code)
		}
	}
}
