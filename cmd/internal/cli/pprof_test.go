package cli

import (
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
)

func TestServePprof(t *testing.T) {
	stop, err := ServePprof("", hclog.NewNullLogger())
	if err != nil {
		t.Fatalf("an empty address is off, got %v", err)
	}
	stop()

	// Take a free port, then serve on it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	stop, err = ServePprof(addr, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	resp, err := http.Get("http://" + addr + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "goroutine profile") {
		t.Fatalf("GET goroutine profile: %s\n%.200s", resp.Status, body)
	}
	if _, err := ServePprof(addr, hclog.NewNullLogger()); err == nil || !strings.Contains(err.Error(), "pprof") {
		t.Fatalf("a taken address: got %v, want an error naming pprof", err)
	}
}
