//go:build linux

package guestinit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/internal/poll"
)

// PortListener serves the agent protocol over a virtio-serial port: each
// Accept returns the port once the host side (the daemon, through QEMU's
// socket chardev) is connected, and the connection ends when the host
// disconnects (the guest then reads EOF). One connection at a time, each
// opened by the handshake in handshake.go.
//
// A read on the port returns EOF at once while no host is connected, so
// Accept waits for the kernel's SIGIO on host connection changes, polling
// with a backoff in case one is missed. The port stays open through the
// handshake, also when a host leaves during it: closing it would throw
// away what the guest had not read yet (the Go of a host it answered).
type PortListener struct {
	path string
	// openFile opens the port; os.OpenFile but in tests.
	openFile func(name string, flag int, perm os.FileMode) (*os.File, error)
	// stderr is told why an open failed (the console, or the agent's log).
	stderr io.Writer

	mu     sync.Mutex
	closed bool
	ctx    context.Context // ends at Close
	cancel context.CancelFunc
	busy   chan struct{} // holds a token while a connection is open
	sigio  chan os.Signal
}

// ListenPort returns a listener on the virtio-serial port device path.
func ListenPort(path string) *PortListener {
	l := &PortListener{path: path, openFile: os.OpenFile, stderr: os.Stderr, busy: make(chan struct{}, 1), sigio: make(chan os.Signal, 1)}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	signal.Notify(l.sigio, syscall.SIGIO)
	return l
}

// Accept implements net.Listener.
func (l *PortListener) Accept() (net.Conn, error) {
	select {
	case l.busy <- struct{}{}:
	case <-l.ctx.Done():
		return nil, net.ErrClosed
	}
	for {
		f, err := l.openRetrying()
		if err != nil {
			<-l.busy
			return nil, err
		}
		if err := acceptHandshake(f, func() error { return l.waitHost(f) }); err != nil {
			f.Close()
			if errors.Is(err, net.ErrClosed) {
				<-l.busy
				return nil, err
			}
			continue // the port failed: open it again
		}
		return &portConn{File: f, release: func() { <-l.busy }}, nil
	}
}

// openRetrying opens the port until it opens, or the listener closes
// (net.ErrClosed). An open that fails is tried again, with a backoff, and
// never ends the agent: in a vm the agent is PID 1, and its exit panics
// the guest's kernel. The port opens once only (EBUSY while a file is
// open on it): a command started just then holds a copy of the last
// connection's descriptor from its fork until its exec closes it.
func (l *PortListener) openRetrying() (*os.File, error) {
	var f *os.File
	said := ""
	err := poll.Until(l.ctx, poll.Options{Max: time.Second}, func() (bool, error) {
		var err error
		if f, err = l.open(); err == nil || errors.Is(err, net.ErrClosed) {
			return true, err
		}
		if msg := err.Error(); msg != said { // once per cause, not per try
			fmt.Fprintf(l.stderr, "nook-agent: open %s: %v (trying again)\n", l.path, err)
			said = msg
		}
		return false, nil
	})
	if err != nil && l.ctx.Err() != nil {
		return nil, net.ErrClosed
	}
	return f, err
}

func (l *PortListener) open() (*os.File, error) {
	f, err := l.openFile(l.path, os.O_RDWR|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	fd := int(f.Fd())
	// Ask for SIGIO when the host connects (virtio_console sends it on
	// every host connection change).
	unix.FcntlInt(uintptr(fd), unix.F_SETOWN, os.Getpid())
	if fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0); err == nil {
		unix.FcntlInt(uintptr(fd), unix.F_SETFL, fl|unix.O_ASYNC)
	}
	if err := l.waitHost(f); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// waitHost returns once a host is connected to the port f (it no longer
// polls as hung up), or net.ErrClosed when the listener closes.
func (l *PortListener) waitHost(f *os.File) error {
	fd := int32(f.Fd())
	wait := time.Millisecond
	for {
		pfd := []unix.PollFd{{Fd: fd, Events: unix.POLLIN | unix.POLLOUT}}
		if _, err := unix.Poll(pfd, 0); err != nil && !errors.Is(err, unix.EINTR) {
			return err
		}
		if pfd[0].Revents&unix.POLLHUP == 0 {
			return nil
		}
		t := time.NewTimer(wait)
		select {
		case <-l.sigio:
		case <-t.C:
		case <-l.ctx.Done():
			t.Stop()
			return net.ErrClosed
		}
		t.Stop()
		if wait < 200*time.Millisecond {
			wait *= 2
		}
	}
}

// Close implements net.Listener.
func (l *PortListener) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.closed {
		l.closed = true
		l.cancel()
		signal.Stop(l.sigio)
	}
	return nil
}

// Addr implements net.Listener.
func (l *PortListener) Addr() net.Addr { return portAddr(l.path) }

type portAddr string

func (a portAddr) Network() string { return "virtio-serial" }
func (a portAddr) String() string  { return string(a) }

// portConn is the port as a net.Conn. Deadlines are those of os.File
// (the port is pollable).
type portConn struct {
	*os.File
	once    sync.Once
	release func()
}

func (c *portConn) Close() error {
	err := c.File.Close()
	c.once.Do(c.release)
	return err
}

func (c *portConn) LocalAddr() net.Addr  { return portAddr(c.Name()) }
func (c *portConn) RemoteAddr() net.Addr { return portAddr("host") }
