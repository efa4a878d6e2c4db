package server

import (
	"bufio"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// A streamed answer to a client that stops reading ends within the write
// deadline, though the client keeps its connection open.
func TestStreamWriteDeadline(t *testing.T) {
	old := streamWriteTimeout
	streamWriteTimeout = 200 * time.Millisecond
	defer func() { streamWriteTimeout = old }()
	ended := make(chan error, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		dw := deadlineWriter{w, rc}
		line := []byte(strings.Repeat("x", 64<<10) + "\n")
		for {
			if _, err := dw.Write(line); err != nil {
				ended <- err
				return
			}
			rc.Flush()
		}
	}))
	defer srv.Close()
	c, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	bufio.NewReader(c).ReadString('\n') // the status line, then nothing more is read
	select {
	case err := <-ended:
		if !strings.Contains(err.Error(), "timeout") {
			t.Errorf("the stream ended with %v, want a timeout", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a stream to a client that reads nothing did not end")
	}
}
