package network

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// MetadataAddr is the link-local address a sandbox reaches its metadata
// endpoint at (TCP port 80): the prerouting rule sends it to MetadataPort
// of the sandbox's own gateway, and the input rule admits that port from
// the sandbox's own interface alone. Every other link-local address stays
// blocked.
var MetadataAddr = netip.MustParseAddr("169.254.169.254")

// MetadataPort is the gateway port behind MetadataAddr:80: a privileged
// port (below net.ipv4.ip_unprivileged_port_start, 1024 by default), so
// that no unprivileged user of the host can bind it before the daemon.
const MetadataPort uint16 = 169

// EgressPort is the gateway port of a sandbox's egress proxy, where the
// prerouting rule sends its TCP to domain rules' addresses
// (internal/egress); privileged like MetadataPort.
const EgressPort uint16 = 170

// gatewayMark is the socket mark (SO_MARK, which only CAP_NET_ADMIN may
// set) of the daemon's gateway listeners: the input rule admits a
// sandbox's connection to MetadataPort or EgressPort only into a socket
// that carries it, so whatever else holds the port (a socket a host user
// bound first, where the port is unprivileged) never gets a sandbox's
// connection.
const gatewayMark = 0x6e6b6d64 // "nkmd"

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
			if serr == nil {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, gatewayMark)
			}
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

// DialHost connects to dst from the host's network namespace (the egress
// proxy's connections upstream).
func (m *Manager) DialHost(ctx context.Context, dst netip.AddrPort) (net.Conn, error) {
	if m.ownNetns {
		// The daemon's own namespace (as in production): no thread held
		// in another namespace while the connect waits.
		return (&net.Dialer{}).DialContext(ctx, "tcp4", dst.String())
	}
	var c net.Conn
	err := inNetns(m.host, func() error {
		var err error
		c, err = (&net.Dialer{}).DialContext(ctx, "tcp4", dst.String())
		return err
	})
	return c, err
}

// UnprivilegedMetadataPort reports whether the host lets unprivileged
// users bind MetadataPort (net.ipv4.ip_unprivileged_port_start lowered):
// one could then hold a gateway's port before the daemon does, which
// denies that sandbox its endpoint (the socket mark keeps its requests
// from reaching any other socket).
func (m *Manager) UnprivilegedMetadataPort() bool {
	var start int
	inNetns(m.host, func() error {
		b, err := os.ReadFile("/proc/sys/net/ipv4/ip_unprivileged_port_start")
		if err == nil {
			start, err = strconv.Atoi(strings.TrimSpace(string(b)))
		}
		if err != nil {
			start = 1024
		}
		return nil
	})
	return start <= int(MetadataPort)
}
