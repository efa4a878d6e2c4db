package daemon

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/store"
)

func newKeyLine(t *testing.T) (string, string) {
	t.Helper()
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	k, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(k))) + " me@laptop", ssh.FingerprintSHA256(k)
}

// Which keys log in where: a sandbox's own keys there only; a token's
// keys wherever the token may run commands, while it is valid; the
// host's everywhere.
func TestEscapeSSHKeyScope(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "nook.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	m := &Manager{store: st, log: slog.New(slog.DiscardHandler)}
	a, b := &core.Sandbox{ID: "ida", Name: "a"}, &core.Sandbox{ID: "idb", Name: "b"}
	now := time.Now()
	for _, tok := range []store.Token{
		{ID: "tadmin", Name: "admin", Hash: []byte("1"), Scope: "admin", CreatedAt: now},
		{ID: "tsandbox", Name: "sb", Hash: []byte("2"), Scope: "sandbox:a", SandboxID: "ida", CreatedAt: now},
		{ID: "told", Name: "old", Hash: []byte("3"), Scope: "sandbox:b", SandboxID: "idb-earlier", CreatedAt: now},
		{ID: "treader", Name: "reader", Hash: []byte("4"), Scope: "read-only", CreatedAt: now},
		{ID: "texpired", Name: "expired", Hash: []byte("5"), Scope: "admin", CreatedAt: now, ExpiresAt: now.Add(-time.Second)},
	} {
		if err := st.InsertToken(ctx, tok); err != nil {
			t.Fatal(err)
		}
	}
	add := func(tokenID, sandboxID string) string {
		t.Helper()
		line, fp := newKeyLine(t)
		pub, comment, err := ParseSSHKey(line)
		if err != nil {
			t.Fatal(err)
		}
		c := ctx
		if tokenID != "" {
			c = WithTokenID(ctx, tokenID)
		}
		if _, err := m.addSSHKey(c, sandboxID, "", pub, comment); err != nil {
			t.Fatal(err)
		}
		return fp
	}
	keys := map[string]string{
		"a's own":         add("tadmin", "ida"),
		"host":            add("", ""),
		"admin token":     add("tadmin", ""),
		"a's token":       add("tsandbox", ""),
		"earlier b token": add("told", ""),
		"read-only":       add("treader", ""),
		"expired token":   add("texpired", ""),
	}
	want := map[string][2]bool{ // logs in to a, to b
		"a's own":         {true, false},
		"host":            {true, true},
		"admin token":     {true, true},
		"a's token":       {true, false},
		"earlier b token": {false, false},
		"read-only":       {false, false},
		"expired token":   {false, false},
	}
	for what, fp := range keys {
		for i, sb := range []*core.Sandbox{a, b} {
			ok, err := m.SSHKeyAllows(ctx, sb, fp)
			if err != nil {
				t.Fatal(err)
			}
			if ok != want[what][i] {
				t.Errorf("the %s key logs in to %s: %v, want %v", what, sb.Name, ok, want[what][i])
			}
		}
	}
	// Revoking a token takes its keys.
	if err := st.DeleteToken(ctx, "tadmin"); err != nil {
		t.Fatal(err)
	}
	if ok, _ := m.SSHKeyAllows(ctx, b, keys["admin token"]); ok {
		t.Error("a revoked token's key still logs in")
	}
	if ok, _ := m.SSHKeyAllows(ctx, a, keys["a's own"]); ok {
		t.Error("a key a revoked token added for a sandbox still logs in")
	}
	for _, what := range []string{"admin token", "a's own"} {
		if ks, _ := st.SSHKeysByFingerprint(ctx, keys[what]); len(ks) != 0 {
			t.Errorf("a revoked token's %s key is still stored: %+v", what, ks)
		}
	}
	// A token lists and removes only its own token-wide keys.
	own, err := m.SSHKeys(WithTokenID(ctx, "tsandbox"), "")
	if err != nil || len(own) != 1 || own[0].Owner != "tsandbox" {
		t.Fatalf("a token's own keys: %+v %v", own, err)
	}
	all, _ := m.SSHKeys(ctx, "")
	if len(all) < 4 {
		t.Fatalf("the host sees every token's keys: %d", len(all))
	}
	var hostKey string
	for _, k := range all {
		if k.Owner == "host" {
			hostKey = k.ID
		}
	}
	if err := m.RemoveSSHKey(WithTokenID(ctx, "tsandbox"), "", hostKey); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a token removed the host's key: %v", err)
	}
	if err := m.RemoveSSHKey(ctx, "", hostKey); err != nil {
		t.Errorf("the host could not remove its key: %v", err)
	}
}

func TestParseSSHKey(t *testing.T) {
	line, _ := newKeyLine(t)
	if _, c, err := ParseSSHKey(line + "\n"); err != nil || c != "me@laptop" {
		t.Fatalf("%q: %v", c, err)
	}
	small, _ := rsa.GenerateKey(rand.Reader, 1024)
	sk, _ := ssh.NewPublicKey(&small.PublicKey)
	for what, in := range map[string]string{
		"empty":       "",
		"options":     `command="sh" ` + line,
		"two keys":    line + "\n" + line,
		"private key": "-----BEGIN OPENSSH PRIVATE KEY-----\nabc\n",
		"garbage":     "ssh-ed25519 !!!",
		"weak rsa":    string(ssh.MarshalAuthorizedKey(sk)),
		"huge":        "ssh-ed25519 " + strings.Repeat("A", 10000),
	} {
		if _, _, err := ParseSSHKey(in); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: %v", what, err)
		}
	}
}

// FuzzParseSSHKey: a key line from an API client parses to a key that
// marshals back, or is refused; never a panic.
func FuzzParseSSHKey(f *testing.F) {
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	k, _ := ssh.NewPublicKey(pub)
	f.Add(string(ssh.MarshalAuthorizedKey(k)))
	f.Add("ssh-rsa AAAA comment")
	f.Add(`from="1.2.3.4" ssh-ed25519 AAAA`)
	f.Fuzz(func(t *testing.T, line string) {
		pub, _, err := ParseSSHKey(line)
		if err != nil {
			return
		}
		if _, err := ssh.ParsePublicKey(pub.Marshal()); err != nil {
			t.Fatalf("%q parsed to a key that does not parse back: %v", line, err)
		}
		if _, ok := pub.(*ssh.Certificate); ok {
			t.Fatalf("%q: a certificate was taken as a key", line)
		}
	})
}
