package guestinit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// A virtio-serial port is one byte stream that outlives host connections:
// a guest can miss the moment the host disconnected and reconnected, and
// then go on reading the new connection's bytes as the old session's. So
// every connection starts with a handshake that ends any stale session
// (Hello is not a valid yamux header: its first byte is not version 0)
// and tells both ends where the new stream begins:
//
//	host:  Hello, Hello, ... (every few ms, until it reads Ready)
//	guest: Ready (after a Hello)
//	host:  Go     (the guest drops Hellos still in flight until Go)
//
// Both sides then speak yamux.
var (
	Hello = []byte("\xffnook-hello-v1\n")
	Ready = []byte("\xffnook-ready-v1\n")
	Go    = []byte("\xffnook-go----v1\n")
)

// acceptHandshake is the guest's side, on a fresh connection.
func acceptHandshake(rw io.ReadWriter) error {
	if err := readUntil(rw, Hello); err != nil {
		return err
	}
	if _, err := rw.Write(Ready); err != nil {
		return err
	}
	return readUntil(rw, Go)
}

// readUntil reads until token has been read; bytes before it are dropped.
func readUntil(r io.Reader, token []byte) error {
	var win []byte
	buf := make([]byte, 1)
	for {
		if _, err := io.ReadFull(r, buf); err != nil {
			return err
		}
		win = append(win, buf[0])
		if len(win) > len(token) {
			win = win[1:]
		}
		if bytes.Equal(win, token) {
			return nil
		}
	}
}

// DialHandshake is the host's side: it greets the guest until it answers.
// Reads and writes alike end with ctx: a guest that reads nothing (a
// stopped vm, whose port buffer then fills) must not block a write
// forever. On an error the caller closes conn.
func DialHandshake(ctx context.Context, conn net.Conn) (err error) {
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		conn.SetDeadline(time.Now())
		close(fired)
	})
	defer func() {
		if !stop() {
			<-fired
		}
		conn.SetDeadline(time.Time{})
		if err != nil && ctx.Err() != nil {
			err = errors.Join(errors.New("agent handshake: the guest agent did not answer"), ctx.Err())
		}
	}()
	ready := make(chan error, 1)
	go func() { ready <- readUntil(conn, Ready) }()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	if _, err := conn.Write(Hello); err != nil {
		return err
	}
	for {
		select {
		case err := <-ready:
			if err != nil {
				return fmt.Errorf("agent handshake: %w", err)
			}
			_, err = conn.Write(Go)
			return err
		case <-tick.C:
			if _, err := conn.Write(Hello); err != nil {
				return err
			}
		}
	}
}
