package network

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/nookhq/nook/internal/network/nettest"
)

// A sandbox cannot hold more than ConntrackLimit connections at once (so it
// cannot fill the host's conntrack table for everyone); the one over the
// limit is refused and logged, another sandbox is not affected, and the
// sandbox gets its room back when a connection ends.
func TestEscapeConntrackLimit(t *testing.T) {
	const limit = 8
	e := newEnv(t, func(c *Config) { c.ConntrackLimit = limit })
	ctx := context.Background()
	nsA, _ := e.sandbox("sb-ct-a")
	nsB, _ := e.sandbox("sb-ct-b")
	allow := Policy{Allow: []Rule{{Prefix: netip.PrefixFrom(webA, 32)}}}
	e.setPolicy("sb-ct-a", allow)
	e.setPolicy("sb-ct-b", allow)
	echo := webA.String() + ":7" // the echo server keeps connections open

	var conns []net.Conn
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	for i := 0; i < limit; i++ {
		c, err := nettest.DialNS(ctx, nsA, echo, 2*time.Second)
		if err != nil {
			t.Fatalf("connection %d of %d: %v", i+1, limit, err)
		}
		conns = append(conns, c)
	}
	c, err := nettest.DialNS(ctx, nsA, echo, shortTimeout)
	if err == nil {
		c.Close()
		t.Fatalf("connection %d went through, want refused over the limit of %d\n%s", limit+1, limit, e.ruleset())
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("connection over the limit: want ECONNREFUSED, got %v", err)
	}
	e.waitEvent("sb-ct-a", netip.AddrPortFrom(webA, 7), ReasonConntrack)

	// Another sandbox has its own count.
	cb, err := nettest.DialNS(ctx, nsB, echo, 2*time.Second)
	if err != nil {
		t.Fatalf("sandbox B while A is at its limit: %v", err)
	}
	cb.Close()

	// A closed connection frees its place (TIME_WAIT is not counted).
	conns[0].Close()
	deadline := time.Now().Add(3 * time.Second)
	for {
		c, err := nettest.DialNS(ctx, nsA, echo, shortTimeout)
		if err == nil {
			conns[0] = c
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox A after closing a connection: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// One sandbox flooding denied packets uses up only its own log limit:
// another sandbox's single denial is still logged.
func TestEscapeNFLOGFlood(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.LogRate = 5 })
	nsA, _ := e.sandbox("sb-flood-a")
	nsB, _ := e.sandbox("sb-flood-b")
	e.setPolicy("sb-flood-a", Policy{})
	e.setPolicy("sb-flood-b", Policy{})

	var conn *net.UDPConn
	if err := nettest.Do(nsA, func() error {
		var err error
		conn, err = net.ListenUDP("udp4", nil)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stop, done := make(chan struct{}), make(chan int)
	go func() {
		dst := net.UDPAddrFromAddrPort(netip.AddrPortFrom(webB, 80))
		n := 0
		for {
			select {
			case <-stop:
				done <- n
				return
			default:
			}
			conn.WriteToUDP([]byte("flood"), dst)
			n++
		}
	}()
	flooded := false
	defer func() {
		if !flooded {
			close(stop)
			<-done
		}
	}()
	e.waitEvent("sb-flood-a", netip.AddrPortFrom(webB, 80), ReasonPolicy)
	// The flood has used up A's limit.
	for len(e.events) > 0 {
		<-e.events
	}
	e.refused(nsB, webA.String()+":443")
	e.waitEvent("sb-flood-b", netip.AddrPortFrom(webA, 443), ReasonPolicy)
	close(stop)
	n := <-done
	flooded = true
	t.Logf("sandbox A sent %d denied packets", n)
}

// A restart with another connection limit replaces the counting set (an
// element keeps the limit it was made with); one with the same limit keeps
// it, and with it the counts of connections already open.
func TestConntrackLimitChange(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.ConntrackLimit = 8 })
	connSets := func() []string {
		t.Helper()
		c, err := nftables.New(nftables.WithNetNSFd(int(e.topo.Host)))
		if err != nil {
			t.Fatal(err)
		}
		sets, err := c.GetSets(e.m.lay.table)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, s := range sets {
			if strings.HasPrefix(s.Name, setConnPrefix) {
				names = append(names, s.Name)
			}
		}
		return names
	}
	restart := func(limit int) {
		t.Helper()
		m, err := New(context.Background(), Config{NetnsDir: e.dir, HostNetns: e.topo.Host, ConntrackLimit: limit})
		if err != nil {
			t.Fatal(err)
		}
		m.Close()
	}
	if got := connSets(); !slices.Equal(got, []string{"conn-8"}) {
		t.Fatalf("sets %v, want [conn-8]", got)
	}
	restart(8)
	if got := connSets(); !slices.Equal(got, []string{"conn-8"}) {
		t.Fatalf("after a restart with the same limit: sets %v, want [conn-8]", got)
	}
	restart(16)
	if got := connSets(); !slices.Equal(got, []string{"conn-16"}) {
		t.Fatalf("after a restart with limit 16: sets %v, want [conn-16]\n%s", got, e.ruleset())
	}
}
