package brokerd

import (
	"testing"

	"github.com/ferrymq/ferrymq/cmd/internal/clitest"
)

// The TLS flags: a broker with a certificate, its key and a CA starts; a
// missing file or a certificate without its key exits 2 naming the flag.
func TestTLSFlags(t *testing.T) {
	clitest.TLSFlags(t, Run, "b", func() []string {
		return []string{"-id", "b", "-group", "g", "-dir", t.TempDir(), "-addr", "127.0.0.1:0", "-ha-addr", "127.0.0.1:0", "-meta", "127.0.0.1:1"}
	})
}
