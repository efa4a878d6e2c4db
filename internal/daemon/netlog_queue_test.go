package daemon

import (
	"testing"

	"github.com/nookhq/nook/internal/store"
)

// One sandbox's burst of network log entries cannot fill the queue for
// the others, and what it loses is counted in its next entry.
func TestEscapeNetLogQueueShare(t *testing.T) {
	n := &sandboxNets{logc: make(chan store.NetLogEntry, netLogQueue), queued: map[string]int{}, dropped: map[string]int{}}
	const flood = netLogQueue + 1000
	for i := 0; i < flood; i++ {
		n.record(store.NetLogEntry{SandboxID: "a", Suppressed: 1})
	}
	n.record(store.NetLogEntry{SandboxID: "b"})
	if got := len(n.logc); got != netLogQueueEach+1 {
		t.Fatalf("queue holds %d entries, want %d of the flooding sandbox and 1 of the other", got, netLogQueueEach)
	}
	seenB := false
	for len(n.logc) > 0 {
		e := <-n.logc
		n.dequeued(e)
		seenB = seenB || e.SandboxID == "b"
	}
	if !seenB {
		t.Fatal("the other sandbox's entry was not queued")
	}
	// a's next entry counts what a lost: each dropped entry and the
	// events it already counted.
	n.record(store.NetLogEntry{SandboxID: "a"})
	e := <-n.logc
	n.dequeued(e)
	if want := 2 * (flood - netLogQueueEach); e.Suppressed != want {
		t.Errorf("Suppressed %d, want %d", e.Suppressed, want)
	}
	if len(n.queued) != 0 || len(n.dropped) != 0 {
		t.Errorf("counters left: queued %v, dropped %v", n.queued, n.dropped)
	}
}
