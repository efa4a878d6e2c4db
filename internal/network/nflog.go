package network

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	nflog "github.com/florianl/go-nflog/v2"
	"golang.org/x/sys/unix"
	"golang.org/x/time/rate"
)

// Event is one denied packet.
type Event struct {
	Time  time.Time
	Proto string         // "tcp", "udp", "icmp", or the protocol number
	Dst   netip.AddrPort // port 0 for protocols without ports
	// Reason is one of the Reason* constants.
	Reason string
	// Suppressed counts the events of this sandbox dropped by the
	// userspace rate limit (EventRate) since the previous one that was
	// delivered; those the kernel's limit (LogRate) dropped are not
	// counted.
	Suppressed int
}

// startLog reads the NFLOG group the deny chains log to and passes events
// to Config.OnDenied. It runs until Close.
func (m *Manager) startLog(ctx context.Context) error {
	if m.cfg.OnDenied == nil {
		return nil
	}
	nf, err := nflog.Open(&nflog.Config{
		NetNS:    int(m.host),
		Group:    m.cfg.LogGroup,
		Copymode: nflog.CopyPacket,
		Bufsize:  80,
		Logger:   nopLogger{},
	})
	if err != nil {
		return fmt.Errorf("open nflog group %d: %w", m.cfg.LogGroup, err)
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	m.cancel = cancel
	m.done = make(chan struct{})
	hook := func(a nflog.Attribute) int {
		m.handleLog(a)
		return 0
	}
	// A larger socket buffer rides out bursts from many sandboxes at once
	// (best effort: the default is about 200 KiB, some 1000 messages).
	if err := nf.Con.SetReadBuffer(logReadBuffer); err != nil {
		m.log.Debug("network: denied-packet log buffer", "err", err)
	}
	var lastOverflow time.Time
	errFn := func(err error) int {
		if ctx.Err() != nil {
			return 1
		}
		if errors.Is(err, unix.ENOBUFS) {
			// The kernel dropped messages the reader was too slow for;
			// which sandboxes they were from is unknown. Say so at most
			// once a minute.
			if time.Since(lastOverflow) > time.Minute {
				lastOverflow = time.Now()
				m.log.Warn("network: denied-packet log overflowed: some denials were not logged")
			}
			return 0
		}
		m.log.Warn("network: reading denied-packet log", "err", err)
		return 0
	}
	if err := nf.RegisterWithErrorFunc(ctx, hook, errFn); err != nil {
		cancel()
		nf.Close()
		return fmt.Errorf("register nflog hook: %w", err)
	}
	go func() {
		<-ctx.Done()
		nf.Close()
		close(m.done)
	}()
	return nil
}

// logReadBuffer is the NFLOG socket's receive buffer.
const logReadBuffer = 4 << 20

type nopLogger struct{}

func (nopLogger) Debugf(string, ...any) {}
func (nopLogger) Errorf(string, ...any) {}

func (m *Manager) handleLog(a nflog.Attribute) {
	if a.Prefix == nil || a.Payload == nil {
		return
	}
	reason, ok := strings.CutPrefix(strings.TrimRight(*a.Prefix, "\x00 "), logPrefix)
	if !ok {
		return
	}
	ev, err := parsePacket(*a.Payload)
	if err != nil {
		return
	}
	ev.Reason = reason
	ev.Time = time.Now()
	if a.Timestamp != nil {
		ev.Time = *a.Timestamp
	}
	m.mu.Lock()
	var sb *sandbox
	for _, dev := range []*uint32{a.InDev, a.OutDev} {
		if dev != nil {
			if id, ok := m.byIndex[int(*dev)]; ok {
				sb = m.sandboxes[id]
				break
			}
		}
	}
	if sb == nil {
		m.mu.Unlock()
		return
	}
	allowed, suppressed := sb.events.take(time.Now())
	id := sb.id
	m.mu.Unlock()
	if !allowed {
		return
	}
	ev.Suppressed = suppressed
	m.cfg.OnDenied(id, ev)
}

var errShortPacket = errors.New("short packet")

// parsePacket reads the destination and protocol of an IPv4 or IPv6
// packet.
func parsePacket(b []byte) (Event, error) {
	if len(b) < 1 {
		return Event{}, errShortPacket
	}
	var (
		proto uint8
		dst   netip.Addr
		l4    []byte
	)
	switch b[0] >> 4 {
	case 4:
		ihl := int(b[0]&0x0f) * 4
		if len(b) < 20 || ihl < 20 {
			return Event{}, errShortPacket
		}
		proto = b[9]
		dst = netip.AddrFrom4([4]byte(b[16:20]))
		if fragOff := (uint16(b[6])<<8 | uint16(b[7])) & 0x1fff; fragOff == 0 && len(b) >= ihl {
			l4 = b[ihl:]
		}
	case 6:
		if len(b) < 40 {
			return Event{}, errShortPacket
		}
		proto = b[6]
		dst = netip.AddrFrom16([16]byte(b[24:40]))
		l4 = b[40:]
	default:
		return Event{}, fmt.Errorf("not an IP packet")
	}
	ev := Event{Proto: protoName(proto)}
	var port uint16
	if (proto == protoTCP || proto == protoUDP) && len(l4) >= 4 {
		port = uint16(l4[2])<<8 | uint16(l4[3])
	}
	ev.Dst = netip.AddrPortFrom(dst, port)
	return ev, nil
}

func protoName(p uint8) string {
	switch p {
	case protoTCP:
		return "tcp"
	case protoUDP:
		return "udp"
	case 1:
		return "icmp"
	case 58:
		return "ipv6-icmp"
	}
	return fmt.Sprint(p)
}

// eventLimit limits a sandbox's events to a rate (with a burst of two
// seconds' worth) and counts those it suppressed; the manager's mutex
// guards it.
type eventLimit struct {
	lim        *rate.Limiter
	suppressed int
}

func newEventLimit(perSecond int) eventLimit {
	return eventLimit{lim: rate.NewLimiter(rate.Limit(perSecond), 2*perSecond)}
}

// take reports whether an event at now may pass, and how many were
// suppressed before it.
func (b *eventLimit) take(now time.Time) (bool, int) {
	if !b.lim.AllowN(now, 1) {
		b.suppressed++
		return false, 0
	}
	n := b.suppressed
	b.suppressed = 0
	return true, n
}
