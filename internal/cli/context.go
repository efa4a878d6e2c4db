package cli

import (
	"archive/tar"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/dockerignore"
)

// outsideDockerfile is where a Dockerfile from outside the context goes
// in the context tar.
const outsideDockerfile = ".nook-build.Dockerfile"

// contextTar streams dir as a build context tar (less what its
// .dockerignore excludes; never the Dockerfile or .dockerignore
// themselves): directories, regular files and symlinks, read through an
// os.Root so that nothing outside dir is sent. dockerfile is -f (""
// for dir/Dockerfile); it returns the Dockerfile's path in the tar.
func contextTar(dir, dockerfile string, secrets map[string]string) (io.ReadCloser, string, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, "", fmt.Errorf("build context: %w", err)
	}
	inTar := "Dockerfile"
	var outside []byte
	if dockerfile != "" {
		absDir, _ := filepath.Abs(dir)
		absDf, _ := filepath.Abs(dockerfile)
		if rel, err := filepath.Rel(absDir, absDf); err == nil && filepath.IsLocal(rel) {
			inTar = filepath.ToSlash(rel)
		} else {
			if outside, err = os.ReadFile(dockerfile); err != nil {
				root.Close()
				return nil, "", err
			}
			inTar = outsideDockerfile
		}
	}
	if outside == nil {
		if _, err := root.Stat(inTar); err != nil {
			root.Close()
			return nil, "", fmt.Errorf("no Dockerfile: %s is not in %s (give it with -f)", inTar, dir)
		}
	}
	secretData := map[string][]byte{}
	for id, src := range secrets {
		b, err := os.ReadFile(src)
		if err != nil {
			root.Close()
			return nil, "", fmt.Errorf("--secret id=%s: %w", id, err)
		}
		secretData[id] = b
	}
	var ig *dockerignore.Matcher
	if b, err := root.ReadFile(".dockerignore"); err == nil {
		if ig, err = dockerignore.Parse(b); err != nil {
			root.Close()
			return nil, "", fmt.Errorf(".dockerignore: %w", err)
		}
	}
	pr, pw := io.Pipe()
	go func() {
		defer root.Close()
		tw := tar.NewWriter(pw)
		err := fs.WalkDir(root.FS(), ".", func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if p == "." {
				return nil
			}
			if p == api.SecretsDir {
				return fs.SkipDir // only --secret's go there
			}
			if p != inTar && p != ".dockerignore" && ig.Excluded(p) {
				return nil // a directory is still walked: a negated pattern may take back what is below it
			}
			fi, err := root.Lstat(p)
			if err != nil {
				return err
			}
			link := ""
			switch {
			case fi.Mode()&fs.ModeSymlink != 0:
				if link, err = root.Readlink(p); err != nil {
					return err
				}
			case fi.IsDir(), fi.Mode().IsRegular():
			default:
				return nil // sockets, fifos, devices: not context
			}
			h, err := tar.FileInfoHeader(fi, link)
			if err != nil {
				return err
			}
			h.Name, h.Uid, h.Gid, h.Uname, h.Gname = p, 0, 0, "", ""
			if fi.IsDir() {
				h.Name += "/"
			}
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			if fi.Mode().IsRegular() {
				f, err := root.Open(p)
				if err != nil {
					return err
				}
				_, err = io.Copy(tw, f)
				f.Close()
				return err
			}
			return nil
		})
		if err == nil && len(secretData) > 0 {
			err = tw.WriteHeader(&tar.Header{Name: api.SecretsDir + "/", Mode: 0o700, Typeflag: tar.TypeDir})
			for id, b := range secretData {
				if err == nil {
					err = tw.WriteHeader(&tar.Header{Name: api.SecretsDir + "/" + id, Mode: 0o400, Size: int64(len(b)), Typeflag: tar.TypeReg})
				}
				if err == nil {
					_, err = tw.Write(b)
				}
			}
		}
		if err == nil && outside != nil {
			if err = tw.WriteHeader(&tar.Header{Name: outsideDockerfile, Mode: 0o644, Size: int64(len(outside)), Typeflag: tar.TypeReg}); err == nil {
				_, err = tw.Write(outside)
			}
		}
		if err == nil {
			err = tw.Close()
		}
		pw.CloseWithError(err)
	}()
	return pr, inTar, nil
}
