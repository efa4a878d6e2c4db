package network

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"
)

// MetadataAddr is the link-local address a sandbox reaches its metadata
// endpoint at (TCP port 80): the prerouting rule sends it to MetadataPort
// of the sandbox's own gateway, and the input rule admits that port from
// the sandbox's own interface alone. Every other link-local address stays
// blocked.
var MetadataAddr = netip.MustParseAddr("169.254.169.254")

// MetadataPort is the gateway port behind MetadataAddr:80.
const MetadataPort uint16 = 9254

// ListenGateway listens on TCP port of a sandbox subnet's gateway address,
// in the host's network namespace. The address need not be there yet (a
// sandbox paused to disk has no interface; its next attach brings the
// address back to the same socket).
func (m *Manager) ListenGateway(ctx context.Context, subnet netip.Prefix, port uint16) (net.Listener, error) {
	var ln net.Listener
	addr := netip.AddrPortFrom(Gateway(subnet), port).String()
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_FREEBIND, 1)
		}); err != nil {
			return err
		}
		return serr
	}}
	err := inNetns(m.host, func() error {
		var lerr error
		ln, lerr = lc.Listen(ctx, "tcp4", addr)
		return lerr
	})
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	return ln, nil
}
