package network

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/quickack"
	"github.com/vishvananda/netns"
)

// Exposure is a sandbox port reachable from the host.
type Exposure struct {
	SandboxPort uint16
	// HostAddr is where the host reaches it. Pass its port back to Expose
	// after a daemon restart to keep the address stable.
	HostAddr netip.AddrPort
}

// Caps on the connections through exposed ports: a forwarder holds at
// most exposeConnCap client connections at once, all of a sandbox's
// forwarders together at most sandboxExposeConnCap; a connection past
// either is closed as soon as it is accepted. (Variables for tests.)
var (
	exposeConnCap        = 256
	sandboxExposeConnCap = 1024
)

// connBudget counts the client connections of all of one sandbox's
// forwarders.
type connBudget struct {
	mu sync.Mutex
	n  int
}

// forwarder is a userspace TCP forwarder from a host listener to a
// sandbox port. The host dials out to the sandbox, which the input chain
// allows (only replies come back in), so no inbound rule is needed.
type forwarder struct {
	ln     net.Listener
	target netip.AddrPort
	host   netns.NsHandle
	// budget is shared by the sandbox's forwarders; active is this one's
	// client connections.
	budget *connBudget
	active int

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// Expose makes TCP port sandboxPort of a sandbox reachable on the host at
// the returned address (Config.ExposeAddr, port hostPort or an ephemeral
// one when 0). Exposing a port that is already exposed returns its
// address.
func (m *Manager) Expose(ctx context.Context, id string, sandboxPort, hostPort uint16) (netip.AddrPort, error) {
	if err := ctx.Err(); err != nil {
		return netip.AddrPort{}, err
	}
	if sandboxPort == 0 {
		return netip.AddrPort{}, errdefs.Invalid("expose: sandbox port 0")
	}
	unlock := m.lock(id)
	defer unlock()
	sb, err := m.get(id)
	if err != nil {
		return netip.AddrPort{}, err
	}
	m.mu.Lock()
	f := sb.exposes[sandboxPort]
	m.mu.Unlock()
	if f != nil {
		return addrPortOf(f.ln.Addr()), nil
	}
	var ln net.Listener
	laddr := netip.AddrPortFrom(m.cfg.ExposeAddr, hostPort).String()
	err = inNetns(m.host, func() error {
		var lerr error
		ln, lerr = (&net.ListenConfig{}).Listen(ctx, "tcp4", laddr)
		return lerr
	})
	if err != nil {
		if errors.Is(err, errAddrInUse) {
			return netip.AddrPort{}, errdefs.Exists("expose: host address %s is in use", laddr)
		}
		return netip.AddrPort{}, fmt.Errorf("expose: listen on %s: %w", laddr, err)
	}
	f = &forwarder{ln: ln, target: netip.AddrPortFrom(SandboxAddr(sb.subnet), sandboxPort), host: m.host, conns: map[net.Conn]struct{}{}}
	m.mu.Lock()
	for _, other := range sb.exposes {
		f.budget = other.budget
		break
	}
	if f.budget == nil {
		f.budget = &connBudget{}
	}
	sb.exposes[sandboxPort] = f
	m.mu.Unlock()
	f.wg.Add(1)
	go f.serve()
	m.log.InfoContext(ctx, "network: exposed sandbox port", "sandbox", id, "port", sandboxPort, "host", ln.Addr().String())
	return addrPortOf(ln.Addr()), nil
}

// Unexpose closes an exposed port and the connections through it.
func (m *Manager) Unexpose(ctx context.Context, id string, sandboxPort uint16) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	unlock := m.lock(id)
	defer unlock()
	sb, err := m.get(id)
	if err != nil {
		return err
	}
	m.mu.Lock()
	f := sb.exposes[sandboxPort]
	delete(sb.exposes, sandboxPort)
	m.mu.Unlock()
	if f == nil {
		return errdefs.NotFound("sandbox %q: port %d is not exposed", id, sandboxPort)
	}
	f.close()
	return nil
}

// Exposures lists a sandbox's exposed ports.
func (m *Manager) Exposures(id string) []Exposure {
	m.mu.Lock()
	defer m.mu.Unlock()
	sb := m.sandboxes[id]
	if sb == nil {
		return nil
	}
	out := make([]Exposure, 0, len(sb.exposes))
	for p, f := range sb.exposes {
		out = append(out, Exposure{SandboxPort: p, HostAddr: addrPortOf(f.ln.Addr())})
	}
	return out
}

var errAddrInUse = errors.New("address already in use")

func addrPortOf(a net.Addr) netip.AddrPort {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.AddrPort()
	}
	return netip.AddrPort{}
}

func (f *forwarder) serve() {
	defer f.wg.Done()
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		if !f.admit() {
			// Past a cap: closed at once, never queued.
			c.Close()
			continue
		}
		if !f.track(c) {
			f.release()
			c.Close()
			return
		}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			defer f.release()
			defer f.untrack(c)
			f.pipe(c)
		}()
	}
}

func (f *forwarder) pipe(c net.Conn) {
	var up net.Conn
	err := inNetns(f.host, func() error {
		var derr error
		up, derr = (&net.Dialer{Timeout: 5 * time.Second}).Dial("tcp4", f.target.String())
		return derr
	})
	if err != nil {
		return
	}
	if !f.track(up) {
		up.Close()
		return
	}
	defer f.untrack(up)
	// Quick ACKs toward the sandbox's server: one that writes an answer
	// in two small writes with Nagle on (Python's http.server) would
	// otherwise wait 40 ms for our delayed ACK on every kept-alive request.
	up = quickack.Wrap(up)
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		io.Copy(dst, src)
		if tc, ok := dst.(interface{ CloseWrite() error }); ok {
			tc.CloseWrite()
		}
		done <- struct{}{}
	}
	go cp(up, c)
	go cp(c, up)
	<-done
	<-done
}

// admit counts a new client connection against the forwarder's and the
// sandbox's caps, or refuses it.
func (f *forwarder) admit() bool {
	f.budget.mu.Lock()
	defer f.budget.mu.Unlock()
	if f.active >= exposeConnCap || f.budget.n >= sandboxExposeConnCap {
		return false
	}
	f.active++
	f.budget.n++
	return true
}

func (f *forwarder) release() {
	f.budget.mu.Lock()
	f.active--
	f.budget.n--
	f.budget.mu.Unlock()
}

func (f *forwarder) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.conns[c] = struct{}{}
	return true
}

func (f *forwarder) untrack(c net.Conn) {
	c.Close()
	f.mu.Lock()
	delete(f.conns, c)
	f.mu.Unlock()
}

func (f *forwarder) close() {
	f.mu.Lock()
	f.closed = true
	f.ln.Close()
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}
