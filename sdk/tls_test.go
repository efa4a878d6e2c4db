package sdk

import (
	"strings"
	"testing"
)

func TestParseFingerprint(t *testing.T) {
	hex := strings.Repeat("0a", 32)
	for _, ok := range []string{"sha256:" + hex, "sha256:" + strings.ToUpper(hex), "sha256:" + strings.TrimSuffix(strings.Repeat("0A:", 32), ":"), " sha256:" + hex + "\n"} {
		b, err := ParseFingerprint(ok)
		if err != nil || len(b) != 32 || b[0] != 0x0a {
			t.Errorf("%q: %x %v", ok, b, err)
		}
	}
	for _, bad := range []string{"", hex, "sha1:" + hex, "sha256:" + hex[:62], "sha256:" + hex + "00", "sha256:zz" + hex[2:]} {
		if _, err := ParseFingerprint(bad); err == nil || !strings.Contains(err.Error(), "64 hex digits") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

// NOOK_TOKEN is for TCP: a stale one in the environment is not sent to
// the unix socket, where it would lock the host out.
func TestFromEnvUnixIgnoresToken(t *testing.T) {
	t.Setenv("NOOK_TOKEN", "nook_stale")
	t.Setenv("NOOK_HOST", "unix:///run/nook/nook.sock")
	c, err := FromEnv()
	if err != nil || c.token != "" {
		t.Fatalf("unix: token %q, %v", c.token, err)
	}
	t.Setenv("NOOK_HOST", "https://127.0.0.1:7070")
	t.Setenv("NOOK_TLS_FINGERPRINT", "sha256:"+strings.Repeat("ab", 32))
	c, err = FromEnv()
	if err != nil || c.token != "nook_stale" {
		t.Fatalf("https: token %q, %v", c.token, err)
	}
	t.Setenv("NOOK_TLS_FINGERPRINT", "sha256:nope")
	if _, err := FromEnv(); err == nil {
		t.Fatal("a malformed NOOK_TLS_FINGERPRINT was accepted")
	}
}
