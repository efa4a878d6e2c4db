// Package nsthread runs a function on an OS thread of its own that the
// function may move into other namespaces (setns, unshare) and that is
// never used again: the runtime ends the thread with the goroutine, and
// with it whatever namespace the function left it in.
//
// Never on the process's main thread: the runtime cannot end that one
// (it keeps it, idle, in the namespace it was left in), and /proc/self
// is its view, so every later reader of /proc/self/mountinfo or
// /proc/self/ns/net in the process would see the wrong namespace.
package nsthread

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// Run runs fn on a locked OS thread that is never unlocked (and is not
// the main thread), and returns its error.
func Run(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if unix.Gettid() == unix.Getpid() {
			// Held meanwhile, so that the goroutine below gets another thread.
			errc <- Run(fn)
			runtime.UnlockOSThread()
			return
		}
		errc <- fn()
	}()
	return <-errc
}
