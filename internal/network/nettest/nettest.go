// Package nettest builds throwaway network topologies for tests of nook's
// network dataplane: a simulated host and a simulated outside world, each
// a network namespace held only by file descriptors, joined by a veth
// pair. Every packet a test sends stays inside namespaces it created; when
// the test ends the namespaces vanish with their interfaces, addresses,
// routes and nftables tables.
package nettest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Addresses of the uplink between the simulated host and world. They come
// from TEST-NET-1 (RFC 5737), which nook treats as public.
var (
	HostUplink  = netip.MustParseAddr("192.0.2.1")
	WorldUplink = netip.MustParseAddr("192.0.2.2")
)

// Topology is a simulated host whose only uplink leads into a simulated
// world.
type Topology struct {
	Host, World netns.NsHandle
}

// RequireRoot skips a test that needs root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root (network namespaces, nftables)")
	}
}

// New creates the two namespaces, the veth between them (host "uplink",
// world "down"), and a default route from the host into the world. The
// world answers for any address added with AddWorldAddr.
func New(t testing.TB) *Topology {
	t.Helper()
	RequireRoot(t)
	host, err := NewNetns()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { host.Close() })
	world, err := NewNetns()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { world.Close() })
	hh, err := netlink.NewHandleAt(host, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer hh.Close()
	wh, err := netlink.NewHandleAt(world, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer wh.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "uplink"}, PeerName: "down", PeerNamespace: netlink.NsFd(world)}
	must(t, hh.LinkAdd(veth))
	must(t, hh.AddrAdd(veth, addr(HostUplink, 24)))
	must(t, hh.LinkSetUp(veth))
	for _, h := range []*netlink.Handle{hh, wh} {
		lo, err := h.LinkByName("lo")
		must(t, err)
		must(t, h.LinkSetUp(lo))
	}
	down, err := wh.LinkByName("down")
	must(t, err)
	must(t, wh.AddrAdd(down, addr(WorldUplink, 24)))
	must(t, wh.LinkSetUp(down))
	must(t, hh.RouteAdd(&netlink.Route{LinkIndex: veth.Attrs().Index, Gw: net.IP(WorldUplink.AsSlice())}))
	return &Topology{Host: host, World: world}
}

// AddWorldAddr gives the world an address (on its loopback), so that the
// host routes it into the world and world listeners can bind it.
func (tp *Topology) AddWorldAddr(t testing.TB, a netip.Addr) {
	t.Helper()
	h, err := netlink.NewHandleAt(tp.World, unix.NETLINK_ROUTE)
	must(t, err)
	defer h.Close()
	lo, err := h.LinkByName("lo")
	must(t, err)
	must(t, h.AddrAdd(lo, addr(a, 32)))
}

// RouteWorldTo adds a route in the world towards prefix via the host, for
// tests of inbound traffic.
func (tp *Topology) RouteWorldTo(t testing.TB, prefix netip.Prefix) {
	t.Helper()
	h, err := netlink.NewHandleAt(tp.World, unix.NETLINK_ROUTE)
	must(t, err)
	defer h.Close()
	_, dst, _ := net.ParseCIDR(prefix.String())
	must(t, h.RouteAdd(&netlink.Route{Dst: dst, Gw: net.IP(HostUplink.AsSlice())}))
}

func addr(a netip.Addr, bits int) *netlink.Addr {
	return &netlink.Addr{IPNet: &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(bits, 32)}}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// NewNetns creates an anonymous network namespace and returns a handle to
// it, without moving the caller into it. The namespace lives as long as
// the handle or a socket in it.
func NewNetns() (netns.NsHandle, error) {
	var h netns.NsHandle
	err := Do(-1, func() error {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("unshare: %w", err)
		}
		var err error
		h, err = netns.Get()
		return err
	})
	return h, err
}

// Do runs fn on a thread in namespace ns (-1: a fresh thread that fn may
// move), then returns the thread to where it came from. Sockets fn creates
// stay in ns.
func Do(ns netns.NsHandle, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		if ns >= 0 {
			if err := netns.Set(ns); err != nil {
				runtime.UnlockOSThread()
				errc <- err
				return
			}
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			errc <- errors.Join(ferr, err) // thread stays locked and is discarded
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// Server is a TCP listener in a namespace, serving until the test ends.
type Server struct {
	ln   net.Listener
	wg   sync.WaitGroup
	Addr netip.AddrPort
}

// Serve listens on addr ("ip:port") in ns and writes "<banner> <remote
// address>" to every connection before closing it.
func Serve(t testing.TB, ns netns.NsHandle, addr, banner string) *Server {
	return serve(t, ns, addr, func(c net.Conn) {
		fmt.Fprintf(c, "%s %s", banner, c.RemoteAddr())
	})
}

// ServeEcho listens on addr in ns and echoes what it reads.
func ServeEcho(t testing.TB, ns netns.NsHandle, addr string) *Server {
	return serve(t, ns, addr, func(c net.Conn) { io.Copy(c, c) })
}

func serve(t testing.TB, ns netns.NsHandle, addr string, handle func(net.Conn)) *Server {
	t.Helper()
	var ln net.Listener
	err := Do(ns, func() error {
		var err error
		ln, err = net.Listen("tcp4", addr)
		return err
	})
	if err != nil {
		t.Fatalf("listen %s: %v", addr, err)
	}
	s := &Server{ln: ln, Addr: ln.Addr().(*net.TCPAddr).AddrPort()}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
				handle(c)
			}()
		}
	}()
	t.Cleanup(s.Close)
	return s
}

// Close stops the server and waits for its connections to end.
func (s *Server) Close() {
	s.ln.Close()
	s.wg.Wait()
}

// DialNS connects to addr from namespace ns.
func DialNS(ctx context.Context, ns netns.NsHandle, addr string, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := Do(ns, func() error {
		var err error
		c, err = (&net.Dialer{Timeout: timeout}).DialContext(ctx, "tcp4", addr)
		return err
	})
	return c, err
}

// Fetch connects to addr from ns and returns everything the server sends
// before closing.
func Fetch(ctx context.Context, ns netns.NsHandle, addr string, timeout time.Duration) (string, error) {
	c, err := DialNS(ctx, ns, addr, timeout)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	b, err := io.ReadAll(c)
	return string(b), err
}
