package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestTrustCA(t *testing.T) {
	dir := t.TempDir()
	sys := filepath.Join(dir, "certs", "ca-certificates.crt")
	os.MkdirAll(filepath.Dir(sys), 0o755)
	os.WriteFile(sys, []byte("SYSTEM ROOTS"), 0o644)
	link := filepath.Join(dir, "cert.pem")
	os.Symlink(sys, link)
	ca1 := "-----BEGIN CERTIFICATE-----\nONE\n-----END CERTIFICATE-----\n"
	ca2 := "-----BEGIN CERTIFICATE-----\nTWO\n-----END CERTIFICATE-----\n"
	caFile, bundle := filepath.Join(dir, "nook", "ca.crt"), filepath.Join(dir, "nook", "bundle.crt")
	for _, ca := range []string{ca1, ca1, ca2} {
		if err := trustCA(ca, caFile, bundle, []string{filepath.Join(dir, "missing"), link}); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{sys, bundle} {
		b, _ := os.ReadFile(p)
		s := string(b)
		if !strings.HasPrefix(s, "SYSTEM ROOTS\n") || strings.Count(s, "BEGIN CERTIFICATE") != 1 || !strings.HasSuffix(s, ca2) {
			t.Errorf("%s: %q", p, s)
		}
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Error("the symlink to the system bundle was replaced")
	}
	if b, _ := os.ReadFile(caFile); string(b) != ca2 {
		t.Errorf("ca file: %q", b)
	}
}
