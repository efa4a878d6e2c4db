package network

import "fmt"

// Counters returns the bytes sandbox id has received and sent, read from
// its host-side interface (a container's veth, a vm's tap) over netlink:
// what the host side sends the sandbox receives, and the reverse. A
// sandbox without an interface has none (an error).
func (m *Manager) Counters(id string) (rx, tx int64, err error) {
	if m.nl == nil {
		return 0, 0, fmt.Errorf("network manager is closed")
	}
	l, err := m.nl.LinkByName(IfaceName(id))
	if err != nil {
		return 0, 0, fmt.Errorf("sandbox %s interface: %w", id, err)
	}
	st := l.Attrs().Statistics
	if st == nil {
		return 0, 0, fmt.Errorf("sandbox %s interface %s has no statistics", id, IfaceName(id))
	}
	return int64(st.TxBytes), int64(st.RxBytes), nil
}
