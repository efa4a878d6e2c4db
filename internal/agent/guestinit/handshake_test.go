package guestinit

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// A stale session's leftovers and repeated Hellos before the guest looks
// do not confuse the handshake, and the bytes after Go are the new stream's.
func TestHandshake(t *testing.T) {
	host, guest := net.Pipe()
	defer host.Close()
	defer guest.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		if err := DialHandshake(ctx, host); err != nil {
			done <- err
			return
		}
		_, err := host.Write([]byte("payload"))
		done <- err
	}()
	// The guest is slow to look: several Hellos are waiting (net.Pipe
	// blocks writers, so read a few before answering, as a stale session
	// would; 3*len(Hello) bytes end inside a greeting).
	junk := make([]byte, 3*len(Hello))
	if _, err := io.ReadFull(guest, junk); err != nil {
		t.Fatal(err)
	}
	if err := acceptHandshake(guest, nil); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 7)
	if _, err := io.ReadFull(guest, got); err != nil {
		t.Fatal(err)
	}
	if string(got) != "payload" {
		t.Fatalf("stream after handshake starts with %q", got)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestHandshakeTimeout(t *testing.T) {
	host, guest := net.Pipe()
	defer host.Close()
	go io.Copy(io.Discard, guest) // a guest that never answers
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := DialHandshake(ctx, host); err == nil {
		t.Fatal("handshake with a silent guest succeeded")
	}
}

// TestScanner: tokens are found after any noise, with the nonce just
// before them, and a Go is never read past.
func TestScanner(t *testing.T) {
	stream := append([]byte("garbage\xff\xffnook"), withNonce("0123456789abcdef", Go)...)
	stream = append(stream, 'x')
	var sc scanner
	r := bytes.NewReader(stream)
	var found []byte
	var nonce string
	for found == nil {
		buf := make([]byte, sc.safeRead())
		n, err := r.Read(buf)
		if err != nil {
			t.Fatalf("no Go in the stream: %v", err)
		}
		for i, b := range buf[:n] {
			if found != nil {
				t.Fatalf("read %d bytes past the Go", n-i)
			}
			found, nonce = sc.push(b, Hello, Go)
		}
	}
	if !bytes.Equal(found, Go) || nonce != "0123456789abcdef" {
		t.Fatalf("found %q after nonce %q", found, nonce)
	}
	if rest, _ := io.ReadAll(r); string(rest) != "x" {
		t.Fatalf("rest %q", rest)
	}
	// A bare token (a peer of the first protocol), and a cut nonce.
	sc = scanner{}
	for _, in := range [][]byte{Ready, append([]byte("\xffnook-nonce-0123\n"), Ready...), append(withNonce("0123456789abcdeg", nil), Ready...)} {
		var tok []byte
		for _, b := range in {
			tok, nonce = sc.push(b, Ready)
		}
		if !bytes.Equal(tok, Ready) || nonce != "" {
			t.Fatalf("%q: token %q nonce %q", in, tok, nonce)
		}
	}
}

// greet plays a host of nonce on conn until it reads its Ready, without
// the Go: as a host whose wait ended just as the guest's answer came.
func greet(t *testing.T, conn net.Conn, nonce string) {
	t.Helper()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	defer conn.SetDeadline(time.Time{})
	got := make(chan error, 1)
	go func() { got <- readReady(conn, nonce) }()
	if _, err := conn.Write(withNonce(nonce, Hello)); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("the guest did not answer %s: %v", nonce, err)
	}
}

// TestHandshakeLostReady: a guest whose Ready went to a host that left
// before sending Go, and that did not see that host leave (a redial at
// once, its Hellos behind the old ones), answers the next host. The
// first protocol's guest waited for the first host's Go for ever: a vm
// whose agent never answered again (TestStoppedGuestContinued).
func TestHandshakeLostReady(t *testing.T) {
	host, guest := net.Pipe()
	defer host.Close()
	defer guest.Close()
	done := make(chan error, 1)
	go func() {
		err := acceptHandshake(guest, nil)
		if err == nil {
			_, err = guest.Write([]byte("session"))
		}
		done <- err
	}()
	greet(t, host, "00000000000000aa") // its Ready is lost: no Go follows
	dialSession(t, host, done, "the next host")
}

// TestHandshakeStaleReady: a Ready the port delivers to a later
// connection (the guest answered an earlier host's Hello, read late) is
// not that connection's: its host waits for the answer to its own
// nonce, and the stream after Go is clean.
func TestHandshakeStaleReady(t *testing.T) {
	host, guest := net.Pipe()
	defer host.Close()
	defer guest.Close()
	done := make(chan error, 1)
	go func() {
		// An earlier host's Hello, still unread when this host connected.
		if _, err := host.Write(withNonce("00000000000000bb", Hello)); err != nil {
			done <- err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err := DialHandshake(ctx, host)
		if err == nil {
			_, err = host.Write([]byte("session"))
		}
		done <- err
	}()
	var answers bytes.Buffer
	if err := acceptHandshake(struct {
		io.Reader
		io.Writer
	}{guest, io.MultiWriter(&answers, guest)}, nil); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 7)
	if _, err := io.ReadFull(guest, got); err != nil || string(got) != "session" {
		t.Fatalf("after the handshake the guest read %q, %v", got, err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(answers.Bytes(), Ready); n != 2 || !bytes.HasPrefix(answers.Bytes(), withNonce("00000000000000bb", Ready)) {
		t.Fatalf("the guest answered %q", answers.Bytes())
	}
}

// TestHandshakeFirstProtocolAgent: an agent of the first protocol (no
// nonce; one running in a vm made by an earlier nook) still connects.
func TestHandshakeFirstProtocolAgent(t *testing.T) {
	host, guest := net.Pipe()
	defer host.Close()
	defer guest.Close()
	done := make(chan error, 1)
	go func() {
		// The first protocol's guest: Hello, then Ready, then until Go.
		untilToken := func(tok []byte) error {
			var sc scanner
			b := make([]byte, 1)
			for {
				if _, err := io.ReadFull(guest, b); err != nil {
					return err
				}
				if found, _ := sc.push(b[0], tok); found != nil {
					return nil
				}
			}
		}
		if err := untilToken(Hello); err != nil {
			done <- err
			return
		}
		if _, err := guest.Write(Ready); err != nil {
			done <- err
			return
		}
		if err := untilToken(Go); err != nil {
			done <- err
			return
		}
		_, err := guest.Write([]byte("session"))
		done <- err
	}()
	dialSession(t, host, done, "the host")
}

// TestHandshakeHostAway: end of file (no host connected) does not end
// the guest's handshake: it waits for a host and goes on with the same
// stream, so a Go sent meanwhile is not lost.
func TestHandshakeHostAway(t *testing.T) {
	const nonce = "00000000000000cc"
	stream := &eofOnce{data: [][]byte{withNonce(nonce, Hello), withNonce(nonce, Go)}}
	waits := 0
	err := acceptHandshake(stream, func() error { waits++; return nil })
	if err != nil || waits != 1 || !bytes.Equal(stream.out.Bytes(), withNonce(nonce, Ready)) {
		t.Fatalf("handshake %v after %d waits, answered %q", err, waits, stream.out.Bytes())
	}
}

// eofOnce reads its chunks with an end of file between them, as the
// port does while no host is connected.
type eofOnce struct {
	data [][]byte
	eof  bool
	out  bytes.Buffer
}

func (e *eofOnce) Read(p []byte) (int, error) {
	if len(e.data) == 0 {
		return 0, errors.New("read past the stream")
	}
	if e.eof {
		e.eof = false
		return 0, io.EOF
	}
	n := copy(p, e.data[0])
	e.data[0] = e.data[0][n:]
	if len(e.data[0]) == 0 {
		e.data = e.data[1:]
		e.eof = true
	}
	return n, nil
}

func (e *eofOnce) Write(p []byte) (int, error) { return e.out.Write(p) }

func TestModuleParams(t *testing.T) {
	cmd := "console=ttyS0 virtio_mmio.device=512@0xfeb00e00:12 virtio-mmio.device=512@0xfeb00c00:13 ext4.x=1 virtio_mmio. other"
	if got := ModuleParams(cmd, "virtio_mmio"); got != "device=512@0xfeb00e00:12 device=512@0xfeb00c00:13" {
		t.Fatalf("%q", got)
	}
}

// TestDialHandshakeGuestNotReading: a guest that reads nothing (a stopped
// vm fills its port's buffer, and then the host's writes block) does not
// hold the host past its context.
func TestDialHandshakeGuestNotReading(t *testing.T) {
	host, guest := net.Pipe() // a write blocks until the other side reads
	defer guest.Close()
	defer host.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := DialHandshake(ctx, host)
	if err == nil || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "did not answer") {
		t.Fatalf("handshake with a guest that never reads: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("the handshake took %s past a 200ms context", d)
	}
}

// dialSession greets the guest from host, checks the stream after the
// handshake is the guest's session, and that the guest's side (done)
// ended well.
func dialSession(t *testing.T, host net.Conn, done <-chan error, who string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := DialHandshake(ctx, host); err != nil {
		t.Fatalf("%s: %v", who, err)
	}
	got := make([]byte, 7)
	if _, err := io.ReadFull(host, got); err != nil || string(got) != "session" {
		t.Fatalf("after the handshake the host read %q, %v", got, err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
