package cli

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

var update = flag.Bool("update", false, "rewrite packaging/config.toml from serve's flags")

// exampleConfig is the documented example configuration, which packaging
// installs.
const exampleConfig = "../../packaging/config.toml"

// writeConfig writes a configuration file for a test.
func writeConfig(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// loadServe parses args with the real serve command's flags, as cobra
// does, then loads the file at path into them, stopping before the
// daemon would start.
func loadServe(t *testing.T, path string, args ...string) (*pflag.FlagSet, *serveConfig, error) {
	t.Helper()
	c := serveCmd()
	if path != "" {
		args = append([]string{"--config", path}, args...)
	}
	if err := c.ParseFlags(args); err != nil {
		t.Fatal(err)
	}
	sc := &serveConfig{path: DefaultServeConfig}
	if path != "" {
		sc.path = path
	}
	return c.Flags(), sc, sc.load(c.Flags())
}

func flagValue(flags *pflag.FlagSet, name string) string {
	f := flags.Lookup(name)
	if sv, ok := f.Value.(pflag.SliceValue); ok {
		return strings.Join(sv.GetSlice(), "|")
	}
	return f.Value.String()
}

// Each TOML type reaches its flag through the flag's own parser, lists
// for repeatable flags (the first element replacing the default, an
// empty list clearing it), hidden test switches too.
func TestServeConfigTypes(t *testing.T) {
	path := writeConfig(t, `# a comment
data-dir = "/srv/nook"          # a string
max-sandboxes = 1000            # an integer
debug = true                    # a switch
preview-wake = false            # a switch on by default
reap-interval = "1m30s"         # a duration
idle-pause = "30m"              # checked by serve itself
max-memory = 0                  # a string flag may take an integer
"log-format" = "json"           # a quoted key
ssh-accept-env = ["LANG", "TZ"] # a list replacing the default
allow-host-mounts = ["/srv/a", "/srv/b,c"]
dns-upstream = []
min-idle-pause = "1s"           # hidden, still a flag
`)
	flags, sc, err := loadServe(t, path)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{
		"data-dir": "/srv/nook", "max-sandboxes": "1000", "debug": "true", "preview-wake": "false",
		"reap-interval": "1m30s", "idle-pause": "30m", "max-memory": "0", "log-format": "json",
		"ssh-accept-env": "LANG|TZ", "allow-host-mounts": "/srv/a|/srv/b,c", "dns-upstream": "",
		"min-idle-pause": "1s", "run-dir": "/run/nook", "warm-pool": "2",
	} {
		if got := flagValue(flags, name); got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
	if !sc.fromFile["data-dir"] || !sc.fromFile["dns-upstream"] || sc.fromFile["run-dir"] || sc.loaded != path {
		t.Errorf("fromFile %v, loaded %q", sc.fromFile, sc.loaded)
	}
	if !flags.Changed("data-dir") || flags.Changed("run-dir") {
		t.Error("a flag the file set must read as given, one it did not as not")
	}

	// An empty list clears a default.
	flags, _, err = loadServe(t, writeConfig(t, "ssh-accept-env = []\n"))
	if err != nil || flagValue(flags, "ssh-accept-env") != "" {
		t.Errorf("ssh-accept-env = []: %q, %v", flagValue(flags, "ssh-accept-env"), err)
	}
}

// A flag on the command line wins over the file, a repeatable one
// wholly (the file's elements are not added to it).
func TestServeConfigFlagsWin(t *testing.T) {
	path := writeConfig(t, `max-sandboxes = 5
data-dir = "/srv/nook"
ssh-accept-env = ["A", "B"]
debug = true
`)
	flags, sc, err := loadServe(t, path, "--max-sandboxes", "1", "--ssh-accept-env", "C", "--debug=false")
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"max-sandboxes": "1", "ssh-accept-env": "C", "debug": "false", "data-dir": "/srv/nook"} {
		if got := flagValue(flags, name); got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
	if sc.fromFile["max-sandboxes"] || !sc.fromFile["data-dir"] {
		t.Errorf("fromFile %v", sc.fromFile)
	}
	// A wrong type is an error even where the command line wins: the
	// file is wrong either way.
	if _, _, err := loadServe(t, writeConfig(t, "max-sandboxes = \"x\"\n"), "--max-sandboxes", "1"); err == nil {
		t.Error("a wrong type under a flag given on the command line was accepted")
	}
}

// A missing default file is no configuration; a missing --config FILE,
// or one that is not a file, is an error.
func TestServeConfigMissing(t *testing.T) {
	c := serveCmd()
	if err := c.ParseFlags(nil); err != nil {
		t.Fatal(err)
	}
	sc := &serveConfig{path: filepath.Join(t.TempDir(), "config.toml")} // as the default, not given
	if err := sc.load(c.Flags()); err != nil || sc.loaded != "" {
		t.Fatalf("a missing default file: %v, loaded %q", err, sc.loaded)
	}
	if flagValue(c.Flags(), "data-dir") != "/var/lib/nook" {
		t.Error("a missing file changed a flag")
	}
	missing := filepath.Join(t.TempDir(), "none.toml")
	if _, _, err := loadServe(t, missing); err == nil || !strings.Contains(err.Error(), "--config: open "+missing) {
		t.Errorf("a missing --config: %v", err)
	}
	if _, _, err := loadServe(t, t.TempDir()); err == nil || !strings.Contains(err.Error(), "is a directory") {
		t.Errorf("a directory as --config: %v", err)
	}
	// --config /dev/null: no configuration, on purpose.
	if _, _, err := loadServe(t, "/dev/null"); err != nil {
		t.Errorf("--config /dev/null: %v", err)
	}
}

// Every mistake in the file is reported at once, each with the file's
// name and its line, and nothing says more than what to write instead.
func TestServeConfigErrors(t *testing.T) {
	path := writeConfig(t, `data_dir = "/srv/nook"
max-sandboxes = "lots"
debug = "yes"
ssh-accept-env = "LANG"
allow-host-mounts = ["/srv", 1]
reap-interval = 5
idle-timeout = "5 minutes"
config = "/etc/other.toml"
listnen = "127.0.0.1:7070"
token = "x"
serve.listen = ":1"
issuer = 2024-01-01
[net]
pool = "10.0.0.0/8"
`)
	_, _, err := loadServe(t, path)
	if err == nil {
		t.Fatal("a wrong file was accepted")
	}
	if _, ok := err.(*usageError); !ok {
		t.Errorf("%T is not a usage error", err)
	}
	msg := err.Error()
	for _, want := range []string{
		path + `:1: unknown key "data_dir": nook serve has no flag --data_dir (did you mean data-dir?)`,
		path + ":2: max-sandboxes is a string; want an integer, as in max-sandboxes = 0",
		path + ":3: debug is a string; want true or false, as in debug = false",
		path + `:4: ssh-accept-env is a string; want a list of strings, as in ssh-accept-env = ["..."]`,
		path + ":5: allow-host-mounts is a list; want a list of strings",
		path + `:6: reap-interval is an integer; want a duration in quotes, as in reap-interval = "5s"`,
		path + `:7: idle-timeout = "5 minutes": time: unknown unit " minutes" in duration "5 minutes"`,
		path + ":8: config cannot be set in the file: give --config on the command line",
		path + `:9: unknown key "listnen": nook serve has no flag --listnen (did you mean listen?)`,
		path + `:10: unknown key "token": nook serve has no flag --token` + "\n",
		path + ":11: serve is a table, and the file has none: write each flag as key = value at its top",
		path + `:12: issuer is a date or time; want a string in quotes, as in issuer = ""`,
		path + ":13: net is a table",
	} {
		if !strings.Contains(msg+"\n", want) {
			t.Errorf("no %q in:\n%s", want, msg)
		}
	}
	if n := strings.Count(msg, "\n") + 1; n != 13 {
		t.Errorf("%d errors, want 13:\n%s", n, msg)
	}

	// TOML that does not parse: the line and column.
	_, _, err = loadServe(t, writeConfig(t, "debug = true\nlisten = \n"))
	if err == nil || !strings.Contains(err.Error(), ".toml:2:10: ") {
		t.Errorf("a syntax error: %v", err)
	}
	_, _, err = loadServe(t, writeConfig(t, "debug = true\ndebug = false\n"))
	if err == nil || !strings.Contains(err.Error(), ".toml:2:1: ") {
		t.Errorf("a key given twice: %v", err)
	}
}

// The daemon runs as root and the file chooses what it runs: a file
// others can write is refused, as is one another user owns.
func TestServeConfigPermissions(t *testing.T) {
	path := writeConfig(t, "debug = true\n")
	if err := os.Chmod(path, 0o646); err != nil {
		t.Fatal(err)
	}
	if _, _, err := loadServe(t, path); err == nil || !strings.Contains(err.Error(), "is writable by other users (mode 0646)") {
		t.Errorf("a world-writable file: %v", err)
	}
	if os.Geteuid() != 0 {
		t.Skip("chown needs root")
	}
	os.Chmod(path, 0o644)
	if err := os.Chown(path, 12345, 12345); err != nil {
		t.Fatal(err)
	}
	if _, _, err := loadServe(t, path); err == nil || !strings.Contains(err.Error(), "belongs to uid 12345") {
		t.Errorf("a file another user owns: %v", err)
	}
	os.Chown(path, 0, 12345)
	os.Chmod(path, 0o664)
	if _, _, err := loadServe(t, path); err == nil || !strings.Contains(err.Error(), "writable by other users") {
		t.Errorf("a file another group can write: %v", err)
	}
	os.Chown(path, 0, 0)
	if _, _, err := loadServe(t, path); err != nil {
		t.Errorf("a file root's group can write: %v", err)
	}
}

// The file must be a regular file, not a symbolic link, FIFO or device
// (/dev/null is no configuration), and no other user may be able to
// change a directory above it: they could put another file there.
func TestServeConfigFileAndDirs(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "etc") // under /tmp, a sticky directory root owns
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(path, []byte("debug = true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := loadServe(t, path); err != nil {
		t.Fatalf("a file in a directory of root's: %v", err)
	}
	fifo := filepath.Join(dir, "fifo.toml")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, _, err := loadServe(t, fifo); done <- err }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "is not a regular file (a FIFO)") {
			t.Errorf("a FIFO as --config: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a FIFO as --config hangs")
	}
	if _, _, err := loadServe(t, "/dev/zero"); err == nil || !strings.Contains(err.Error(), "is not a regular file (a character device)") {
		t.Errorf("/dev/zero as --config: %v", err)
	}
	link := filepath.Join(dir, "link.toml")
	os.Symlink(path, link)
	if _, _, err := loadServe(t, link); err == nil || !strings.Contains(err.Error(), "is a symbolic link") {
		t.Errorf("a symbolic link as --config: %v", err)
	}
	// A link to the directory is followed: its target is what is checked.
	linkDir := filepath.Join(filepath.Dir(dir), "etc-link")
	os.Symlink(dir, linkDir)
	if _, _, err := loadServe(t, filepath.Join(linkDir, "config.toml")); err != nil {
		t.Errorf("through a link to a safe directory: %v", err)
	}

	for _, mode := range []os.FileMode{0o777, 0o775, 0o757} {
		os.Chmod(dir, mode)
		if _, _, err := loadServe(t, path); err == nil || !strings.Contains(err.Error(), "its directory "+dir+" is writable by other users") {
			t.Errorf("a directory of mode %04o: %v", mode, err)
		}
		if _, _, err := loadServe(t, filepath.Join(linkDir, "config.toml")); err == nil || !strings.Contains(err.Error(), "its directory "+dir+" is writable") {
			t.Errorf("through a link to a directory of mode %04o: %v", mode, err)
		}
	}
	// Sticky and root's, as /tmp: only an entry's owner may replace it.
	os.Chmod(dir, os.ModeSticky|0o777)
	if os.Geteuid() != 0 {
		t.Skip("chown needs root")
	}
	if _, _, err := loadServe(t, path); err != nil {
		t.Errorf("in a sticky directory root owns: %v", err)
	}
	if err := os.Chown(dir, 12345, 0); err != nil {
		t.Fatal(err)
	}
	if _, _, err := loadServe(t, path); err == nil || !strings.Contains(err.Error(), "its directory "+dir+" belongs to uid 12345") {
		t.Errorf("in a sticky directory another user owns: %v", err)
	}
	os.Chmod(dir, 0o755)
	if _, _, err := loadServe(t, path); err == nil || !strings.Contains(err.Error(), "its directory "+dir+" belongs to uid 12345") {
		t.Errorf("in a directory another user owns: %v", err)
	}
	os.Chown(dir, 0, 0)
	os.Chmod(filepath.Dir(dir), 0o777) // a directory further up
	if _, _, err := loadServe(t, path); err == nil || !strings.Contains(err.Error(), "its directory "+filepath.Dir(dir)+" is writable") {
		t.Errorf("under a directory others can write: %v", err)
	}
	os.Chmod(filepath.Dir(dir), 0o755)
}

// Through the real command: serve --print-config prints the file and
// the command line merged, after serve's own checks, without starting;
// what it prints is itself a configuration that gives the same flags.
func TestServeConfigMain(t *testing.T) {
	path := writeConfig(t, `data-dir = "/srv/nook"
max-sandboxes = 5
idle-pause = "30m"
ssh-accept-env = ["LANG", "TZ"]
allow-host-mounts = ["/srv/a \"quoted\" one", "/srv/b,c"]
`)
	var out, errOut bytes.Buffer
	if code := Main([]string{"serve", "--config", path, "--max-sandboxes", "1", "--print-config"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	printed := out.String()
	for _, want := range []string{
		"# nook serve's configuration in effect: " + path + " and the command line\n",
		"data-dir = \"/srv/nook\"  # from the file\n",
		"max-sandboxes = 1  # from the command line\n",
		"idle-pause = \"30m\"  # from the file\n",
		"ssh-accept-env = [\"LANG\", \"TZ\"]  # from the file\n",
		"allow-host-mounts = [\"/srv/a \\\"quoted\\\" one\", \"/srv/b,c\"]  # from the file\n",
		"run-dir = \"/run/nook\"\n",
		"reap-interval = \"5s\"\n",
	} {
		if !strings.Contains(printed, want) {
			t.Errorf("no %q in:\n%s", want, printed)
		}
	}
	if strings.Contains(printed, "min-idle-pause") || strings.Contains(printed, "config =") {
		t.Errorf("a hidden flag not given, or --config, printed:\n%s", printed)
	}
	// It reads back to the same flags.
	want, _, err := loadServe(t, path, "--max-sandboxes", "1")
	if err != nil {
		t.Fatal(err)
	}
	got, _, err := loadServe(t, writeConfig(t, printed))
	if err != nil {
		t.Fatalf("the printed configuration does not load: %v\n%s", err, printed)
	}
	want.VisitAll(func(f *pflag.Flag) {
		if f.Name != "config" && flagValue(got, f.Name) != flagValue(want, f.Name) {
			t.Errorf("%s: printed and read back %q, want %q", f.Name, flagValue(got, f.Name), flagValue(want, f.Name))
		}
	})

	// serve's own checks apply to values from the file.
	for content, msg := range map[string]string{
		"max-sandboxes = -1\n":     "--max-sandboxes -1 is not valid",
		"log-format = \"xml\"\n":   `--log-format "xml": give text or json`,
		"max-memory = \"lots\"\n":  `--max-memory: size "lots" is not valid`,
		"net-pool = \"::/64\"\n":   `--net-pool "::/64" is not an IPv4 prefix`,
		"unknown-flag = true\n":    `unknown key "unknown-flag"`,
		"idle-pause = \"1s\"\n":    "--idle-pause",
		"max-sandboxes = 1.5\n":    "max-sandboxes is a float; want an integer",
		"dns-upstream = [\"x\"]\n": `--dns-upstream "x" is not ADDR:PORT`,
	} {
		out.Reset()
		errOut.Reset()
		if code := Main([]string{"serve", "--config", writeConfig(t, content), "--print-config"}, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), msg) {
			t.Errorf("%q: exit %d, stderr %q; want exit 2 and %q", content, code, errOut.String(), msg)
		}
	}
	errOut.Reset()
	if code := Main([]string{"serve", "--config", filepath.Join(t.TempDir(), "none.toml"), "--print-config"}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "none.toml: no such file or directory") {
		t.Errorf("a missing --config: exit %d, %q", code, errOut.String())
	}
}

// packaging/config.toml lists every flag of serve with its help and its
// default: it is generated from the flags, so a new flag fails this test
// until the example is regenerated (go test ./internal/cli -run
// TestServeConfigExample -update). Its defaults, uncommented, load and
// leave every flag at its default.
func TestServeConfigExample(t *testing.T) {
	var b bytes.Buffer
	if err := writeServeConfigExample(&b, serveCmd().Flags()); err != nil {
		t.Fatal(err)
	}
	if *update {
		if err := os.MkdirAll(filepath.Dir(exampleConfig), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(exampleConfig, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	have, err := os.ReadFile(exampleConfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fileFlags(serveCmd().Flags(), false) {
		if !bytes.Contains(have, []byte("\n# "+f.Name+" = ")) {
			t.Errorf("flag --%s is not in %s", f.Name, exampleConfig)
		}
	}
	if !bytes.Equal(have, b.Bytes()) {
		t.Errorf("%s is not what serve's flags make: regenerate it with go test ./internal/cli -run TestServeConfigExample -update", exampleConfig)
	}

	uncommented := regexp.MustCompile(`(?m)^# ([a-z0-9-]+ = .*)$`).ReplaceAll(have, []byte("$1"))
	flags, sc, err := loadServe(t, writeConfig(t, string(uncommented)))
	if err != nil {
		t.Fatalf("the example's defaults do not load: %v", err)
	}
	if len(sc.fromFile) != len(fileFlags(flags, false)) {
		t.Errorf("the example sets %d flags, serve has %d", len(sc.fromFile), len(fileFlags(flags, false)))
	}
	flags.VisitAll(func(f *pflag.Flag) {
		if !configOnlyFlags[f.Name] && f.Value.String() != f.DefValue {
			t.Errorf("%s: the example's default gives %q, the flag's default is %q", f.Name, f.Value.String(), f.DefValue)
		}
	})
}

// Every NOOK_* variable the client reads (the SDK's FromEnv, the CLI)
// is in nook --help.
func TestClientEnvInHelp(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := Main([]string{"--help"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	re := regexp.MustCompile(`Getenv\("(NOOK_[A-Z0-9_]+)"\)`)
	found := 0
	for _, dir := range []string{".", "../../sdk"} {
		files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
		for _, file := range files {
			if strings.HasSuffix(file, "_test.go") {
				continue
			}
			src, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range re.FindAllSubmatch(src, -1) {
				found++
				if !strings.Contains(out.String(), string(m[1])) {
					t.Errorf("%s reads %s, which nook --help does not list", file, m[1])
				}
			}
		}
	}
	if found < 4 {
		t.Errorf("found %d reads of NOOK_* variables; the scan is broken", found)
	}
}

// No file makes the loader panic.
func FuzzServeConfig(f *testing.F) {
	f.Add([]byte("data-dir = \"/srv\"\nmax-sandboxes = 3\n"))
	f.Add([]byte("ssh-accept-env = [\"A\", 1]\n[t]\nx = 1\n"))
	f.Add([]byte("a.b.c = 1\n\"\" = 2\n[[x]]\n"))
	f.Add([]byte("allow-host-mounts = [[\"a\"]]\nidle-pause = 1979-05-27T07:32:00Z\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c := serveCmd()
		applyServeConfig(c.Flags(), "fuzz.toml", data, map[string]bool{})
	})
}
