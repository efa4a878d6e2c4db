package network

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/nookhq/nook/internal/network/nettest"
)

// TestEscapeExposeConnCap: an exposed port holds at most exposeConnCap
// client connections and a sandbox's exposed ports together at most
// sandboxExposeConnCap; one past a cap is closed at once, and a freed slot
// is usable again.
func TestEscapeExposeConnCap(t *testing.T) {
	oldPort, oldSandbox := exposeConnCap, sandboxExposeConnCap
	exposeConnCap, sandboxExposeConnCap = 3, 5
	t.Cleanup(func() { exposeConnCap, sandboxExposeConnCap = oldPort, oldSandbox })
	e := newEnv(t)
	ctx := context.Background()
	ns, _ := e.sandbox("sb-cap")
	nettest.ServeEcho(t, ns, "0.0.0.0:8000")
	nettest.ServeEcho(t, ns, "0.0.0.0:8001")
	a, err := e.m.Expose(ctx, "sb-cap", 8000, 0)
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.m.Expose(ctx, "sb-cap", 8001, 0)
	if err != nil {
		t.Fatal(err)
	}
	// open connects through the forwarder and checks an echo comes back
	// (served) or the connection is closed without one (refused).
	open := func(addr string) (net.Conn, error) {
		c, err := nettest.DialNS(ctx, e.topo.Host, addr, 2*time.Second)
		if err != nil {
			return nil, err
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(c, "x"); err != nil {
			c.Close()
			return nil, err
		}
		buf := make([]byte, 1)
		if _, err := io.ReadFull(c, buf); err != nil {
			c.Close()
			return nil, err
		}
		return c, nil
	}
	refused := func(addr, why string) {
		t.Helper()
		c, err := open(addr)
		if err == nil {
			c.Close()
			t.Fatalf("%s: a connection past the cap was served", why)
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("%s: the connection past the cap was left hanging, not closed: %v", why, err)
		}
	}
	var held []net.Conn
	t.Cleanup(func() {
		for _, c := range held {
			c.Close()
		}
	})
	for range 3 {
		c, err := open(a.String())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	refused(a.String(), "port cap")
	for range 2 {
		c, err := open(b.String())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	// The second port has room of its own, but the sandbox has none.
	refused(b.String(), "sandbox cap")
	// Closing one frees its slot (once the forwarder has seen it close).
	held[0].Close()
	held = held[1:]
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := open(a.String())
		if err == nil {
			held = append(held, c)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a freed slot was not reused: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
