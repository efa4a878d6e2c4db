package template

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/layerstore"
)

// copy makes the layer of a COPY or ADD: what it names, from the build
// context (less what .dockerignore excludes) or from another stage or
// an image (--from), copied below dest with their modes (--chmod), owned
// by root or --chown. The context is read through an os.Root: no name
// or symlink in it leads outside. Its cache key covers every copied
// file's path, mode, owner and content.
func (b *dockerBuild) copy(ctx context.Context, st *stageState, sd instructions.SourcesAndDest, from, chown, chmod string, add bool, code string,
	label string, line int) error {
	fail := func(format string, args ...any) error {
		return errdefs.Invalid("Dockerfile line %d: %s: %s", line, code, fmt.Sprintf(format, args...))
	}
	src := b.ctxRoot
	ignore := true
	if from != "" {
		dir, err := b.fromRoot(ctx, from, line)
		if err != nil {
			return err
		}
		if src, err = os.OpenRoot(dir); err != nil {
			return err
		}
		defer src.Close()
		ignore = false
	}
	uid, gid, err := b.owner(st, chown)
	if err != nil {
		return fail("%v", err)
	}
	var mode fs.FileMode
	if chmod != "" {
		m, err := strconv.ParseUint(chmod, 8, 32)
		if err != nil || m > 0o7777 {
			return fail("--chmod=%s is not an octal mode", chmod)
		}
		mode = fs.FileMode(m)
	}
	dest := sd.DestPath
	if !path.IsAbs(dest) {
		dest = path.Join("/", st.cfg.WorkingDir, dest)
	}
	if dest, err = resolveIn(st.topFirst(), dest); err != nil {
		return fail("%v", err)
	}
	toDir := strings.HasSuffix(sd.DestPath, "/") || sd.DestPath == "." || len(sd.SourcePaths)+len(sd.SourceContents) > 1
	if _, s, found, err := layerstore.Lookup(st.topFirst(), dest); err != nil {
		return err
	} else if found && s.Mode&unix.S_IFMT == unix.S_IFDIR {
		toDir = true // into a directory the stage has, as Docker copies
	}

	// The sources, as paths below src.
	var srcs []string
	for _, p := range sd.SourcePaths {
		if add && (strings.Contains(p, "://") || strings.HasPrefix(p, "git@")) {
			return fail("ADD of a URL is not supported by nook: RUN curl in a step (under the build's network policy)")
		}
		rel := strings.TrimPrefix(path.Clean("/"+p), "/")
		if rel == "" {
			rel = "."
		}
		matches, err := globRoot(src, rel)
		if err != nil {
			return fail("%v", err)
		}
		if len(matches) == 0 {
			return fail("%s: no such file in the %s", p, sourceName(from))
		}
		if strings.ContainsAny(rel, "*?[") {
			toDir = true
		}
		for _, m := range matches {
			if ignore && ignored(b, m) {
				continue
			}
			fi, err := src.Stat(m) // a source named is followed (inside src), as Docker does
			if err != nil {
				return fail("%v", err)
			}
			if fi.IsDir() {
				toDir = true
			}
			if add && fi.Mode().IsRegular() && isArchive(m) {
				return fail("ADD of an archive (%s) is not supported by nook yet: COPY it and RUN tar in a step", m)
			}
			srcs = append(srcs, m)
		}
	}
	if len(srcs) == 0 && len(sd.SourceContents) == 0 {
		return fail("every source is excluded by .dockerignore")
	}

	layer, err := b.ls.NewLayer()
	if err != nil {
		return err
	}
	defer os.RemoveAll(filepath.Dir(layer))
	parent := dest
	if !toDir {
		parent = path.Dir(dest)
	}
	if err := b.mkdirs(st, layer, parent); err != nil {
		return fail("%v", err)
	}
	dst, err := os.OpenRoot(layer)
	if err != nil {
		return err
	}
	defer dst.Close()
	c := &copier2{src: src, dst: dst, uid: uid, gid: gid, mode: mode, h: sha256.New(), b: b, ignore: ignore}
	for _, s := range srcs {
		fi, err := src.Stat(s)
		if err != nil {
			return fail("%v", err)
		}
		target := dest
		if toDir && !fi.IsDir() {
			target = path.Join(dest, path.Base(s))
		}
		if err := c.tree(s, strings.TrimPrefix(target, "/"), fi); err != nil {
			return fail("%v", err)
		}
	}
	for _, sc := range sd.SourceContents {
		target := strings.TrimPrefix(path.Join(dest, path.Base(sc.Path)), "/")
		if !toDir {
			target = strings.TrimPrefix(dest, "/")
		}
		if err := c.file(target, strings.NewReader(sc.Data), 0o644, nil); err != nil {
			return fail("%v", err)
		}
	}
	key := stepKey(st.key, "COPY", dest, chown, chmod, hex.EncodeToString(c.h.Sum(nil)))
	what := fmt.Sprintf("%s (%d files)", code, c.files)
	if b.cached(st, key, what, label) {
		return nil
	}
	d, _, err := b.ls.Put(ctx, key, layer)
	if err != nil {
		return err
	}
	st.push(d, key)
	fmt.Fprintf(b.progress, "[stage %s] %s\n", label, what)
	return nil
}

// maxLinkHops bounds the symlinks one path goes through (the kernel's
// ELOOP limit).
const maxLinkHops = 40

// resolveIn is p (absolute) with the symlinks of the merged tree of
// layers (topmost first) followed, as the kernel would inside that tree
// chrooted: an absolute link starts again at the tree's root and ".."
// stops there, so no link leads out. Components that do not exist are
// kept as they are (a COPY or WORKDIR makes them).
func resolveIn(layers []string, p string) (string, error) {
	rest := strings.Split(p, "/")
	cur, hops := "/", 0
	for len(rest) > 0 {
		c := rest[0]
		rest = rest[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			cur = path.Dir(cur)
			continue
		}
		next := path.Join(cur, c)
		layer, st, found, err := layerstore.Lookup(layers, next)
		if err != nil {
			return "", err
		}
		if !found || st.Mode&unix.S_IFMT != unix.S_IFLNK {
			cur = next
			continue
		}
		if hops++; hops > maxLinkHops {
			return "", fmt.Errorf("%s: too many levels of symbolic links", p)
		}
		target, err := os.Readlink(filepath.Join(layer, next))
		if err != nil {
			return "", err
		}
		if path.IsAbs(target) {
			cur = "/"
		}
		rest = append(strings.Split(target, "/"), rest...)
	}
	return cur, nil
}

func sourceName(from string) string {
	if from == "" {
		return "build context"
	}
	return "stage or image " + from
}

func ignored(b *dockerBuild, rel string) bool { return b.ignore.Excluded(rel) }

func isArchive(name string) bool {
	for _, s := range []string{".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".tar.zst"} {
		if strings.HasSuffix(strings.ToLower(name), s) {
			return true
		}
	}
	return false
}

// fromRoot is a directory holding the merged view of a COPY --from
// source: an earlier stage (built first if need be) or an image.
func (b *dockerBuild) fromRoot(ctx context.Context, from string, line int) (string, error) {
	var st *stageState
	if j := b.stageIndex(from, len(b.stages)); j >= 0 {
		if b.building(j) {
			return "", errdefs.Invalid("Dockerfile line %d: COPY --from=%s: that stage is the one being built (a cycle)", line, from)
		}
		var err error
		if st, err = b.stage(ctx, j); err != nil {
			return "", err
		}
	} else {
		layers, _, err := b.pull(ctx, from, line)
		if err != nil {
			return "", err
		}
		st = &stageState{layers: layers}
	}
	tmp, err := os.MkdirTemp(b.s.layersDir(), ".tmp-from-") // a crash's is removed with the store's other leftovers
	if err != nil {
		return "", err
	}
	b.tmpDirs = append(b.tmpDirs, tmp)
	if err := b.merge(tmp, st); err != nil {
		return "", err
	}
	return tmp, nil
}

// building reports whether stage j is being built now (not yet done).
func (b *dockerBuild) building(j int) bool {
	_, done := b.done[j]
	return !done && b.active[j]
}

// globRoot expands a pattern whose last component may hold wildcards
// (*, ?, [...]) against the entries below root; a pattern without any is
// itself if it exists.
func globRoot(root *os.Root, rel string) ([]string, error) {
	dir, base := path.Split(rel)
	if strings.ContainsAny(dir, "*?[") {
		return nil, fmt.Errorf("%s: wildcards are supported in the last component only", rel)
	}
	if !strings.ContainsAny(base, "*?[") {
		if _, err := root.Lstat(rel); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil, nil
			}
			return nil, err
		}
		return []string{rel}, nil
	}
	if _, err := path.Match(base, ""); err != nil {
		return nil, fmt.Errorf("%s: %v", rel, err)
	}
	d := strings.TrimSuffix(dir, "/")
	if d == "" {
		d = "."
	}
	entries, err := fs.ReadDir(root.FS(), d)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if ok, _ := path.Match(base, e.Name()); ok {
			out = append(out, path.Join(d, e.Name()))
		}
	}
	return out, nil
}

// copier2 copies trees from one os.Root into a layer's, hashing what it
// copies for the step's cache key.
type copier2 struct {
	src, dst *os.Root
	uid, gid int
	mode     fs.FileMode // --chmod, or 0
	h        hash.Hash
	b        *dockerBuild
	ignore   bool
	files    int
}

// tree copies s (below src; its info fi) to target (below dst): a
// directory's contents into target, anything else as target.
func (c *copier2) tree(s, target string, fi fs.FileInfo) error {
	if !fi.IsDir() {
		return c.entry(s, target, fi)
	}
	if target != "" {
		if err := c.dir(target, fi.Mode()); err != nil {
			return err
		}
	}
	return fs.WalkDir(c.src.FS(), s, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == s {
			return nil
		}
		if c.ignore && ignored(c.b, p) {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		rel := strings.TrimPrefix(p, strings.TrimSuffix(s, "/")+"/")
		if s == "." {
			rel = p
		}
		info, err := c.src.Lstat(p)
		if err != nil {
			return err
		}
		t := path.Join(target, rel)
		if info.IsDir() {
			return c.dir(t, info.Mode())
		}
		return c.entry(p, t, info)
	})
}

func (c *copier2) perm(m fs.FileMode) fs.FileMode {
	if c.mode != 0 {
		return c.mode
	}
	return m & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
}

func (c *copier2) dir(target string, m fs.FileMode) error {
	fmt.Fprintf(c.h, "dir %q %o %d %d\n", target, c.perm(m), c.uid, c.gid)
	if fi, err := c.dst.Lstat(target); err == nil && fi.IsDir() {
		return nil
	}
	if err := c.dst.MkdirAll(target, 0o755); err != nil {
		return err
	}
	if err := c.dst.Lchown(target, c.uid, c.gid); err != nil {
		return err
	}
	return c.dst.Chmod(target, c.perm(m))
}

func (c *copier2) entry(s, target string, fi fs.FileInfo) error {
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		link, err := c.src.Readlink(s)
		if err != nil {
			return err
		}
		fmt.Fprintf(c.h, "link %q %q\n", target, link)
		c.dst.Remove(target)
		if err := c.dst.Symlink(link, target); err != nil {
			return err
		}
		c.files++
		return c.dst.Lchown(target, c.uid, c.gid)
	case fi.Mode().IsRegular():
		flags := os.O_RDONLY
		if fi.Mode()&fs.ModeSymlink == 0 {
			flags |= unix.O_NOFOLLOW
		}
		f, err := c.src.OpenFile(s, flags, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		return c.file(target, f, fi.Mode(), fi)
	}
	return fmt.Errorf("%s is neither a file, a directory nor a symlink: not copied", s)
}

func (c *copier2) file(target string, r io.Reader, m fs.FileMode, fi fs.FileInfo) error {
	c.dst.Remove(target)
	f, err := c.dst.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	ch := sha256.New()
	if _, err := io.Copy(io.MultiWriter(f, ch), r); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	fmt.Fprintf(c.h, "file %q %o %d %d %x\n", target, c.perm(m), c.uid, c.gid, ch.Sum(nil))
	c.files++
	if err := c.dst.Lchown(target, c.uid, c.gid); err != nil {
		return err
	}
	if err := c.dst.Chmod(target, c.perm(m)); err != nil {
		return err
	}
	if fi != nil {
		return c.dst.Chtimes(target, fi.ModTime(), fi.ModTime())
	}
	return nil
}

// owner resolves --chown (USER[:GROUP], names or numbers) against the
// stage's /etc/passwd and /etc/group; "" is root.
func (b *dockerBuild) owner(st *stageState, chown string) (int, int, error) {
	if chown == "" {
		return 0, 0, nil
	}
	u, g, hasGroup := strings.Cut(chown, ":")
	uid, err := strconv.Atoi(u)
	gid := -1
	if err != nil {
		entry, ok := b.lookupDB(st, "/etc/passwd", u)
		if !ok {
			return 0, 0, fmt.Errorf("--chown=%s: user %s is not in the stage's /etc/passwd", chown, u)
		}
		uid, _ = strconv.Atoi(entry[2])
		if len(entry) > 3 {
			gid, _ = strconv.Atoi(entry[3])
		}
	}
	if hasGroup {
		n, err := strconv.Atoi(g)
		if err != nil {
			entry, ok := b.lookupDB(st, "/etc/group", g)
			if !ok {
				return 0, 0, fmt.Errorf("--chown=%s: group %s is not in the stage's /etc/group", chown, g)
			}
			n, _ = strconv.Atoi(entry[2])
		}
		gid = n
	}
	if gid < 0 {
		gid = uid
	}
	if uid < 0 || gid < 0 || uid > 65535 || gid > 65535 {
		return 0, 0, fmt.Errorf("--chown=%s: ids must be 0-65535", chown)
	}
	return uid, gid, nil
}

// lookupDB finds name in a passwd-style file of the stage.
func (b *dockerBuild) lookupDB(st *stageState, file, name string) ([]string, bool) {
	layer, s, found, err := layerstore.Lookup(st.topFirst(), file)
	if err != nil || !found || s.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, false
	}
	root, err := os.OpenRoot(layer)
	if err != nil {
		return nil, false
	}
	defer root.Close()
	f, err := root.OpenFile(strings.TrimPrefix(file, "/"), os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, false
	}
	defer f.Close()
	sc := bufio.NewScanner(io.LimitReader(f, 16<<20))
	for sc.Scan() {
		fields := strings.Split(sc.Text(), ":")
		if len(fields) >= 3 && fields[0] == name {
			return fields, true
		}
	}
	return nil, false
}
