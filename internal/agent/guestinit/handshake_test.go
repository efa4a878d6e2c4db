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
	// blocks writers, so read a few before answering, as a stale session would).
	junk := make([]byte, 3*len(Hello))
	if _, err := io.ReadFull(guest, junk); err != nil {
		t.Fatal(err)
	}
	if err := acceptHandshake(guest); err != nil {
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

func TestReadUntil(t *testing.T) {
	r := bytes.NewReader(append([]byte("garbage\xff\xffnook"), append(Go, 'x')...))
	if err := readUntil(r, Go); err != nil {
		t.Fatal(err)
	}
	rest, _ := io.ReadAll(r)
	if string(rest) != "x" {
		t.Fatalf("rest %q", rest)
	}
	if err := readUntil(bytes.NewReader([]byte("no token here")), Go); err != io.ErrUnexpectedEOF && err != io.EOF {
		t.Fatalf("missing token: %v", err)
	}
}

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
