package guestinit

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
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
// (a greeting is not a valid yamux header: its first byte is not version
// 0) and tells both ends where the new stream begins:
//
//	host:  Hello, Hello, ... (every few ms, until it reads its Ready)
//	guest: Ready (after a Hello)
//	host:  Go     (the guest drops Hellos still in flight until Go)
//
// Both sides then speak yamux.
//
// Each of the three follows the host connection's nonce (drawn per
// connection), and the guest answers every nonce it has not answered
// yet. The guest cannot see every host disconnect: a host that redials at
// once queues its Hellos behind the old connection's unread ones, and
// both port changes may reach the guest together, so it never reads the
// port empty while no host is connected (its end of file). Without the
// nonce, a guest whose Ready went to a connection that was closing (its
// host gave up as the answer came) waited for that connection's Go for
// ever, taking every later host's Hellos for ones in flight. The host
// skips a Ready after another nonce: the answer to an earlier
// connection's greeting, which the port delivered to it.
//
// An agent of the first protocol (no nonce: one still running in a vm
// made by an earlier nook) finds the Hello and the Go after the nonce
// and answers a bare Ready, which the host takes. A host of the first
// protocol gets no answer from this guest.
var (
	Hello = []byte("\xffnook-hello-v1\n")
	Ready = []byte("\xffnook-ready-v1\n")
	Go    = []byte("\xffnook-go----v1\n")
)

// nonceTag starts a nonce: nonceTag, nonceDigits hex digits, "\n".
var nonceTag = []byte("\xffnook-nonce-")

const (
	nonceDigits = 16
	nonceLen    = len("\xffnook-nonce-") + nonceDigits + 1
	// tokenLen is the length of Hello, Ready and Go.
	tokenLen = len("\xffnook-hello-v1\n")
	// scanWindow holds a nonce and the token after it.
	scanWindow = nonceLen + tokenLen
)

// newNonce draws a connection's nonce.
func newNonce() string {
	b := make([]byte, nonceDigits/2)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// withNonce is token preceded by nonce, as one write.
func withNonce(nonce string, token []byte) []byte {
	b := make([]byte, 0, scanWindow)
	b = append(b, nonceTag...)
	b = append(b, nonce...)
	b = append(b, '\n')
	return append(b, token...)
}

// scanner follows a byte stream for the handshake's tokens and the
// nonce before each. Bytes that make none are dropped.
type scanner struct {
	win [scanWindow]byte
	n   int
}

// push adds b and returns the token of toks the stream now ends with (nil
// if none) and the nonce just before it ("" if there is none).
func (s *scanner) push(b byte, toks ...[]byte) (tok []byte, nonce string) {
	if s.n == len(s.win) {
		copy(s.win[:], s.win[1:])
		s.n--
	}
	s.win[s.n] = b
	s.n++
	w := s.win[:s.n]
	for _, t := range toks {
		if bytes.HasSuffix(w, t) {
			return t, nonceBefore(w[:len(w)-len(t)])
		}
	}
	return nil, ""
}

// nonceBefore returns the nonce p ends with, "" if it ends with none.
func nonceBefore(p []byte) string {
	if len(p) < nonceLen {
		return ""
	}
	p = p[len(p)-nonceLen:]
	if !bytes.HasPrefix(p, nonceTag) || p[nonceLen-1] != '\n' {
		return ""
	}
	digits := p[len(nonceTag) : nonceLen-1]
	for _, c := range digits {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return ""
		}
	}
	return string(digits)
}

// safeRead is how many bytes may be read without reading past the end
// of a Go: the stream after Go is the session's, not the handshake's.
// It is the length of Go less the longest start of Go the stream ends
// with, so a Go can only end at the last byte of such a read.
func (s *scanner) safeRead() int {
	w := s.win[:s.n]
	for m := min(len(w), len(Go)-1); m > 0; m-- {
		if bytes.HasSuffix(w, Go[:m]) {
			return len(Go) - m
		}
	}
	return len(Go)
}

// acceptHandshake is the guest's side, on the port. A read at end of
// file means no host is connected: waitHost returns once one is (or with
// the error that ends the wait), and the handshake goes on where it was,
// on the same descriptor (closing the port would throw away what the
// guest had not read yet, the Go of the host it answered among it).
func acceptHandshake(rw io.ReadWriter, waitHost func() error) error {
	var sc scanner
	var answered string // the nonce answered last; "" before the first
	buf := make([]byte, len(Go))
	for {
		n, err := rw.Read(buf[:sc.safeRead()])
		for _, b := range buf[:n] {
			tok, nonce := sc.push(b, Hello, Go)
			switch {
			case tok == nil || nonce == "":
				// Not a token, or one without a nonce (a host of the
				// first protocol, or a greeting cut short): dropped.
			case bytes.Equal(tok, Hello) && nonce != answered:
				// A host this guest has not answered: the one it
				// answered before went away (or never got it).
				if _, err := rw.Write(withNonce(nonce, Ready)); err != nil {
					return err
				}
				answered = nonce
			case bytes.Equal(tok, Go) && nonce == answered:
				return nil // the Go ends the read (safeRead)
			}
		}
		switch {
		case err == nil || (n > 0 && errors.Is(err, io.EOF)):
		case errors.Is(err, io.EOF) && waitHost != nil:
			if err := waitHost(); err != nil {
				return err
			}
		default:
			return err
		}
	}
}

// readReady is the host's wait for the guest's answer to its greeting:
// a Ready after this connection's nonce, or a bare Ready (an agent of the
// first protocol). A Ready after another nonce answered an earlier
// connection's greeting: skipped.
func readReady(r io.Reader, nonce string) error {
	var sc scanner
	buf := make([]byte, 1)
	for {
		if _, err := io.ReadFull(r, buf); err != nil {
			return err
		}
		if tok, n := sc.push(buf[0], Ready); tok != nil && (n == "" || n == nonce) {
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
	nonce := newNonce()
	hello := withNonce(nonce, Hello)
	ready := make(chan error, 1)
	go func() { ready <- readReady(conn, nonce) }()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	if _, err := conn.Write(hello); err != nil {
		return err
	}
	for {
		select {
		case err := <-ready:
			if err != nil {
				return fmt.Errorf("agent handshake: %w", err)
			}
			_, err = conn.Write(withNonce(nonce, Go))
			return err
		case <-tick.C:
			if _, err := conn.Write(hello); err != nil {
				return err
			}
		}
	}
}
