package cli

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	toml "github.com/pelletier/go-toml/v2"
	"github.com/pelletier/go-toml/v2/unstable"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// DefaultServeConfig is the file nook serve reads its configuration from
// unless --config names another. It may be missing.
const DefaultServeConfig = "/etc/nook/config.toml"

// serveConfig is nook serve's configuration file: TOML whose keys are
// serve's flag names (data-dir = "/srv/nook", max-sandboxes = 1000,
// debug = true, allow-host-mounts = ["/srv/shared"] for a repeatable
// flag), one level, no tables. Each value goes through its flag's own
// parser (pflag.Value.Set), so the file accepts exactly what the command
// line does; a flag given on the command line wins over the file.
type serveConfig struct {
	path  string // --config
	print bool   // --print-config
	// fromFile holds the flags the file set (the command line did not).
	fromFile map[string]bool
	// loaded is the file read, "" when the default file does not exist.
	loaded string
}

// configOnlyFlags are serve's flags the file cannot set.
var configOnlyFlags = map[string]bool{"config": true, "print-config": true, "help": true}

func (sc *serveConfig) add(c *cobra.Command) {
	c.Flags().StringVar(&sc.path, "config", DefaultServeConfig, "read flags from this TOML `FILE` (key = value, each flag by its name; a flag on the command line wins); a missing default file is fine")
	c.Flags().BoolVar(&sc.print, "print-config", false, "print the configuration in effect (the file and the command line) as TOML and exit, without starting the daemon")
}

// load reads the file and sets each flag it names that the command line
// did not. Errors in the file are usage errors naming the file and line.
func (sc *serveConfig) load(flags *pflag.FlagSet) error {
	explicit := flags.Changed("config")
	data, err := readConfigFile(sc.path)
	if err != nil {
		if !explicit && errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("--config: %w", err)
	}
	sc.loaded = sc.path
	sc.fromFile = map[string]bool{}
	if err := applyServeConfig(flags, sc.path, data, sc.fromFile); err != nil {
		return &usageError{err}
	}
	return nil
}

// readConfigFile reads a configuration file. The daemon runs as root and
// the file chooses the binaries it runs (--runc, --criu, --agent) and the
// host directories sandboxes may mount, so a file another user could
// write, or put in its place, would hand them root:
//
//   - it must be a regular file, not a symbolic link (opened with
//     O_NOFOLLOW), a FIFO (which would hang the start) or a device;
//     /dev/null is taken as no configuration;
//   - it must belong to root (or to the user running nook), and not be
//     writable by others, nor by a group other than root's (or the
//     daemon's);
//   - each directory above it (symbolic links resolved) must belong to
//     root or that user and be writable by neither group nor others,
//     except a sticky directory root owns (/tmp): there only an entry's
//     owner can rename or remove it, and the entry under it is checked in
//     turn, so no other user can swap it.
func readConfigFile(path string) ([]byte, error) {
	if path == os.DevNull {
		return nil, nil // --config /dev/null: no configuration, on purpose
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	dir, err := filepath.EvalSymlinks(filepath.Dir(abs))
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	// O_NONBLOCK: opening a FIFO waits for a writer without it.
	f, err := os.OpenFile(filepath.Join(dir, filepath.Base(abs)), os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return nil, fmt.Errorf("%s is a symbolic link: the daemon takes its configuration only from the file itself (give --config the path it points to)", path)
		}
		var pe *fs.PathError
		if errors.As(err, &pe) {
			pe.Path = path
		}
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if fi.IsDir() {
		return nil, fmt.Errorf("%s is a directory, not a TOML file", path)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file (%s): give a TOML file, or /dev/null for no configuration", path, fileKind(fi.Mode()))
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		if st.Uid != 0 && int(st.Uid) != os.Geteuid() {
			return nil, fmt.Errorf("%s belongs to uid %d: the daemon takes its configuration only from a file root owns (chown root %s)", path, st.Uid, path)
		}
		perm := fi.Mode().Perm()
		if perm&0o002 != 0 || perm&0o020 != 0 && st.Gid != 0 && int(st.Gid) != os.Getegid() {
			return nil, fmt.Errorf("%s is writable by other users (mode %04o): the daemon takes its configuration only from a file they cannot change (chmod go-w %s)", path, perm, path)
		}
	}
	if err := checkConfigDirs(dir); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return io.ReadAll(f)
}

// checkConfigDirs checks dir (with no symbolic links) and each directory
// above it as readConfigFile says.
func checkConfigDirs(dir string) error {
	for d := dir; ; d = filepath.Dir(d) {
		fi, err := os.Lstat(d)
		if err != nil {
			return err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			if st.Uid != 0 && int(st.Uid) != os.Geteuid() {
				return fmt.Errorf("its directory %s belongs to uid %d, who could put another file in its place: the daemon takes its configuration only from directories root owns (chown root %s)", d, st.Uid, d)
			}
			mode := st.Mode & 0o7777
			if mode&0o022 != 0 && (mode&0o1000 == 0 || st.Uid != 0) {
				return fmt.Errorf("its directory %s is writable by other users (mode %04o), who could put another file in its place: the daemon takes its configuration only from directories they cannot change (chmod go-w %s)", d, mode, d)
			}
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}

// fileKind names a file's type for an error.
func fileKind(m fs.FileMode) string {
	switch {
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a device"
	}
	return m.Type().String()
}

// applyServeConfig sets the flags the TOML document data (read from path)
// names, except those the command line set; it records the ones it set in
// set. It reports every problem in the file, each with its line.
func applyServeConfig(flags *pflag.FlagSet, path string, data []byte, set map[string]bool) error {
	var doc map[string]any
	if err := toml.Unmarshal(data, &doc); err != nil {
		var de *toml.DecodeError
		if errors.As(err, &de) {
			line, col := de.Position()
			return fmt.Errorf("%s:%d:%d: %s", path, line, col, strings.TrimPrefix(de.Error(), "toml: "))
		}
		return fmt.Errorf("%s: %w", path, err)
	}
	lines := keyLines(data)
	keys := make([]string, 0, len(doc))
	for k := range doc {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if lines[keys[i]] != lines[keys[j]] {
			return lines[keys[i]] < lines[keys[j]]
		}
		return keys[i] < keys[j]
	})
	cmdline := map[string]bool{}
	flags.Visit(func(f *pflag.Flag) { cmdline[f.Name] = true })
	var errs []error
	for _, k := range keys {
		at := fmt.Sprintf("%s:%d", path, lines[k])
		f := flags.Lookup(k)
		_, table := doc[k].(map[string]any)
		switch {
		case table:
			errs = append(errs, fmt.Errorf("%s: %s is a table, and the file has none: write each flag as key = value at its top", at, k))
			continue
		case configOnlyFlags[k]:
			errs = append(errs, fmt.Errorf("%s: %s cannot be set in the file: give --%s on the command line", at, k, k))
			continue
		case f == nil:
			errs = append(errs, fmt.Errorf("%s: unknown key %q: nook serve has no flag --%s%s", at, k, k, suggestFlag(flags, k)))
			continue
		}
		vals, err := flagStrings(f, doc[k])
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %s is %s; %v", at, k, tomlKind(doc[k]), err))
			continue
		}
		if cmdline[k] {
			continue // the command line wins
		}
		if err := setFlag(flags, f, vals); err != nil {
			errs = append(errs, fmt.Errorf("%s: %s = %s: %v", at, k, tomlValue(doc[k]), err))
			continue
		}
		set[k] = true
	}
	return errors.Join(errs...)
}

// setFlag sets a flag through its own Value.Set: a repeatable flag once
// per element (the first replaces its default, as on the command line),
// an empty list clearing it.
func setFlag(flags *pflag.FlagSet, f *pflag.Flag, vals []string) error {
	if sv, ok := f.Value.(pflag.SliceValue); ok && len(vals) == 0 {
		if err := sv.Replace(nil); err != nil {
			return err
		}
		f.Changed = true
		return nil
	}
	for _, v := range vals {
		if err := flags.Set(f.Name, v); err != nil {
			var ive *pflag.InvalidValueError
			if errors.As(err, &ive) && ive.Unwrap() != nil {
				return ive.Unwrap()
			}
			return err
		}
	}
	return nil
}

// flagStrings turns a TOML value into the strings the flag parses, if
// its TOML type fits the flag: a list for a repeatable flag, a boolean
// for a switch, an integer for a count, a string for the rest (durations
// and sizes included: "5s", "64G"). The error says what to write.
func flagStrings(f *pflag.Flag, v any) ([]string, error) {
	want := func(what string) error {
		return fmt.Errorf("want %s, as in %s = %s", what, f.Name, flagDefaultTOML(f))
	}
	if _, ok := f.Value.(pflag.SliceValue); ok {
		list, ok := v.([]any)
		if !ok {
			return nil, fmt.Errorf("want a list of strings, as in %s = [\"...\"]", f.Name)
		}
		out := make([]string, len(list))
		for i, e := range list {
			s, ok := e.(string)
			if !ok {
				return nil, fmt.Errorf("want a list of strings, as in %s = [\"...\"]", f.Name)
			}
			out[i] = s
		}
		return out, nil
	}
	switch f.Value.Type() {
	case "bool":
		if b, ok := v.(bool); ok {
			return []string{strconv.FormatBool(b)}, nil
		}
		return nil, want("true or false")
	case "int", "int8", "int16", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64":
		if n, ok := v.(int64); ok {
			return []string{strconv.FormatInt(n, 10)}, nil
		}
		return nil, want("an integer")
	case "float32", "float64":
		switch n := v.(type) {
		case int64:
			return []string{strconv.FormatInt(n, 10)}, nil
		case float64:
			return []string{strconv.FormatFloat(n, 'g', -1, 64)}, nil
		}
		return nil, want("a number")
	case "duration":
		if s, ok := v.(string); ok {
			return []string{s}, nil
		}
		return nil, want("a duration in quotes")
	}
	switch x := v.(type) {
	case string:
		return []string{x}, nil
	case int64: // max-memory = 0
		return []string{strconv.FormatInt(x, 10)}, nil
	}
	return nil, want("a string in quotes")
}

// keyLines maps each top-level key (a table's name included) to the line
// it is first set on.
func keyLines(data []byte) map[string]int {
	lines := map[string]int{}
	var p unstable.Parser
	p.Reset(data)
	inTable := false
	for p.NextExpression() {
		e := p.Expression()
		if e.Kind != unstable.KeyValue && e.Kind != unstable.Table && e.Kind != unstable.ArrayTable {
			continue
		}
		if e.Kind == unstable.KeyValue && inTable {
			continue // a key of the table
		}
		inTable = inTable || e.Kind != unstable.KeyValue
		it := e.Key()
		if !it.Next() {
			continue
		}
		k := it.Node()
		name := string(k.Data)
		if _, ok := lines[name]; !ok {
			lines[name] = p.Shape(k.Raw).Start.Line
		}
	}
	return lines
}

// suggestFlag names the visible flag nearest to an unknown key, if one is
// near: " (did you mean data-dir?)".
func suggestFlag(flags *pflag.FlagSet, key string) string {
	norm := strings.ToLower(strings.ReplaceAll(strings.TrimLeft(key, "-"), "_", "-"))
	best, bestDist := "", 0
	flags.VisitAll(func(f *pflag.Flag) {
		if f.Hidden || configOnlyFlags[f.Name] {
			return
		}
		d := editDistance(norm, f.Name)
		if best == "" || d < bestDist {
			best, bestDist = f.Name, d
		}
	})
	if best == "" || bestDist > 2 && bestDist > len(norm)/3 {
		return ""
	}
	return " (did you mean " + best + "?)"
}

// editDistance is the Levenshtein distance of a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// tomlKind names a decoded TOML value's type for an error.
func tomlKind(v any) string {
	switch v.(type) {
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case int64:
		return "an integer"
	case float64:
		return "a float"
	case []any:
		return "a list"
	case map[string]any:
		return "a table"
	}
	return "a date or time"
}

// tomlValue writes a decoded TOML value back for an error message.
func tomlValue(v any) string {
	switch x := v.(type) {
	case string:
		return tomlString(x)
	case []any:
		parts := make([]string, len(x))
		for i, e := range x {
			parts[i] = tomlValue(e)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	}
	return fmt.Sprint(v)
}

// tomlString quotes s as a TOML basic string.
func tomlString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range strings.ToValidUTF8(s, string(utf8.RuneError)) {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\u%04X`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// flagTOML is a flag's current value as TOML.
func flagTOML(f *pflag.Flag) string {
	if sv, ok := f.Value.(pflag.SliceValue); ok {
		list := sv.GetSlice()
		parts := make([]string, len(list))
		for i, s := range list {
			parts[i] = tomlString(s)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	}
	return scalarTOML(f, f.Value.String())
}

// flagDefaultTOML is a flag's default as TOML.
func flagDefaultTOML(f *pflag.Flag) string {
	if _, ok := f.Value.(pflag.SliceValue); ok {
		// DefValue is pflag's "[a,b]"; the defaults of serve's lists
		// hold no commas.
		d := strings.TrimSuffix(strings.TrimPrefix(f.DefValue, "["), "]")
		if d == "" {
			return "[]"
		}
		parts := strings.Split(d, ",")
		for i, s := range parts {
			parts[i] = tomlString(s)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	}
	return scalarTOML(f, f.DefValue)
}

// scalarTOML writes s, a value of flag f in pflag's form, as TOML.
func scalarTOML(f *pflag.Flag, s string) string {
	switch f.Value.Type() {
	case "bool", "int", "int8", "int16", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64", "float32", "float64":
		return s
	case "duration":
		if d, err := time.ParseDuration(s); err == nil {
			return tomlString(shortDuration(d))
		}
	}
	return tomlString(s)
}

// shortDuration writes d without Go's zero units: 720h, not 720h0m0s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// fileFlags are the flags the file may set, in the order serve defines
// them, hidden ones (test switches) only if all is set.
func fileFlags(flags *pflag.FlagSet, all bool) []*pflag.Flag {
	var out []*pflag.Flag
	sorted := flags.SortFlags
	flags.SortFlags = false
	flags.VisitAll(func(f *pflag.Flag) {
		if !configOnlyFlags[f.Name] && (all || !f.Hidden) {
			out = append(out, f)
		}
	})
	flags.SortFlags = sorted
	return out
}

// writeServeConfigExample writes the documented example configuration
// (packaging/config.toml): every visible flag of serve with its help as a
// comment and its default commented out.
func writeServeConfigExample(w io.Writer, flags *pflag.FlagSet) error {
	var b bytes.Buffer
	b.WriteString(`# nook serve's configuration: ` + DefaultServeConfig + `, or the file
# nook serve --config FILE names. A missing ` + DefaultServeConfig + ` is fine.
#
# Every flag of nook serve can be set here, with the flag's name as the
# key and no tables:
#
#   data-dir = "/srv/nook"
#   max-sandboxes = 1000
#   idle-pause = "30m"
#   debug = true
#   allow-host-mounts = ["/srv/shared", "/srv/data"]
#
# Switches take true or false, counts an integer, a flag repeatable on the
# command line a list, and every other flag (durations and sizes too) a
# string in quotes, which the flag parses as on the command line. A flag
# given on the command line wins over this file. An unknown key or a wrong
# type stops the daemon with the file's name and the line. The file must
# be a regular file (not a symbolic link) that belongs to root, and no
# other user may write it or a directory above it: it chooses what the
# daemon runs as root.
#
# nook serve --print-config prints the configuration in effect (this file
# and the command line) without starting the daemon.
#
# Below, each flag with its help; the value commented out is its default.
`)
	for _, f := range fileFlags(flags, false) {
		_, usage := pflag.UnquoteUsage(f)
		b.WriteString("\n")
		for _, l := range wrapWords(usage, 74) {
			b.WriteString("# " + l + "\n")
		}
		fmt.Fprintf(&b, "# %s = %s\n", f.Name, flagDefaultTOML(f))
	}
	_, err := w.Write(b.Bytes())
	return err
}

// wrapWords breaks s into lines of at most width bytes where it can.
func wrapWords(s string, width int) []string {
	var lines []string
	line := ""
	for _, w := range strings.Fields(s) {
		if line != "" && len(line)+1+len(w) > width {
			lines = append(lines, line)
			line = ""
		}
		if line != "" {
			line += " "
		}
		line += w
	}
	if line != "" {
		lines = append(lines, line)
	}
	return lines
}

// write prints the configuration in effect as TOML: every visible flag
// (and a hidden one that was set) with its value, a comment saying where
// a value not the default came from. The output is itself a valid file.
func (sc *serveConfig) write(w io.Writer, flags *pflag.FlagSet) error {
	var b bytes.Buffer
	if sc.loaded != "" {
		fmt.Fprintf(&b, "# nook serve's configuration in effect: %s and the command line\n", sc.loaded)
	} else {
		fmt.Fprintf(&b, "# nook serve's configuration in effect: the command line (no %s)\n", sc.path)
	}
	for _, f := range fileFlags(flags, true) {
		if f.Hidden && !f.Changed {
			continue
		}
		fmt.Fprintf(&b, "%s = %s", f.Name, flagTOML(f))
		switch {
		case sc.fromFile[f.Name]:
			b.WriteString("  # from the file")
		case f.Changed:
			b.WriteString("  # from the command line")
		}
		b.WriteString("\n")
	}
	_, err := w.Write(b.Bytes())
	return err
}
