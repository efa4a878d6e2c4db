package preview

import (
	"net/http"
	"strings"
)

// hostCookieName is the cookie's name over TLS. Browsers take a cookie
// named __Host-… only when it is Secure, has Path=/ and no Domain, so
// only the preview's own host can set it: a sibling preview (another
// sandbox's app under the same DOMAIN) can neither plant one nor crowd
// ours out with look-alikes set for the whole domain.
const hostCookieName = "__Host-" + CookieName

// cookieName is the only name nook reads and writes its cookie under on
// r's connection: the __Host- one over TLS, the plain one over HTTP
// (where browsers refuse __Host- cookies).
func cookieName(r *http.Request) string {
	if r.TLS != nil {
		return hostCookieName
	}
	return CookieName
}

// isNookCookie tells whether a cookie name is one of nook's, ignoring
// ASCII case (browsers match the __Host- prefix case-insensitively).
func isNookCookie(name string) bool {
	return asciiEqualFold(name, CookieName) || asciiEqualFold(name, hostCookieName)
}

// sanitizeSetCookies rewrites the Set-Cookie headers of an answer from
// a sandbox (untrusted): each loses its Domain attributes, so the app
// sets cookies for its own host only, not for sibling previews or the
// parent domain; and a cookie under one of nook's names is dropped, so
// the app cannot replace or shadow nook's credential.
func sanitizeSetCookies(h http.Header) {
	lines := h["Set-Cookie"]
	if len(lines) == 0 {
		return
	}
	kept := lines[:0]
	for _, l := range lines {
		if l, ok := sanitizeSetCookie(l); ok {
			kept = append(kept, l)
		}
	}
	if len(kept) == 0 {
		delete(h, "Set-Cookie")
		return
	}
	h["Set-Cookie"] = kept
}

// sanitizeSetCookie is one Set-Cookie line without its Domain
// attributes; not ok when it sets one of nook's cookies.
//
// It is read as browsers read it (RFC 6265bis 5.6): attributes are
// split on ';', their names trimmed and compared ignoring case. Only the
// Domain attributes are cut; the rest passes byte for byte.
func sanitizeSetCookie(line string) (string, bool) {
	pair, attrs, _ := strings.Cut(line, ";")
	if isNookCookie(cookieSentName(pair)) {
		return "", false
	}
	if !containsFold(attrs, "domain") {
		return line, true // fast path: no Domain attribute in there
	}
	var b strings.Builder
	b.Grow(len(line))
	b.WriteString(pair)
	for attr := range strings.SplitSeq(attrs, ";") {
		k, _, _ := strings.Cut(attr, "=")
		if asciiEqualFold(strings.TrimSpace(k), "domain") {
			continue
		}
		b.WriteByte(';')
		b.WriteString(attr)
	}
	return b.String(), true
}

// cookieSentName is the name a server reads in the Cookie header for the
// cookie a Set-Cookie name-value pair sets. A cookie without a name ("v"
// or "=v") is sent as its bare value, which reads as a name: "=nook_preview=x"
// would come back as nook_preview=x.
func cookieSentName(pair string) string {
	name, value, ok := strings.Cut(pair, "=")
	if !ok {
		name, value = "", name
	}
	if name = strings.TrimSpace(name); name != "" {
		return name
	}
	name, _, _ = strings.Cut(value, "=")
	return strings.TrimSpace(name)
}

// containsFold tells whether s contains the lower-case ASCII substr,
// ignoring ASCII case.
func containsFold(s, substr string) bool {
	for i := 0; i+len(substr) <= len(s); i++ {
		if asciiEqualFold(s[i:i+len(substr)], substr) {
			return true
		}
	}
	return false
}

// isUpgrade tells whether r asks to switch protocols: a WebSocket (or
// another upgrade) over HTTP/1.1, or an extended CONNECT (RFC 8441, a
// WebSocket over HTTP/2).
func isUpgrade(r *http.Request) bool {
	return r.Header.Get("Upgrade") != "" || r.Header.Get(":protocol") != ""
}

// Why a request carrying only the cookie may come from another site's
// page: the answer to foreignCookieUse.
const msgForeignCookie = "this preview does not take its cookie on requests made by other sites' pages (such as other sandboxes' previews): " +
	"open its URL in the address bar or follow a link to it, or send the token in the " + HeaderName + " header"

// foreignCookieUse tells whether r, authorized by nook's cookie alone,
// may have been made by another site's page, which must not ride on it.
//
// Under a custom DOMAIN that is not a public suffix, sibling previews
// (other sandboxes' apps) are the same site as this one, so SameSite=Lax
// does not keep the cookie off their requests: without this, their
// scripts could POST to this preview with it, or open a WebSocket to it
// (WebSockets are not bound by CORS) and read the answers. What is let
// through:
//
//   - a WebSocket only with an Origin header naming this very origin
//     (browsers always send it on WebSockets);
//   - with fetch metadata (Sec-Fetch-Site: modern browsers), a request
//     from this origin or typed by the user, and from elsewhere only a
//     top-level GET or HEAD navigation (a link): no subresource, fetch,
//     form POST or frame;
//   - without it (curl, older browsers), anything unless an Origin header
//     names another origin on a method other than GET and HEAD.
func foreignCookieUse(r *http.Request) bool {
	origins := r.Header.Values("Origin")
	sameOrigin := len(origins) == 1 && asciiEqualFold(origins[0], ownOrigin(r))
	if isUpgrade(r) && !sameOrigin {
		return true
	}
	safe := r.Method == http.MethodGet || r.Method == http.MethodHead
	site := r.Header.Values("Sec-Fetch-Site")
	switch {
	case len(site) == 0:
		return len(origins) > 0 && !sameOrigin && !safe
	case len(site) == 1 && (site[0] == "same-origin" || site[0] == "none"):
		return false
	}
	// "same-site", "cross-site", or anything no browser sends.
	dest := r.Header.Values("Sec-Fetch-Dest")
	topLevel := r.Header.Get("Sec-Fetch-Mode") == "navigate" && safe &&
		(len(dest) == 0 || len(dest) == 1 && dest[0] == "document")
	return !topLevel
}

// ownOrigin is r's origin as the browser that sent it sees it:
// scheme://Host, Host as sent (with the listener's port unless it is
// the scheme's default, as browsers write both).
func ownOrigin(r *http.Request) string {
	if r.TLS != nil {
		return "https://" + r.Host
	}
	return "http://" + r.Host
}
