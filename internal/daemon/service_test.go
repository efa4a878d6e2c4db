package daemon

import (
	"strings"
	"testing"
)

const procNetTCP = `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 12345 1 0000000000000000 100 0 0 10 0
   1: 0100007F:0016 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 0 1 0000000000000000 20 4 30 10 -1
`

// A template service's port check reads the sandbox's /proc/net/tcp:
// only a listening socket (state 0A) on the port counts, not a
// connection from or to it.
func TestListening(t *testing.T) {
	for port, want := range map[int]bool{8000: true, 22: false, 40000: false, 80: false} {
		if got := listening(strings.NewReader(procNetTCP), port); got != want {
			t.Errorf("port %d: %v, want %v", port, got, want)
		}
	}
	// A line longer than the scanner's buffer (the sandbox controls the
	// text) ends the scan, never the daemon.
	if listening(strings.NewReader(strings.Repeat("x", 1<<20)+"\n"+procNetTCP), 8000) {
		t.Error("a line past the buffer was skipped, not the end of the scan")
	}
}

// FuzzListening: whatever a sandbox serves as /proc/net/tcp, the check
// ends with an answer.
func FuzzListening(f *testing.F) {
	f.Add([]byte(procNetTCP), 8000)
	f.Add([]byte("0: :1F40 x 0A\n"), 8000)
	f.Fuzz(func(t *testing.T, b []byte, port int) {
		listening(strings.NewReader(string(b)), port)
	})
}
