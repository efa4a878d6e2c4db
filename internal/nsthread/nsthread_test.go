package nsthread

import (
	"fmt"
	"os"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// TestMain checks, from the main goroutine on the process's main thread
// with one P (so a goroutine Run starts would run on this very thread
// while it waits), that Run never runs fn on the main thread.
func TestMain(m *testing.M) {
	prev := runtime.GOMAXPROCS(1)
	onMain := false
	for range 20 {
		Run(func() error {
			onMain = onMain || unix.Gettid() == unix.Getpid()
			return nil
		})
	}
	runtime.GOMAXPROCS(prev)
	if onMain {
		fmt.Fprintln(os.Stderr, "Run ran its function on the process's main thread")
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// Run returns fn's error, and fn runs on a thread that is not the
// caller's and is never reused.
func TestRun(t *testing.T) {
	tids := map[int]bool{}
	for range 10 {
		if err := Run(func() error { tids[unix.Gettid()] = true; return nil }); err != nil {
			t.Fatal(err)
		}
	}
	if len(tids) != 10 {
		t.Errorf("10 runs used %d threads: a thread was reused", len(tids))
	}
	want := fmt.Errorf("x")
	if err := Run(func() error { return want }); err != want {
		t.Errorf("Run returned %v", err)
	}
}
