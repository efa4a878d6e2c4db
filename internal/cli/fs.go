package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/agent/safetar"
	"github.com/nookhq/nook/sdk"
)

// remotePath is NAME:/path, a path in a sandbox.
type remotePath struct{ name, path string }

func (r remotePath) String() string { return r.name + ":" + r.path }

// splitRemote reports whether arg names a path in a sandbox: NAME:PATH,
// where NAME has no slash (so ./a:b and /tmp/a:b are local paths).
func splitRemote(arg string) (remotePath, bool) {
	i := strings.IndexByte(arg, ':')
	if i <= 0 || strings.ContainsRune(arg[:i], '/') {
		return remotePath{}, false
	}
	return remotePath{name: arg[:i], path: arg[i+1:]}, true
}

// parseRemote parses a NAME:/path argument; anything else is a usage error.
// withRemote makes the RunE of a command on one NAME:/path: the path is
// checked (a usage error) before the daemon is contacted.
func withRemote(run func(cmd *cobra.Command, cl *sdk.Client, rp remotePath) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		rp, err := parseRemote(args[0])
		if err != nil {
			return err
		}
		return withClient(func(cmd *cobra.Command, cl *sdk.Client, _ []string) error { return run(cmd, cl, rp) })(cmd, args)
	}
}

func parseRemote(arg string) (remotePath, error) {
	r, ok := splitRemote(arg)
	if !ok {
		return r, &usageError{fmt.Errorf("%q is not a path in a sandbox: write it as NAME:/path", arg)}
	}
	if !strings.HasPrefix(r.path, "/") {
		return r, &usageError{fmt.Errorf("%q: the path in a sandbox must be absolute, e.g. %s:/root/file", arg, r.name)}
	}
	return r, nil
}

func fsCmd() *cobra.Command {
	c := &cobra.Command{Use: "fs", Short: "Work with files in a sandbox: ls, cat, stat, mkdir, rm, mv, chmod, watch"}
	c.AddCommand(fsLsCmd(), fsCatCmd(), fsStatCmd(), fsMkdirCmd(), fsRmCmd(), fsMvCmd(), fsChmodCmd(), fsWatchCmd())
	return c
}

// symbolicMode renders a file's type and mode like ls -l.
func symbolicMode(info *api.FileInfo) string {
	m, _ := strconv.ParseUint(info.Mode, 8, 32)
	var b strings.Builder
	switch info.Type {
	case api.FileTypeDir:
		b.WriteByte('d')
	case api.FileTypeSymlink:
		b.WriteByte('l')
	case api.FileTypeFile:
		b.WriteByte('-')
	default:
		b.WriteByte('?')
	}
	const rwx = "rwxrwxrwx"
	for i := 0; i < 9; i++ {
		c := byte('-')
		if m&(1<<(8-i)) != 0 {
			c = rwx[i]
		}
		special := (i == 2 && m&0o4000 != 0) || (i == 5 && m&0o2000 != 0) || (i == 8 && m&0o1000 != 0)
		if special {
			switch {
			case i == 8 && c == '-':
				c = 'T'
			case i == 8:
				c = 't'
			case c == '-':
				c = 'S'
			default:
				c = 's'
			}
		}
		b.WriteByte(c)
	}
	return b.String()
}

// printInfo prints one line of a listing; name and link target come from
// the sandbox and are escaped (termsafe).
func printInfo(tw io.Writer, info *api.FileInfo, name string) {
	name = tsafe(name)
	if info.LinkTarget != "" {
		name += " -> " + tsafe(info.LinkTarget)
	}
	fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%s\n", symbolicMode(info), info.UID, info.GID, info.Size, info.ModTime.Local().Format("2006-01-02 15:04"), name)
}

func fsLsCmd() *cobra.Command {
	var recursive bool
	var out output
	var maxEntries int
	c := &cobra.Command{
		Use:   "ls [-r] [--max N] [-q | --json | --format TEMPLATE] NAME:/path",
		Short: "List a directory in a sandbox (-r: the whole tree)",
		Args:  cobra.ExactArgs(1),
		RunE: withRemote(func(cmd *cobra.Command, cl *sdk.Client, rp remotePath) error {
			l, err := cl.ListFiles(cmd.Context(), rp.name, rp.path, sdk.ListOptions{Recursive: recursive, MaxEntries: maxEntries})
			if err != nil {
				return err
			}
			return printListing(cmd, l, recursive, &out)
		}),
	}
	c.Flags().BoolVarP(&recursive, "recursive", "r", false, "list the whole tree")
	c.Flags().IntVar(&maxEntries, "max", 0, "list at most this many entries (default 10000)")
	addOutput[api.FileInfo](c, &out, "the listing", true)
	return c
}

// printListing prints a listing of a sandbox's or a volume's files.
func printListing(cmd *cobra.Command, l *api.FileList, recursive bool, out *output) error {
	if out.machine() || out.quiet {
		name := func(e api.FileInfo) string { return e.Name }
		if recursive {
			name = func(e api.FileInfo) string { return e.Path }
		}
		return printList(cmd.OutOrStdout(), out, l, l.Entries, name, nil)
	}
	tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 1, ' ', 0)
	for i := range l.Entries {
		e := &l.Entries[i]
		name := e.Name
		if recursive {
			name = e.Path
		}
		printInfo(tw, e, name)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if l.Truncated {
		fmt.Fprintf(cmd.ErrOrStderr(), "nook: the listing stops at %d entries; raise --max to see more\n", len(l.Entries))
	}
	return nil
}

func fsCatCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "cat NAME:/path",
		Short: "Print a file of a sandbox",
		Args:  cobra.ExactArgs(1),
		RunE: withRemote(func(cmd *cobra.Command, cl *sdk.Client, rp remotePath) error {
			rc, err := cl.ReadFile(cmd.Context(), rp.name, rp.path, nil)
			if err != nil {
				return err
			}
			defer rc.Close()
			_, err = io.Copy(cmd.OutOrStdout(), rc)
			return err
		}),
	}
}

func fsStatCmd() *cobra.Command {
	var out output
	c := &cobra.Command{
		Use:   "stat [--json | --format TEMPLATE] NAME:/path",
		Short: "Describe a path in a sandbox",
		Args:  cobra.ExactArgs(1),
		RunE: withRemote(func(cmd *cobra.Command, cl *sdk.Client, rp remotePath) error {
			info, err := cl.StatFile(cmd.Context(), rp.name, rp.path)
			if err != nil {
				return err
			}
			if out.machine() {
				return out.print(cmd.OutOrStdout(), info, nil)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 1, ' ', 0)
			printInfo(tw, info, info.Path)
			return tw.Flush()
		}),
	}
	addOutput[api.FileInfo](c, &out, "the file's information", false)
	return c
}

func parseModeArg(s string) (fs.FileMode, error) {
	m, err := strconv.ParseUint(s, 8, 32)
	if err != nil || m > 0o7777 {
		return 0, &usageError{fmt.Errorf("mode %q is not valid: give permission bits in octal, e.g. 0755", s)}
	}
	return api.FileModeOf(uint32(m)), nil
}

func fsMkdirCmd() *cobra.Command {
	var parents bool
	var modeStr string
	c := &cobra.Command{
		Use:   "mkdir [-p] [--mode 0755] NAME:/path",
		Short: "Create a directory in a sandbox (-p: with its parents; an existing one is fine)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			rp, err := parseRemote(args[0])
			if err != nil {
				return err
			}
			var mode fs.FileMode
			if modeStr != "" {
				if mode, err = parseModeArg(modeStr); err != nil {
					return err
				}
			}
			cl, err := client()
			if err != nil {
				return err
			}
			_, err = cl.Mkdir(cmd.Context(), rp.name, rp.path, parents, mode)
			return err
		},
	}
	c.Flags().BoolVarP(&parents, "parents", "p", false, "create missing parents; an existing directory is not an error")
	c.Flags().StringVar(&modeStr, "mode", "", "permission bits in octal (default 0755)")
	return c
}

func fsRmCmd() *cobra.Command {
	var recursive bool
	c := &cobra.Command{
		Use:   "rm [-r] NAME:/path...",
		Short: "Remove files from a sandbox (-r: directories and what they hold)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var rps []remotePath
			for _, a := range args {
				rp, err := parseRemote(a)
				if err != nil {
					return err
				}
				rps = append(rps, rp)
			}
			cl, err := client()
			if err != nil {
				return err
			}
			var errs []error
			for _, rp := range rps {
				if err := cl.RemoveFile(cmd.Context(), rp.name, rp.path, recursive); err != nil {
					errs = append(errs, err)
				}
			}
			return errors.Join(errs...)
		},
	}
	c.Flags().BoolVarP(&recursive, "recursive", "r", false, "remove directories and their contents")
	return c
}

func fsMvCmd() *cobra.Command {
	var force bool
	c := &cobra.Command{
		Use:   "mv [-f] NAME:/from NAME:/to",
		Short: "Move or rename a file or directory inside a sandbox",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			from, err := parseRemote(args[0])
			if err != nil {
				return err
			}
			to, err := parseRemote(args[1])
			if err != nil {
				return err
			}
			if from.name != to.name {
				return &usageError{fmt.Errorf("mv moves inside one sandbox: %s and %s name different sandboxes", from.name, to.name)}
			}
			cl, err := client()
			if err != nil {
				return err
			}
			_, err = cl.MoveFile(cmd.Context(), from.name, from.path, to.path, force)
			return err
		},
	}
	c.Flags().BoolVarP(&force, "force", "f", false, "replace an existing destination")
	return c
}

func fsChmodCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "chmod MODE NAME:/path",
		Short: "Set the permission bits (octal, e.g. 0755) of a path in a sandbox",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			mode, err := parseModeArg(args[0])
			if err != nil {
				return err
			}
			rp, err := parseRemote(args[1])
			if err != nil {
				return err
			}
			cl, err := client()
			if err != nil {
				return err
			}
			_, err = cl.Chmod(cmd.Context(), rp.name, rp.path, mode)
			return err
		},
	}
}

func fsWatchCmd() *cobra.Command {
	var recursive bool
	var format output
	c := &cobra.Command{
		Use:   "watch [-r] [--json | --format TEMPLATE] NAME:/path",
		Short: "Print create, write, remove, rename and chmod events under a path until interrupted",
		Args:  cobra.ExactArgs(1),
		RunE: withRemote(func(cmd *cobra.Command, cl *sdk.Client, rp remotePath) error {
			ctx := cmd.Context()
			w, err := cl.WatchFiles(ctx, rp.name, rp.path, recursive)
			if err != nil {
				return err
			}
			defer w.Close()
			fmt.Fprintf(cmd.ErrOrStderr(), "watching %s (Ctrl-C to stop)\n", rp)
			return printStream(ctx, cmd.OutOrStdout(), &format, w.Next, func(out io.Writer, ev *api.FileEvent) error {
				_, err := fmt.Fprintf(out, "%s %-8s %s\n", ev.Time.Local().Format("15:04:05.000"), tsafe(ev.Type), tsafe(ev.Path))
				return err
			}, nil)
		}),
	}
	c.Flags().BoolVarP(&recursive, "recursive", "r", false, "watch subdirectories too, including new ones")
	addOutput[api.FileEvent](c, &format, "one object per event (a line each)", false)
	return c
}

func printJSONLine(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

func cpCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy files between a sandbox and this machine (one side NAME:/path; directories too)",
		Long: `Copy files and directory trees between a sandbox and this machine, like docker cp:

  nook cp ./file box:/root/          into an existing directory, as /root/file
  nook cp ./dir box:/srv/app         as /srv/app (or /srv/app/dir if /srv/app is a directory)
  nook cp ./dir/. box:/srv/app       the contents of dir into /srv/app
  nook cp box:/var/log ./logs        and the same rules the other way
  nook cp box:/etc - | tar t         a tar stream on stdout ("-" as SRC reads one from stdin)

Modes and times are kept; files belong to the user that receives them,
and setuid/setgid bits are dropped on this machine. Symlinks are copied
as symlinks.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			src, srcRemote := splitRemote(args[0])
			dst, dstRemote := splitRemote(args[1])
			if srcRemote == dstRemote {
				return &usageError{errors.New("cp copies between a sandbox and this machine: one of SRC and DST is NAME:/path, the other a local path")}
			}
			cl, err := client()
			if err != nil {
				return err
			}
			if dstRemote {
				if _, err := parseRemote(args[1]); err != nil {
					return err
				}
				return copyIn(cmd, sandboxFiles{cl, dst.name}, args[0], dst)
			}
			if _, err := parseRemote(args[0]); err != nil {
				return err
			}
			return copyOut(cmd, sandboxFiles{cl, src.name}, src, args[1])
		},
	}
}

// fileTarget is what cp copies to and from: a sandbox's files
// (sandboxFiles) or a volume's (sdk.VolumeFiles).
type fileTarget interface {
	StatFile(ctx context.Context, path string) (*api.FileInfo, error)
	DownloadArchive(ctx context.Context, path string) (io.ReadCloser, error)
	UploadArchive(ctx context.Context, dir string, r io.Reader, parents bool) (*api.FileInfo, error)
}

// sandboxFiles are the files of sandbox name, as a fileTarget.
type sandboxFiles struct {
	cl   *sdk.Client
	name string
}

func (s sandboxFiles) StatFile(ctx context.Context, p string) (*api.FileInfo, error) {
	return s.cl.StatFile(ctx, s.name, p)
}

func (s sandboxFiles) DownloadArchive(ctx context.Context, p string) (io.ReadCloser, error) {
	return s.cl.DownloadArchive(ctx, s.name, p)
}

func (s sandboxFiles) UploadArchive(ctx context.Context, dir string, r io.Reader, parents bool) (*api.FileInfo, error) {
	return s.cl.UploadArchive(ctx, s.name, dir, r, parents)
}

// statFollow describes a path of t, following symlinks.
func statFollow(ctx context.Context, t fileTarget, p string) (*api.FileInfo, error) {
	for i := 0; ; i++ {
		info, err := t.StatFile(ctx, p)
		if err != nil || info.Type != api.FileTypeSymlink || i == 16 {
			return info, err
		}
		target := info.LinkTarget
		if !path.IsAbs(target) {
			target = path.Join(path.Dir(p), target)
		}
		p = target
	}
}

// copyIn copies a local file or tree (or a tar on stdin, "-") into t (dst names the place).
func copyIn(cmd *cobra.Command, t fileTarget, src string, dst remotePath) error {
	ctx := cmd.Context()
	if src == "-" {
		_, err := t.UploadArchive(ctx, dst.path, cmd.InOrStdin(), false)
		return err
	}
	lfi, err := os.Lstat(src)
	if err != nil {
		return err
	}
	contentsOnly := strings.HasSuffix(src, "/.")
	dstClean := path.Clean(dst.path)
	var dir, top string
	info, err := statFollow(ctx, t, dst.path)
	switch {
	case err == nil && info.Type == api.FileTypeDir:
		dir, top = dstClean, filepath.Base(src)
		if contentsOnly {
			top = "."
		}
	case err == nil:
		if lfi.IsDir() {
			return fmt.Errorf("cannot copy directory %s onto file %s", src, dst)
		}
		dir, top = path.Dir(dstClean), path.Base(dstClean)
	case sdk.IsNotFound(err):
		if strings.HasSuffix(dst.path, "/") && !lfi.IsDir() {
			return fmt.Errorf("destination directory %s does not exist", dst)
		}
		dir, top = path.Dir(dstClean), path.Base(dstClean)
		if pinfo, err := statFollow(ctx, t, dir); err != nil {
			if sdk.IsNotFound(err) {
				return fmt.Errorf("cannot copy to %s: directory %s:%s does not exist", dst, dst.name, dir)
			}
			return err
		} else if pinfo.Type != api.FileTypeDir {
			return fmt.Errorf("cannot copy to %s: %s:%s is not a directory", dst, dst.name, dir)
		}
	default:
		return err
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(safetar.Write(pw, src, top)) }()
	_, err = t.UploadArchive(ctx, dir, pr, false)
	pr.CloseWithError(errors.New("upload ended"))
	return err
}

// copyOut copies a file or tree of t (src names it) to a local path (or a tar to stdout, "-").
func copyOut(cmd *cobra.Command, t fileTarget, src remotePath, dst string) error {
	ctx := cmd.Context()
	info, err := t.StatFile(ctx, src.path)
	if err != nil {
		return err
	}
	if dst == "-" {
		rc, err := t.DownloadArchive(ctx, src.path)
		if err != nil {
			return err
		}
		defer rc.Close()
		_, err = io.Copy(cmd.OutOrStdout(), rc)
		return err
	}
	srcIsDir := info.Type == api.FileTypeDir
	contentsOnly := strings.HasSuffix(src.path, "/.") || path.Clean(src.path) == "/"
	dstClean := filepath.Clean(dst)
	var dir, top string
	lfi, err := os.Stat(dst)
	switch {
	case err == nil && lfi.IsDir():
		dir, top = dstClean, path.Base(path.Clean(src.path))
		if contentsOnly {
			top = "."
		}
	case err == nil:
		if srcIsDir {
			return fmt.Errorf("cannot copy directory %s onto file %s", src, dst)
		}
		dir, top = filepath.Dir(dstClean), filepath.Base(dstClean)
	case errors.Is(err, fs.ErrNotExist):
		if strings.HasSuffix(dst, "/") && !srcIsDir {
			return fmt.Errorf("destination directory %s does not exist", dst)
		}
		dir, top = filepath.Dir(dstClean), filepath.Base(dstClean)
		if pfi, err := os.Stat(dir); err != nil {
			return fmt.Errorf("cannot copy to %s: %w", dst, err)
		} else if !pfi.IsDir() {
			return fmt.Errorf("cannot copy to %s: %s is not a directory", dst, dir)
		}
	default:
		return err
	}
	rc, err := t.DownloadArchive(ctx, src.path)
	if err != nil {
		return err
	}
	defer rc.Close()
	if err := safetar.Extract(rc, dir, safetar.Options{Top: top, NoSetID: true}); err != nil {
		if errors.Is(err, safetar.ErrInvalid) {
			return fmt.Errorf("copy from %s: the sandbox sent an archive that was refused: %w", src, err)
		}
		return fmt.Errorf("copy from %s: %w", src, err)
	}
	return nil
}
