package quickack

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"
)

// A peer that writes an answer in two small writes, Nagle on (as
// Python's http.server does), answers a reader with quick ACKs at once,
// request after request; io.Copy from the Conn keeps them too.
func TestNoDelayedACKStall(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.(*net.TCPConn).SetNoDelay(false)
		buf := make([]byte, 1)
		for {
			if _, err := io.ReadFull(c, buf); err != nil {
				return
			}
			c.Write([]byte("head"))
			c.Write([]byte("body"))
		}
	}()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c := Wrap(raw)
	defer c.Close()
	var slow int
	for i := 0; i < 20; i++ {
		start := time.Now()
		c.Write([]byte{'q'})
		got := make([]byte, 8)
		if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, []byte("headbody")) {
			t.Fatalf("%q %v", got, err)
		}
		if time.Since(start) > 30*time.Millisecond {
			slow++
		}
	}
	// A delayed ACK stalls every answer after the first few by ~40 ms;
	// one slow answer on a loaded machine is scheduling, not that.
	if slow > 2 {
		t.Fatalf("%d of 20 answers took over 30 ms: delayed ACKs are back", slow)
	}
	if _, ok := c.(io.WriterTo); !ok {
		t.Fatal("Conn has no WriteTo: io.Copy would take the TCPConn's")
	}
}
