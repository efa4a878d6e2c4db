package agent

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/quickack"
)

// dialTimeout bounds an OpDial's connect.
const dialTimeout = 5 * time.Second

// dial serves OpDial: a TCP connection to a port on the sandbox's
// loopback (127.0.0.1, else ::1) (a server listening on any address takes it), whose bytes the
// stream then carries both ways until both sides are done. It reaches
// nothing the sandbox itself could not.
func (s *Server) dial(st net.Conn, fw *frameWriter, req *DialRequest) {
	conn, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(req.Port)), dialTimeout)
	if errors.Is(err, syscall.ECONNREFUSED) { // a server on localhost may be IPv6's alone
		if c6, err6 := net.DialTimeout("tcp", net.JoinHostPort("::1", strconv.Itoa(req.Port)), dialTimeout); err6 == nil {
			conn, err = c6, nil
		}
	}
	if err != nil {
		fw.fail(CodeNotFound, "nothing answers on port %d in the sandbox: %v", req.Port, err)
		return
	}
	defer conn.Close()
	if err := fw.json(api.FrameJSON, Reply{}); err != nil {
		return
	}
	splice(st, quickack.New(conn.(*net.TCPConn)))
}

// splice copies a and b into each other until both directions end,
// passing each end on as a half-close.
func splice(st net.Conn, conn *quickack.Conn) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if _, err := io.Copy(conn, st); err != nil {
			conn.Close() // the daemon's side broke: the other copy ends too
			return
		}
		conn.CloseWrite()
	}()
	io.Copy(st, conn)
	if cw, ok := st.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	} else {
		st.Close()
	}
	wg.Wait()
}

// Dial connects to a TCP port on the sandbox's loopback through the
// agent: the returned connection's bytes are the port's.
func (c *Client) Dial(ctx context.Context, port int) (net.Conn, error) {
	var r Reply
	st, _, err := c.request(ctx, Request{Op: OpDial, Dial: &DialRequest{Port: port}}, &r)
	if err != nil {
		return nil, err
	}
	return st, nil
}
