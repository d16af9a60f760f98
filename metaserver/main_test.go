package metaserver

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain is the one TestMain of the directory's test binary: it covers
// the internal tests (package metaserver) and the external ones (package
// metaserver_test, which use internal/testcluster) alike.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
