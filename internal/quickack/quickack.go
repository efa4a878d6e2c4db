// Package quickack turns off delayed ACKs on a TCP connection's reads.
//
// A peer that writes a message in two small writes without TCP_NODELAY
// (Python's http.server: headers, then body; OpenSSH's client outside
// interactive sessions) has its second write held by Nagle's algorithm
// until the first is acknowledged, and Linux delays that ACK up to 40 ms
// once it sees request/answer traffic. Asking for a quick ACK after each
// read (TCP_QUICKACK is not sticky: the kernel may drop back to delayed
// ACKs at any time) takes those 40 ms stalls out of a request's latency,
// for the price of a setsockopt per read.
package quickack // imports nothing of nook's: the agent and the daemon share it

import (
	"io"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// Conn is a TCP connection whose every read asks for a quick ACK.
type Conn struct {
	*net.TCPConn
	raw syscall.RawConn
}

// Wrap returns c with quick ACKs, or c itself if it is no TCP connection.
func Wrap(c net.Conn) net.Conn {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c
	}
	return New(tc)
}

// New returns tc with quick ACKs.
func New(tc *net.TCPConn) *Conn {
	raw, err := tc.SyscallConn()
	if err != nil {
		return &Conn{TCPConn: tc}
	}
	return &Conn{TCPConn: tc, raw: raw}
}

func (c *Conn) Read(p []byte) (int, error) {
	n, err := c.TCPConn.Read(p)
	if c.raw != nil && n > 0 {
		c.raw.Control(func(fd uintptr) {
			unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_QUICKACK, 1)
		})
	}
	return n, err
}

// WriteTo copies the connection's bytes to w through Read, so that
// io.Copy from a Conn keeps asking for quick ACKs (the embedded
// TCPConn's own WriteTo would read past them).
func (c *Conn) WriteTo(w io.Writer) (int64, error) {
	return io.CopyBuffer(w, struct{ io.Reader }{c}, make([]byte, 32<<10))
}
