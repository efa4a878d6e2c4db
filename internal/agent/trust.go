package agent

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
)

// systemBundles are where distributions keep the system's trusted
// roots, as one file (Debian and Alpine, Fedora, others).
var systemBundles = []string{"/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem"}

// trustMarker starts the CA nook appends to a bundle; what follows it is
// replaced when it is written again.
const trustMarker = "# nook: the sandbox's secrets CA (the host terminates TLS to the hosts its secrets are bound to)\n"

// trustCA makes the sandbox trust ca (PEM): it writes it to caFile,
// writes bundleFile with the system's roots and it (the file the
// variables tools read name), and appends it to the first system bundle
// that exists, so that tools that read only that one trust it too. It
// is idempotent.
func trustCA(ca, caFile, bundleFile string, system []string) error {
	if err := os.MkdirAll(filepath.Dir(caFile), 0o755); err != nil {
		return err
	}
	if err := writeFileAtomic(caFile, []byte(ca)); err != nil {
		return err
	}
	var roots []byte
	for _, p := range system {
		b, err := os.ReadFile(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		if i := bytes.Index(b, []byte(trustMarker)); i >= 0 {
			b = b[:i]
		}
		roots = b
		if len(b) > 0 && b[len(b)-1] != '\n' {
			b = append(b, '\n')
		}
		if err := writeFileAtomic(p, append(append(b, trustMarker...), ca...)); err != nil {
			return err
		}
		break
	}
	if len(roots) > 0 && roots[len(roots)-1] != '\n' {
		roots = append(roots, '\n')
	}
	return writeFileAtomic(bundleFile, append(append(roots, trustMarker...), ca...))
}

// writeFileAtomic writes path (through a symlink, its target) by
// renaming a new file over it, readable by all.
func writeFileAtomic(path string, b []byte) error {
	if real, err := filepath.EvalSymlinks(path); err == nil {
		path = real
	}
	tmp := path + ".nook-tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o644); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}
