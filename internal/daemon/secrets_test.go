package daemon

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/store"
)

// A secret belongs to the token that set it: another token can neither
// replace, remove nor bind it, and a binding never follows the secret's
// name to a secret made again under it (by anyone).
func TestSecretOwnership(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st, err := store.Open(ctx, filepath.Join(dir, "nook.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ss, err := openSecrets(Config{DataDir: dir, Log: slog.New(slog.DiscardHandler)}, st)
	if err != nil {
		t.Fatal(err)
	}
	m := &Manager{secrets: ss, log: slog.New(slog.DiscardHandler)}
	a, b := WithCreator(ctx, "alice"), WithCreator(ctx, "bob")
	if err := m.SetSecret(a, "KEY", []byte("alice-value")); err != nil {
		t.Fatal(err)
	}
	for what, err := range map[string]error{
		"replace": m.SetSecret(b, "KEY", []byte("bob-value")),
		"remove":  m.DeleteSecret(b, "KEY"),
	} {
		if !errors.Is(err, errdefs.ErrPermissionDenied) {
			t.Errorf("bob could %s alice's secret: %v", what, err)
		}
	}
	if _, err := ss.bind(b, []string{"KEY@evil.test"}, map[string]string{}); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("bob could bind alice's secret: %v", err)
	}
	bound, err := ss.bind(a, []string{"KEY@api.test"}, map[string]string{})
	if err != nil {
		t.Fatal(err)
	}
	if v, err := ss.value(bound[0]); err != nil || string(v) != "alice-value" {
		t.Fatalf("value: %q %v", v, err)
	}
	// Alice's new value reaches her binding.
	if err := m.SetSecret(a, "KEY", []byte("alice-value-2")); err != nil {
		t.Fatal(err)
	}
	if v, err := ss.value(bound[0]); err != nil || string(v) != "alice-value-2" {
		t.Fatalf("value after alice's update: %q %v", v, err)
	}
	// Alice removes it; bob makes one of that name: the binding is gone.
	if err := m.DeleteSecret(a, "KEY"); err != nil {
		t.Fatal(err)
	}
	if err := m.SetSecret(b, "KEY", []byte("bob-value")); err != nil {
		t.Fatal(err)
	}
	if v, err := ss.value(bound[0]); err == nil {
		t.Fatalf("a binding of alice's secret got bob's new secret of the same name: %q", v)
	}
	// The host's socket may do anything.
	if err := m.SetSecret(ctx, "KEY", []byte("host-value")); err != nil {
		t.Fatal(err)
	}
	if err := m.DeleteSecret(ctx, "KEY"); err != nil {
		t.Fatal(err)
	}
}
