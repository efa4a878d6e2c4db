package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// nook serve --config: the file sets flags (host limits, the warm pool),
// a flag on the command line wins over it (--max-sandboxes, and
// --data-dir, which the test daemon always gives), --print-config shows
// the two merged, and a wrong file stops serve naming its line.
func TestServeConfigFile(t *testing.T) {
	dir := t.TempDir()
	notUsed := filepath.Join(dir, "not-used")
	path := filepath.Join(dir, "config.toml")
	conf := `# nook serve's configuration
max-sandboxes = 5
max-memory = "1G"
warm-pool = -1
data-dir = "` + notUsed + `"
`
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	d := newDaemon(t, "--config", path, "--max-sandboxes", "1")
	d.must("create", "--name", "conf-a", "--memory", "256M")
	out := d.must("info")
	for _, want := range []string{"data dir: " + d.data + "\n", "sandboxes: 1 of 1 (--max-sandboxes)\n", "committed memory: 256M of 1G (--max-memory)\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in info:\n%s", want, out)
		}
	}
	if _, err := os.Stat(notUsed); err == nil {
		t.Errorf("the file's data-dir %s was used, not --data-dir", notUsed)
	}
	bad := filepath.Join(dir, "bad.toml")
	if err := os.WriteFile(bad, []byte("debug = true\nmax-sandboxes = \"lots\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d.expectCLI(t, []cliCase{
		{[]string{"create", "--name", "conf-b", "--memory", "64M"}, 1, "host limit reached: 1 sandbox exists (nook serve --max-sandboxes 1)"},
		{[]string{"serve", "--config", bad}, 2, bad + ":2: max-sandboxes is a string; want an integer"},
		{[]string{"serve", "--config", filepath.Join(dir, "none.toml")}, 1, "--config: open " + filepath.Join(dir, "none.toml") + ": no such file or directory"},
	})
	r, err := d.nook("serve", "--config", path, "--max-sandboxes", "1", "--print-config")
	if err != nil || r.code != 0 {
		t.Fatalf("--print-config: exit %d, %v: %s", r.code, err, r.stderr)
	}
	for _, want := range []string{"max-sandboxes = 1  # from the command line\n", "max-memory = \"1G\"  # from the file\n", "warm-pool = -1  # from the file\n"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("no %q in --print-config:\n%s", want, r.stdout)
		}
	}
}
