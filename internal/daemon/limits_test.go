package daemon

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/errdefs"
)

// The ledger alone: reservations count until committed or released, and
// parallel ones never go over.
func TestLedger(t *testing.T) {
	l := newLedger(5, 10<<30)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var got []*reservation
	refused := 0
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := l.reserve(1, 1<<30, "creating")
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				got = append(got, r)
			case errors.Is(err, errdefs.ErrLimit):
				refused++
			default:
				t.Errorf("reserve: %v", err)
			}
		}()
	}
	wg.Wait()
	if len(got) != 5 || refused != 45 {
		t.Fatalf("%d reserved, %d refused; want 5 and 45", len(got), refused)
	}
	_, err := l.reserve(1, 1<<30, "creating")
	if want := "host limit reached: 5 sandboxes exist, 5 of them being created (nook serve --max-sandboxes 5)"; err == nil || err.Error() != want {
		t.Fatalf("6th: %v, want %q", err, want)
	}
	for i, r := range got {
		if i < 3 {
			l.commit(r, fmt.Sprint(i), 1<<30)
			r.release() // after a commit: nothing
		} else {
			r.release()
			r.release() // twice: nothing more
		}
	}
	if n, mem := l.use(); n != 3 || mem != 3<<30 || l.pendingN != 0 || l.pendingMem != 0 {
		t.Fatalf("use %d %d, pending %d %d", n, mem, l.pendingN, l.pendingMem)
	}
	// Memory: 3G committed of 10G.
	_, err = l.reserve(0, 8<<30, "starting")
	if want := "host limit reached: starting this 8G sandbox would commit 11G of memory, over --max-memory 10G (3G committed)"; err == nil || err.Error() != want {
		t.Fatalf("memory: %v, want %q", err, want)
	}
	r, err := l.reserve(0, 7<<30, "starting")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.reserve(0, 1, "resuming"); !errors.Is(err, errdefs.ErrLimit) {
		t.Fatalf("reserved memory not counted: %v", err)
	}
	l.commit(r, "0", 8<<30) // sandbox 0 now holds 8G instead of 1G
	if _, mem := l.use(); mem != 10<<30 {
		t.Fatalf("committed %d", mem)
	}
	l.commit(nil, "0", 0) // paused to disk
	l.remove("1")
	if n, mem := l.use(); n != 2 || mem != 1<<30 {
		t.Fatalf("use %d %d", n, mem)
	}
	// No limits: nothing refused, use still counted.
	free := newLedger(0, 0)
	for i := 0; i < 100; i++ {
		r, err := free.reserve(1, 1<<40, "creating")
		if err != nil {
			t.Fatal(err)
		}
		free.commit(r, fmt.Sprint(i), 1<<40)
	}
	if n, mem := free.use(); n != 100 || mem != 100<<40 {
		t.Fatalf("unlimited use %d %d", n, mem)
	}
}

func limitError(t *testing.T, err error, want string) {
	t.Helper()
	if !errors.Is(err, errdefs.ErrLimit) || !strings.Contains(err.Error(), want) {
		t.Fatalf("got %v, want a limit error with %q", err, want)
	}
}

// --max-sandboxes: the N+1th create is refused while N exist (in any
// state), a destroy frees a slot, parallel creates never go over, and a
// restarted daemon counts what exists.
func TestMaxSandboxes(t *testing.T) {
	m, _ := newManagerWith(t, func(c *Config) { c.MaxSandboxes = 2 })
	ctx := context.Background()
	// The daemon restarts below: whichever runs last is closed after the
	// sandboxes' destroys.
	t.Cleanup(func() { m.Close() })
	for _, n := range []string{"cap-a", "cap-b"} {
		if _, err := m.Create(ctx, api.CreateSandboxRequest{Name: n, Memory: "256M"}, nil); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Destroy(ctx, n) })
	}
	// Stopped, it still exists: it counts.
	if _, err := m.Stop(ctx, "cap-b"); err != nil {
		t.Fatal(err)
	}
	_, err := m.Create(ctx, api.CreateSandboxRequest{Name: "cap-c", Memory: "256M"}, nil)
	limitError(t, err, "host limit reached: 2 sandboxes exist (nook serve --max-sandboxes 2)")
	if _, err := m.Get(ctx, "cap-c"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("a refused create left a record: %v", err)
	}
	if info := m.Info(ctx); info.Sandboxes != 2 || info.MaxSandboxes != 2 || info.CommittedMemoryBytes != 256<<20 {
		t.Fatalf("info: %d of %d, %d committed", info.Sandboxes, info.MaxSandboxes, info.CommittedMemoryBytes)
	}
	// A restarted daemon counts them again.
	m.Close()
	m2, err := New(ctx, m.cfg)
	if err != nil {
		t.Fatal(err)
	}
	m = m2
	_, err = m.Create(ctx, api.CreateSandboxRequest{Name: "cap-c", Memory: "256M"}, nil)
	limitError(t, err, "2 sandboxes exist")
	if info := m.Info(ctx); info.Sandboxes != 2 || info.CommittedMemoryBytes != 256<<20 {
		t.Fatalf("info after a restart: %d, %d committed", info.Sandboxes, info.CommittedMemoryBytes)
	}
	// A destroy frees a slot.
	if err := m.Destroy(ctx, "cap-b"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Create(ctx, api.CreateSandboxRequest{Name: "cap-c", Memory: "256M"}, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Destroy(ctx, "cap-c") })
}

// Parallel creates with room for 5 of 10: exactly 5 are made, the others
// refused with the limit error, and nothing is left of them.
func TestMaxSandboxesParallel(t *testing.T) {
	m, _ := newManagerWith(t, func(c *Config) { c.MaxSandboxes = 5 })
	ctx := context.Background()
	errs := make(chan error, 10)
	for i := 0; i < 10; i++ {
		name := fmt.Sprintf("par-%d", i)
		t.Cleanup(func() { m.Destroy(ctx, name) })
		go func() {
			_, err := m.Create(ctx, api.CreateSandboxRequest{Name: name, Memory: "128M"}, nil)
			errs <- err
		}()
	}
	made := 0
	for i := 0; i < 10; i++ {
		err := <-errs
		switch {
		case err == nil:
			made++
		case !errors.Is(err, errdefs.ErrLimit):
			t.Errorf("create: %v", err)
		}
	}
	sbs, err := m.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if made != 5 || len(sbs) != 5 {
		t.Fatalf("%d made, %d records; want 5", made, len(sbs))
	}
	if info := m.Info(ctx); info.Sandboxes != 5 || info.CommittedMemoryBytes != 5*128<<20 {
		t.Fatalf("info: %d, %d committed", info.Sandboxes, info.CommittedMemoryBytes)
	}
}

// --max-memory counts running sandboxes and those paused in RAM (frozen),
// not stopped ones; a start that would go over is refused and leaves the
// sandbox stopped.
func TestMaxMemory(t *testing.T) {
	m, _ := newManagerWith(t, func(c *Config) { c.MaxMemory = 1 << 30; c.ContainerPause = "freeze" })
	ctx := context.Background()
	// The daemon restarts below: whichever runs last is closed after the
	// sandboxes' destroys.
	t.Cleanup(func() { m.Close() })
	for _, n := range []string{"mem-a", "mem-b"} {
		if _, err := m.Create(ctx, api.CreateSandboxRequest{Name: n, Memory: "512M"}, nil); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Destroy(ctx, n) })
	}
	_, err := m.Create(ctx, api.CreateSandboxRequest{Name: "mem-c", Memory: "512M"}, nil)
	limitError(t, err, "host limit reached: creating this 512M sandbox would commit 1.5G of memory, over --max-memory 1G (1G committed)")
	// Frozen, it keeps its memory.
	if _, err := m.Pause(ctx, "mem-b"); err != nil {
		t.Fatal(err)
	}
	_, err = m.Create(ctx, api.CreateSandboxRequest{Name: "mem-c", Memory: "512M"}, nil)
	limitError(t, err, "(1G committed)")
	// Stopped, it holds none.
	if _, err := m.Stop(ctx, "mem-b"); err != nil {
		t.Fatal(err)
	}
	if info := m.Info(ctx); info.CommittedMemoryBytes != 512<<20 || info.MaxMemoryBytes != 1<<30 {
		t.Fatalf("info: %d committed of %d", info.CommittedMemoryBytes, info.MaxMemoryBytes)
	}
	if _, err := m.Create(ctx, api.CreateSandboxRequest{Name: "mem-c", Memory: "512M"}, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Destroy(ctx, "mem-c") })
	// Full again: its start is refused, and it stays stopped.
	_, err = m.Start(ctx, "mem-b")
	limitError(t, err, "host limit reached: starting this 512M sandbox would commit 1.5G of memory, over --max-memory 1G (1G committed)")
	if sb, err := m.Get(ctx, "mem-b"); err != nil || sb.State != core.StateStopped {
		t.Fatalf("after a refused start: %+v %v", sb, err)
	}
	// Restarted, the daemon counts the same.
	m.Close()
	m2, err := New(ctx, m.cfg)
	if err != nil {
		t.Fatal(err)
	}
	m = m2
	if info := m.Info(ctx); info.CommittedMemoryBytes != 1<<30 || info.Sandboxes != 3 {
		t.Fatalf("info after a restart: %d committed, %d sandboxes", info.CommittedMemoryBytes, info.Sandboxes)
	}
	_, err = m.Start(ctx, "mem-b")
	limitError(t, err, "(1G committed)")
	// Room made, it starts.
	if err := m.Destroy(ctx, "mem-c"); err != nil {
		t.Fatal(err)
	}
	if sb, err := m.Start(ctx, "mem-b"); err != nil || sb.State != core.StateRunning {
		t.Fatalf("start: %+v %v", sb, err)
	}
	if info := m.Info(ctx); info.CommittedMemoryBytes != 1<<30 {
		t.Fatalf("after the start: %d committed", info.CommittedMemoryBytes)
	}
}

// A container paused to disk (a CRIU checkpoint) holds no memory; its
// resume takes it again, and is refused over --max-memory, the sandbox
// staying paused.
func TestMaxMemoryPausedToDisk(t *testing.T) {
	m, _ := newManagerWith(t, func(c *Config) { c.MaxMemory = 1 << 30; c.ContainerPause = "checkpoint" })
	ctx := context.Background()
	for _, n := range []string{"disk-a", "disk-b"} {
		if _, err := m.Create(ctx, api.CreateSandboxRequest{Name: n, Memory: "512M"}, nil); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Destroy(ctx, n) })
	}
	if _, err := m.Pause(ctx, "disk-b"); err != nil {
		t.Fatal(err)
	}
	if info := m.Info(ctx); info.CommittedMemoryBytes != 512<<20 {
		t.Fatalf("paused to disk: %d committed", info.CommittedMemoryBytes)
	}
	if _, err := m.Create(ctx, api.CreateSandboxRequest{Name: "disk-c", Memory: "512M"}, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Destroy(ctx, "disk-c") })
	_, err := m.Resume(ctx, "disk-b")
	limitError(t, err, "host limit reached: resuming this 512M sandbox would commit 1.5G of memory, over --max-memory 1G (1G committed)")
	// A call that wakes it gets the same answer.
	_, err = m.Exec(ctx, "disk-b", api.ExecRequest{Cmd: []string{"true"}})
	limitError(t, err, "resuming this 512M sandbox")
	if sb, err := m.Get(ctx, "disk-b"); err != nil || sb.State != core.StatePaused {
		t.Fatalf("after a refused resume: %+v %v", sb, err)
	}
	if err := m.Destroy(ctx, "disk-c"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Resume(ctx, "disk-b"); err != nil {
		t.Fatal(err)
	}
	if info := m.Info(ctx); info.CommittedMemoryBytes != 1<<30 {
		t.Fatalf("resumed: %d committed", info.CommittedMemoryBytes)
	}
}
