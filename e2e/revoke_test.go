package e2e

import (
	"encoding/json"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferrymq/ferrymq/internal/testwait"
	"github.com/ferrymq/ferrymq/protocol"
)

// rawCall writes one request on nc and reads its answer, within 10 s.
func rawCall(nc net.Conn, code protocol.Code, body []byte) (protocol.Frame, error) {
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	b, err := protocol.AppendFrame(nil, &protocol.Frame{Code: code, Opaque: 1, Body: body})
	if err != nil {
		return protocol.Frame{}, err
	}
	if _, err := nc.Write(b); err != nil {
		return protocol.Frame{}, err
	}
	var lenBuf [4]byte
	if _, err := io.ReadFull(nc, lenBuf[:]); err != nil {
		return protocol.Frame{}, err
	}
	n, err := protocol.FrameLength(lenBuf[:])
	if err != nil {
		return protocol.Frame{}, err
	}
	buf := make([]byte, n)
	copy(buf, lenBuf[:])
	if _, err := io.ReadFull(nc, buf[4:]); err != nil {
		return protocol.Frame{}, err
	}
	return protocol.DecodeFrame(buf)
}

// TestRevocationClosesConnectionsThroughProcesses: the local cluster with
// FERRY_AUTH=1. A principal's connections, authenticated with its token,
// to every metaserver and to g1's master's data and HA ports are closed
// by the servers once `ferryctl acl rm` removed it: within the brokers'
// heartbeat, not at the next request.
func TestRevocationClosesConnectionsThroughProcesses(t *testing.T) {
	c := startLocalCluster(t, "FERRY_AUTH=1")
	admin := filepath.Join(c.home, "auth", "admin.token")
	code, out, errOut := c.ctlExit("--json", "acl", "add", "app1", "--perm", "describe", "--token-file", admin)
	if code != 0 {
		t.Fatalf("acl add: exit %d: %s", code, errOut)
	}
	var made struct{ Token string }
	if err := json.Unmarshal([]byte(out), &made); err != nil || made.Token == "" {
		t.Fatalf("acl add printed %q: %v", out, err)
	}
	addrs := append(strings.Split(c.meta, ","), c.addr("g1-master"), c.haAddr("g1-master"))
	var conns []net.Conn
	for _, addr := range addrs {
		var nc net.Conn
		// A metaserver applies the new principal as it commits; a broker
		// fetches its table for a token it does not know.
		testwait.For(t, 20*time.Second, "app1 to authenticate at "+addr, func() bool {
			var err error
			if nc, err = net.Dial("tcp", addr); err != nil {
				return false
			}
			if f, err := rawCall(nc, protocol.CodeAuth, []byte(made.Token)); err == nil && f.Status == protocol.StatusOK {
				return true
			}
			_ = nc.Close()
			return false
		})
		t.Cleanup(func() { _ = nc.Close() })
		conns = append(conns, nc)
	}
	if code, _, errOut := c.ctlExit("acl", "rm", "app1", "--token-file", admin); code != 0 {
		t.Fatalf("acl rm: exit %d: %s", code, errOut)
	}
	for i, nc := range conns {
		_ = nc.SetReadDeadline(time.Now().Add(20 * time.Second))
		if _, err := nc.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
			t.Fatalf("app1's connection to %s after acl rm: read %v, want it closed by the server", addrs[i], err)
		}
	}
}
