package layerstore

import (
	"os"
	"testing"
)

// requireRoot skips a test that needs root. (Not testutil's: testutil
// imports the template store, which imports this package.)
func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root (mounts, chown, device nodes); make test runs it as root")
	}
}
