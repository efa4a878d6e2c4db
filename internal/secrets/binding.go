package secrets

import (
	"fmt"
	"net/http"
	"net/textproto"
	"regexp"
	"slices"
	"strings"

	"golang.org/x/net/publicsuffix"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/network/policy"
)

// Binding binds a secret to the hosts it may be sent to, and says where
// in a request it goes.
type Binding struct {
	Secret string `json:"secret"`
	// Hosts are exact names or "*.suffix" (any name below suffix),
	// normalized (lower case, no trailing dot).
	Hosts []string `json:"hosts"`
	// Header is the request header the placeholder is replaced in
	// (canonical form; default Authorization, where a Basic credential's
	// user and password are replaced too).
	Header string `json:"header"`
	// Format, with {} where the value goes, replaces the whole header
	// when it holds the placeholder ("": the placeholder is replaced in
	// place).
	Format string `json:"format,omitempty"`
	// Path is a path prefix requests must have ("": any path).
	Path string `json:"path,omitempty"`
	// Methods are the methods it is sent with (none: any).
	Methods []string `json:"methods,omitempty"`
	// Query and Body: the placeholder is replaced in the query string,
	// and in the request body, too (else a placeholder in the query is
	// refused, and one in the body goes as it is).
	Query bool `json:"query,omitempty"`
	Body  bool `json:"body,omitempty"`
	// Inherit: forks get the binding (with a new placeholder).
	Inherit bool `json:"inherit,omitempty"`
}

var nameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)

// reservedNames are variables a secret's placeholder must not replace:
// the CA bundle's, and what the sandbox's processes and nook need.
var reservedNames = append(slices.Clone(api.SecretCAEnv), "PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "HOSTNAME", "PWD", "LANG", "TZ", "TMPDIR")

// CheckName checks a secret's name: it is also the name of the
// environment variable that holds its placeholder.
func CheckName(name string) error {
	if !nameRE.MatchString(name) {
		return errdefs.Invalid("secret name %q: use letters, digits and _ (not first), at most 64 (it names the sandbox's environment variable)", name)
	}
	up := strings.ToUpper(name)
	if slices.Contains(reservedNames, up) || strings.HasPrefix(up, "NOOK_") || strings.HasPrefix(up, "LD_") {
		return errdefs.Invalid("secret name %q: the sandbox needs that variable for itself; pick another name", name)
	}
	return nil
}

// ParseBinding parses NAME@HOST[,HOST...][:OPTION...], the form of
// nook create --secret. Options: header=NAME, format=TEXT (with {}),
// path=/PREFIX, methods=GET,POST, query, body, inherit. Option values
// cannot hold ':'.
func ParseBinding(s string) (Binding, error) {
	bad := func(format string, args ...any) (Binding, error) {
		return Binding{}, errdefs.Invalid("secret binding %q: %s (the form is NAME@HOST[,HOST...][:header=H][:format='Bearer {}'][:path=/p][:methods=GET,POST][:query][:body][:inherit])", s, fmt.Sprintf(format, args...))
	}
	name, rest, ok := strings.Cut(s, "@")
	if !ok {
		return bad("no @HOST")
	}
	if err := CheckName(name); err != nil {
		return Binding{}, err
	}
	parts := strings.Split(rest, ":")
	b := Binding{Secret: name, Header: "Authorization"}
	for _, h := range strings.Split(parts[0], ",") {
		n, err := normalizeHost(h)
		if err != nil {
			return bad("host %q: %v", h, err)
		}
		if !slices.Contains(b.Hosts, n) {
			b.Hosts = append(b.Hosts, n)
		}
	}
	seen := map[string]bool{}
	for _, opt := range parts[1:] {
		k, v, hasV := strings.Cut(opt, "=")
		if seen[k] {
			return bad("option %s given twice", k)
		}
		seen[k] = true
		switch k {
		case "header":
			if !hasV || !validHeaderName(v) {
				return bad("header=%q is not a header name", v)
			}
			b.Header = textproto.CanonicalMIMEHeaderKey(v)
			if isHopHeader(b.Header) {
				return bad("header %s does not reach the host", b.Header)
			}
		case "format":
			v = strings.Trim(v, `'"`)
			if !hasV || strings.Count(v, "{}") != 1 || strings.ContainsAny(v, "\r\n\x00") {
				return bad("format=%q must hold {} once, where the value goes", v)
			}
			b.Format = v
		case "path":
			if !hasV || !strings.HasPrefix(v, "/") || strings.ContainsAny(v, "?# \t\r\n") {
				return bad("path=%q must be a path starting with /", v)
			}
			b.Path = v
		case "methods":
			if !hasV || v == "" {
				return bad("methods= needs methods")
			}
			for _, m := range strings.Split(v, ",") {
				m = strings.ToUpper(m)
				if !validToken(m) {
					return bad("method %q", m)
				}
				b.Methods = append(b.Methods, m)
			}
		case "query", "body", "inherit":
			if hasV {
				return bad("option %s takes no value", k)
			}
			switch k {
			case "query":
				b.Query = true
			case "body":
				b.Body = true
			case "inherit":
				b.Inherit = true
			}
		default:
			return bad("unknown option %q", k)
		}
	}
	return b, nil
}

// String is the binding as ParseBinding reads it.
func (b Binding) String() string {
	s := b.Secret + "@" + strings.Join(b.Hosts, ",")
	if b.Header != "Authorization" {
		s += ":header=" + b.Header
	}
	if b.Format != "" {
		s += ":format=" + b.Format
	}
	if b.Path != "" {
		s += ":path=" + b.Path
	}
	if len(b.Methods) > 0 {
		s += ":methods=" + strings.Join(b.Methods, ",")
	}
	for _, f := range []struct {
		on   bool
		name string
	}{{b.Query, "query"}, {b.Body, "body"}, {b.Inherit, "inherit"}} {
		if f.on {
			s += ":" + f.name
		}
	}
	return s
}

// normalizeHost checks a binding's host: a DNS name, or *.suffix.
func normalizeHost(h string) (string, error) {
	wild := strings.HasPrefix(h, "*.")
	n := policy.NormalizeName(strings.TrimPrefix(h, "*."))
	if n == "" || len(n) > 253 {
		return "", fmt.Errorf("empty or too long")
	}
	for _, label := range strings.Split(n, ".") {
		if label == "" || len(label) > 63 {
			return "", fmt.Errorf("not a DNS name")
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return "", fmt.Errorf("not a DNS name (plain ASCII letters, digits, - and _; IDNA names in their xn-- form)")
			}
		}
	}
	if wild {
		// Not every name below a public suffix: *.github.io or
		// *.amazonaws.com would send the secret to anyone's site there.
		if ps, _ := publicsuffix.PublicSuffix(n); !strings.Contains(n, ".") || ps == n {
			return "", fmt.Errorf("*.%s is too wide: %s is a public suffix (anyone can have a name below it); name the host, or a domain of your own", n, n)
		}
		return "*." + n, nil
	}
	return n, nil
}

// MatchesHost reports whether name (normalized) is one of the binding's
// hosts.
func (b Binding) MatchesHost(name string) bool {
	for _, h := range b.Hosts {
		if suffix, ok := strings.CutPrefix(h, "*."); ok {
			if strings.HasSuffix(name, "."+suffix) {
				return true
			}
		} else if h == name {
			return true
		}
	}
	return false
}

// matchesRequest reports whether the binding applies to r (its host
// matched). A binding narrowed to methods does not apply to a request
// that asks the server to take it as another (X-HTTP-Method-Override);
// one narrowed to a path does not apply to a path a server could read
// as another (dot segments, encoded slashes, backslashes, dots or
// semicolons).
func (b Binding) matchesRequest(r *http.Request) bool {
	if len(b.Methods) > 0 {
		if !slices.Contains(b.Methods, r.Method) {
			return false
		}
		for _, h := range []string{"X-Http-Method-Override", "X-Http-Method", "X-Method-Override"} {
			if _, ok := r.Header[h]; ok {
				return false
			}
		}
	}
	if b.Path == "" {
		return true
	}
	raw := r.URL.EscapedPath()
	if !plainPath(raw) {
		return false
	}
	p := strings.TrimSuffix(b.Path, "/")
	return raw == p || strings.HasPrefix(raw, p+"/") || p == ""
}

// plainPath reports whether every server reads a request path the same:
// absolute, no dot segments, nothing encoded that could turn into a
// separator or a dot, no backslash or semicolon.
func plainPath(raw string) bool {
	if !strings.HasPrefix(raw, "/") || strings.ContainsAny(raw, "\\;") {
		return false
	}
	low := strings.ToLower(raw)
	for _, enc := range []string{"%2e", "%2f", "%5c", "%3b", "%00", "%25"} {
		if strings.Contains(low, enc) {
			return false
		}
	}
	for _, seg := range strings.Split(raw, "/") {
		if seg == "." || seg == ".." {
			return false
		}
	}
	return true
}

func validHeaderName(v string) bool { return v != "" && validToken(v) }

func validToken(v string) bool {
	if v == "" {
		return false
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

func isHopHeader(h string) bool {
	switch h {
	case "Connection", "Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade", "Host":
		return true
	}
	return false
}
