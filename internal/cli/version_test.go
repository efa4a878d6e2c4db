package cli

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/nookhq/nook/internal/daemon"
)

// `nook version` and `nook --version` need no daemon.
func TestVersionWithoutDaemon(t *testing.T) {
	t.Setenv("NOOK_HOST", "unix://"+t.TempDir()+"/none.sock")
	var out, errOut bytes.Buffer
	if code := Main([]string{"version", "--json"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	var v versions
	if err := json.Unmarshal(out.Bytes(), &v); err != nil || v.Client != daemon.Version || v.Server != "" || v.Unreachable == "" {
		t.Fatalf("%+v, %v: %s", v, err, out.String())
	}
	out.Reset()
	if code := Main([]string{"--version"}, &out, &errOut); code != 0 || out.String() != "nook version "+daemon.Version+"\n" {
		t.Fatalf("--version: exit %d, %q", code, out.String())
	}
}
