package policy

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// PortRange is an inclusive range of TCP/UDP ports, 1..65535. A single port
// has From == To.
type PortRange struct {
	From uint16 `json:"from"`
	To   uint16 `json:"to"`
}

// String returns "443" or "8000-8100".
func (r PortRange) String() string {
	if r.From == r.To {
		return strconv.Itoa(int(r.From))
	}
	return fmt.Sprintf("%d-%d", r.From, r.To)
}

// Contains reports whether port lies in r.
func (r PortRange) Contains(port uint16) bool { return port >= r.From && port <= r.To }

// PortsContain reports whether port is in ports, where nil means every port.
func PortsContain(ports []PortRange, port uint16) bool {
	if ports == nil {
		return port != 0
	}
	for _, r := range ports {
		if r.Contains(port) {
			return true
		}
	}
	return false
}

// FormatPorts returns ports as a rule writes them ("80,443,8000-8100"), or
// "" for nil (every port).
func FormatPorts(ports []PortRange) string {
	parts := make([]string, len(ports))
	for i, r := range ports {
		parts[i] = r.String()
	}
	return strings.Join(parts, ",")
}

// parsePorts parses a comma-separated list of ports and ranges into a
// normalized set (see normalizePorts).
func parsePorts(s string) ([]PortRange, error) {
	if s == "" {
		return nil, fmt.Errorf("empty port list after ':' (write e.g. :443 or :80,443 or :8000-8100, or leave out the ':' for every port)")
	}
	var out []PortRange
	for item := range strings.SplitSeq(s, ",") {
		lo, hi, isRange := strings.Cut(item, "-")
		from, err := parsePort(lo)
		if err != nil {
			return nil, err
		}
		to := from
		if isRange {
			if to, err = parsePort(hi); err != nil {
				return nil, err
			}
			if to < from {
				return nil, fmt.Errorf("port range %q is reversed (write %d-%d)", item, to, from)
			}
		}
		out = append(out, PortRange{From: from, To: to})
	}
	return normalizePorts(out), nil
}

func parsePort(s string) (uint16, error) {
	if s == "" {
		return 0, fmt.Errorf("empty port in port list")
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("port %q is not a number", s)
		}
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 65535 {
		return 0, fmt.Errorf("port %s out of range 1-65535", s)
	}
	return uint16(n), nil
}

// normalizePorts sorts and merges overlapping and adjacent ranges. A set that
// covers every port, and an empty set, become nil (every port).
func normalizePorts(in []PortRange) []PortRange {
	if len(in) == 0 {
		return nil
	}
	rs := slices.Clone(in)
	slices.SortFunc(rs, func(a, b PortRange) int { return int(a.From) - int(b.From) })
	out := rs[:1]
	for _, r := range rs[1:] {
		last := &out[len(out)-1]
		if int(r.From) <= int(last.To)+1 {
			last.To = max(last.To, r.To)
			continue
		}
		out = append(out, r)
	}
	if len(out) == 1 && out[0].From <= 1 && out[0].To == 65535 {
		return nil
	}
	return out
}

// unionPorts returns a ∪ b, where nil means every port.
func unionPorts(a, b []PortRange) []PortRange {
	if a == nil || b == nil {
		return nil
	}
	return normalizePorts(append(slices.Clone(a), b...))
}

// subtractPorts returns a − b, where nil means every port. The result is
// empty (non-nil, length 0) when nothing is left.
func subtractPorts(a, b []PortRange) []PortRange {
	if b == nil {
		return []PortRange{}
	}
	if a == nil {
		a = []PortRange{{From: 1, To: 65535}}
	}
	b = normalizePorts(b)
	out := []PortRange{}
	for _, r := range a {
		from := int(r.From)
		for _, d := range b {
			if int(d.To) < from || int(d.From) > int(r.To) {
				continue
			}
			if int(d.From) > from {
				out = append(out, PortRange{From: uint16(from), To: d.From - 1})
			}
			from = int(d.To) + 1
		}
		if from <= int(r.To) {
			out = append(out, PortRange{From: uint16(from), To: r.To})
		}
	}
	if len(out) == 0 {
		return out
	}
	return normalizePorts(out)
}
