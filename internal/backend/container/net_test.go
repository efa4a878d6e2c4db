package container

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/nookhq/nook/internal/core"
)

// fakeNet records the backend's network hook calls and checks that the
// namespace it is given is the container's own, not the host's.
type fakeNet struct {
	t        *testing.T
	mu       sync.Mutex
	attached map[string]string // id -> netns inode
	detached []string
}

func (f *fakeNet) AttachNetns(ctx context.Context, id, path string) error {
	ino, err := nsInode(path)
	if err != nil {
		return err
	}
	if host, _ := nsInode("/proc/self/ns/net"); ino == host {
		return fmt.Errorf("%s is the host's network namespace", path)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.attached[id] = ino
	return nil
}

// nsInode names the namespace at path (a /proc link, or a file holding one).
func nsInode(path string) (string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	return fmt.Sprint(fi.Sys().(*syscall.Stat_t).Ino), nil
}

func (f *fakeNet) AttachTap(ctx context.Context, id string) (string, error) {
	return "", fmt.Errorf("a container has no tap")
}

func (f *fakeNet) Detach(ctx context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.detached = append(f.detached, id)
	return nil
}

// Cold and warm containers are attached in their own namespace (the one
// their agent runs in), and destroy detaches them.
func TestNetHooks(t *testing.T) {
	for _, warm := range []int{0, 1} {
		t.Run(fmt.Sprintf("warm=%d", warm), func(t *testing.T) {
			b, h := newTestBackendPool(t, warm)
			fn := &fakeNet{t: t, attached: map[string]string{}}
			b.cfg.Net = fn
			sb := &core.Sandbox{ID: "nethooks" + fmt.Sprint(warm), Name: "nethooks", TemplateID: h.TemplateID, CPUs: 1, MemoryBytes: 256 << 20, PidsLimit: 100}
			if warm > 0 {
				b.Prewarm(sb)
				waitWarm(t, b, h.TemplateID, 1)
				id, ok := b.TakeWarm(sb)
				if !ok {
					t.Fatal("no warm container")
				}
				sb.ID = id
			}
			ctx := context.Background()
			if err := b.Create(ctx, sb); err != nil {
				t.Fatal(err)
			}
			fn.mu.Lock()
			ino, ok := fn.attached[sb.ID]
			fn.mu.Unlock()
			if !ok {
				t.Fatalf("sandbox %s was not attached (attached: %v)", sb.ID, fn.attached)
			}
			var st state
			if err := json.Unmarshal(sb.BackendState, &st); err != nil {
				t.Fatal(err)
			}
			if got, _ := nsInode(fmt.Sprintf("/proc/%d/ns/net", st.PID)); got != ino {
				t.Fatalf("attached namespace %s, the agent runs in %s", ino, got)
			}
			if err := b.Destroy(ctx, sb.ID); err != nil {
				t.Fatal(err)
			}
			fn.mu.Lock()
			defer fn.mu.Unlock()
			if !strings.Contains(strings.Join(fn.detached, ","), sb.ID) {
				t.Fatalf("destroy did not detach %s: %v", sb.ID, fn.detached)
			}
		})
	}
}
