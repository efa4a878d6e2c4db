package preview

import (
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/nookhq/nook/internal/errdefs"
)

// maxName is the longest sandbox name (core's rule: 1-63 lowercase
// letters, digits and '-', starting and ending with a letter or digit).
const maxName = 63

// Route reads a Host header, PORT-NAME.DOMAIN[:listen-port], into the
// sandbox name and port it names. Only host names directly under domain
// route (ASCII case-insensitive, a trailing dot allowed); PORT is the
// digits before the first '-' (1-65535, no leading zero) and NAME a valid
// sandbox name, returned in lower case. Anything else is not ok.
func Route(host, domain string) (name string, port int, ok bool) {
	domain = normDomain(domain)
	if !validDomain(domain) {
		return "", 0, false
	}
	if i := strings.LastIndexByte(host, ':'); i >= 0 {
		host = host[:i] // the listener's port: ignored
	}
	host = strings.TrimSuffix(host, ".")
	label, rest, dotted := strings.Cut(host, ".")
	if !dotted || !asciiEqualFold(rest, domain) {
		return "", 0, false
	}
	p, n, dashed := strings.Cut(label, "-")
	if !dashed {
		return "", 0, false
	}
	port = parsePort(p)
	if port == 0 || !validName(n) {
		return "", 0, false
	}
	return strings.ToLower(n), port, true
}

// parsePort reads a decimal TCP port without sign or leading zero; 0
// when s is not one.
func parsePort(s string) int {
	if len(s) == 0 || len(s) > 5 || s[0] == '0' {
		return 0
	}
	n := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0
		}
		n = n*10 + int(c-'0')
	}
	if n > 65535 {
		return 0
	}
	return n
}

// validName tells whether s is a sandbox name, ignoring ASCII case.
func validName(s string) bool {
	if len(s) == 0 || len(s) > maxName || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// CheckDomain tells whether domain can be the preview domain: a DNS
// name (letters, digits, '-' and '_' in dot-separated labels; a port and
// a trailing dot are ignored), such as "localhost" or
// "preview.example.com".
func CheckDomain(domain string) error {
	if !validDomain(normDomain(domain)) {
		return errdefs.Invalid("preview domain %q is not a DNS name such as localhost or preview.example.com", domain)
	}
	return nil
}

// validDomain tells whether a normalized domain is a DNS name.
func validDomain(d string) bool {
	if d == "" || len(d) > 253 {
		return false
	}
	for label := range strings.SplitSeq(d, ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// normDomain is domain in lower case without a trailing dot or a port.
func normDomain(domain string) string {
	if h, _, err := net.SplitHostPort(domain); err == nil {
		domain = h
	}
	return strings.ToLower(strings.TrimSuffix(domain, "."))
}

// asciiEqualFold is strings.EqualFold for ASCII only: no Unicode folding
// (the Kelvin sign is not a 'k' in a host name).
func asciiEqualFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// URL is the preview URL of name's port:
// scheme://PORT-NAME.domain[:listenPort]/, the port left out when it is 0
// or the scheme's default, with ?nook_token=TOKEN when token != "".
func URL(scheme, domain string, listenPort int, name string, port int, token string) string {
	host := strconv.Itoa(port) + "-" + name + "." + normDomain(domain)
	if listenPort > 0 && !(scheme == "http" && listenPort == 80) && !(scheme == "https" && listenPort == 443) {
		host = net.JoinHostPort(host, strconv.Itoa(listenPort))
	}
	u := scheme + "://" + host + "/"
	if token != "" {
		u += "?" + QueryParam + "=" + url.QueryEscape(token)
	}
	return u
}

// queryValues returns the values of the query parameter key in a raw
// query (at most limit of them), as url.ParseQuery would read them.
func queryValues(raw, key string, limit int) []string {
	var vals []string
	for raw != "" && len(vals) < limit {
		var part string
		part, raw, _ = strings.Cut(raw, "&")
		k, v, _ := strings.Cut(part, "=")
		if queryKey(k) != key {
			continue
		}
		if u, err := url.QueryUnescape(v); err == nil {
			vals = append(vals, u)
		}
	}
	return vals
}

// stripQuery removes every key parameter from a raw query, leaving the
// others exactly as they were.
func stripQuery(raw, key string) string {
	if !strings.Contains(raw, key) && !strings.Contains(raw, "%") {
		return raw // fast path: key cannot be in there
	}
	var b strings.Builder
	for rest := raw; rest != ""; {
		var part string
		part, rest, _ = strings.Cut(rest, "&")
		k, _, _ := strings.Cut(part, "=")
		if queryKey(k) == key {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('&')
		}
		b.WriteString(part)
	}
	return b.String()
}

// queryKey is a raw query key unescaped (as is when it cannot be).
func queryKey(k string) string {
	if !strings.ContainsAny(k, "%+") {
		return k
	}
	if u, err := url.QueryUnescape(k); err == nil {
		return u
	}
	return k
}

// stripCookie removes the cookie called name from h's Cookie headers,
// leaving the others (the app's) as they were; the headers become one.
func stripCookie(h http.Header, name string) {
	lines := h["Cookie"]
	if len(lines) == 0 {
		return
	}
	found := false
	for _, l := range lines {
		if strings.Contains(l, name) {
			found = true
			break
		}
	}
	if !found {
		return
	}
	var b strings.Builder
	for _, l := range lines {
		for part := range strings.SplitSeq(l, ";") {
			part = strings.TrimSpace(part)
			if part == "" {
				continue
			}
			k, _, _ := strings.Cut(part, "=")
			if strings.TrimSpace(k) == name {
				continue
			}
			if b.Len() > 0 {
				b.WriteString("; ")
			}
			b.WriteString(part)
		}
	}
	if b.Len() == 0 {
		h.Del("Cookie")
		return
	}
	h["Cookie"] = []string{b.String()}
}
