package warmpool

import "time"

// Clock is the time a Pool measures demand by; tests give a fake one.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f in its own goroutine after d; stop cancels the call.
	AfterFunc(d time.Duration, f func()) (stop func() bool)
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) AfterFunc(d time.Duration, f func()) func() bool {
	return time.AfterFunc(d, f).Stop
}
