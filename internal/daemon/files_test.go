package daemon

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/errdefs"
)

func TestParseMode(t *testing.T) {
	for in, want := range map[string]uint32{"644": 0o644, "0755": 0o755, "4755": 0o4755, "0o700": 0o700, "0": 0} {
		if got, err := ParseMode(in); err != nil || got != want {
			t.Errorf("ParseMode(%q) = %o, %v", in, got, err)
		}
	}
	for _, in := range []string{"", "9", "rwx", "17777", "-1", "0x1ff"} {
		if _, err := ParseMode(in); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("ParseMode(%q): %v", in, err)
		}
	}
}

type failAfter struct{ n int }

func (f *failAfter) Read(p []byte) (int, error) {
	if f.n <= 0 {
		return 0, errors.New("client went away")
	}
	k := min(len(p), f.n)
	f.n -= k
	return k, nil
}

// The agent's refusals keep their categories (and so their HTTP codes);
// a client that goes away mid-upload is not taken for a dead agent.
func TestFileErrorCategories(t *testing.T) {
	m, _ := newManager(t)
	ctx := context.Background()
	sb, err := m.Create(ctx, api.CreateSandboxRequest{Name: "files"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Destroy(ctx, "files") })
	if _, err := m.WriteFile(ctx, "files", "/root/f", WriteOptions{}, strings.NewReader("data")); err != nil {
		t.Fatal(err)
	}
	m.mu.Lock()
	client := m.agents[sb.ID]
	m.mu.Unlock()

	_, err = m.WriteFile(ctx, "files", "/root/f", WriteOptions{}, &failAfter{n: 3 << 20})
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "cut short") {
		t.Fatalf("cut upload: %v", err)
	}
	_, rc, err := m.ReadFile(ctx, "files", "/root/f", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "data" {
		t.Fatalf("after a cut upload the file holds %q", b)
	}
	m.mu.Lock()
	same := m.agents[sb.ID] == client
	m.mu.Unlock()
	if !same {
		t.Fatal("a client's cut upload dropped the sandbox's agent session")
	}

	for _, tc := range []struct {
		what string
		err  error
		cat  error
	}{
		{"stat missing", func() error { _, err := m.StatFile(ctx, "files", "/nope"); return err }(), errdefs.ErrNotFound},
		{"relative path", func() error { _, err := m.StatFile(ctx, "files", "nope"); return err }(), errdefs.ErrInvalidArgument},
		{"read a directory", func() error { _, _, err := m.ReadFile(ctx, "files", "/etc", 0, 0); return err }(), errdefs.ErrInvalidArgument},
		{"write under /proc/sys", func() error {
			_, err := m.WriteFile(ctx, "files", "/proc/sys/kernel/x", WriteOptions{}, strings.NewReader("x"))
			return err
		}(), errdefs.ErrPermissionDenied},
		{"mkdir existing", func() error { _, err := m.Mkdir(ctx, "files", "", api.MkdirRequest{Path: "/etc"}); return err }(), errdefs.ErrAlreadyExists},
		{"bad mode", func() error {
			_, err := m.ChmodFile(ctx, "files", api.ChmodRequest{Path: "/etc", Mode: "888"})
			return err
		}(), errdefs.ErrInvalidArgument},
		{"unknown sandbox", func() error { _, err := m.StatFile(ctx, "ghost", "/"); return err }(), errdefs.ErrNotFound},
		{"list cap", func() error { _, err := m.ListFiles(ctx, "files", "/", false, 1<<30); return err }(), errdefs.ErrInvalidArgument},
	} {
		if !errors.Is(tc.err, tc.cat) {
			t.Errorf("%s: %v; want %v", tc.what, tc.err, tc.cat)
		}
	}
}
