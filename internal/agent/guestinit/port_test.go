//go:build linux

package guestinit

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestPortOpenBusy: an open of the port that fails (EBUSY while a command
// started at that moment still holds the last connection's descriptor
// between its fork and its exec) is tried again until it opens; Accept
// never returns it, which would end the agent: PID 1 of a vm. The old
// Accept returned the first error.
func TestPortOpenBusy(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	guestEnd := os.NewFile(uintptr(fds[0]), "port")
	hostFile := os.NewFile(uintptr(fds[1]), "host")
	host, err := net.FileConn(hostFile)
	hostFile.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()

	var mu sync.Mutex
	var log bytes.Buffer
	opens := 0
	l := ListenPort("/dev/virtio-ports/test")
	defer l.Close()
	l.stderr = &lockedWriter{mu: &mu, w: &log}
	l.openFile = func(name string, flag int, perm os.FileMode) (*os.File, error) {
		mu.Lock()
		defer mu.Unlock()
		opens++
		if opens <= 3 {
			return nil, &os.PathError{Op: "open", Path: name, Err: syscall.EBUSY}
		}
		return guestEnd, nil
	}
	accepted := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			_, err = c.Write([]byte("session"))
			defer c.Close()
		}
		accepted <- err
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dialed := make(chan error, 1)
	go func() { dialed <- DialHandshake(ctx, host) }()
	select {
	case err := <-dialed:
		if err != nil {
			t.Fatalf("handshake after busy opens: %v", err)
		}
	case err := <-accepted:
		if err != nil { // Accept gave up: the handshake would wait in vain
			t.Fatalf("Accept: %v", err)
		}
		accepted <- nil
		if err := <-dialed; err != nil {
			t.Fatalf("handshake after busy opens: %v", err)
		}
	}
	got := make([]byte, 7)
	host.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(host, got); err != nil || string(got) != "session" {
		t.Fatalf("after the handshake the host read %q, %v", got, err)
	}
	if err := <-accepted; err != nil {
		t.Fatalf("Accept: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if opens != 4 {
		t.Fatalf("%d opens, want 4 (3 busy)", opens)
	}
	// Said once, not once per try.
	if n := strings.Count(log.String(), "device or resource busy"); n != 1 {
		t.Fatalf("the busy port was reported %d times: %q", n, log.String())
	}
}

// TestPortOpenClosed: a listener closed while its port does not open
// ends the Accept waiting for it with net.ErrClosed.
func TestPortOpenClosed(t *testing.T) {
	l := ListenPort("/dev/virtio-ports/test")
	l.stderr = &bytes.Buffer{}
	tried := make(chan struct{}, 1)
	l.openFile = func(name string, flag int, perm os.FileMode) (*os.File, error) {
		select {
		case tried <- struct{}{}:
		default:
		}
		return nil, &os.PathError{Op: "open", Path: name, Err: syscall.ENODEV}
	}
	accepted := make(chan error, 1)
	go func() {
		_, err := l.Accept()
		accepted <- err
	}()
	<-tried
	l.Close()
	select {
	case err := <-accepted:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Accept after Close: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Accept still waits for the port 10s after Close")
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
