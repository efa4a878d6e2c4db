package api

import "time"

// Network modes.
const (
	NetAllowlist = "allowlist"
	NetNone      = "none"
)

// Network is a sandbox's network: its address and its egress policy.
//
// Rules, as users write them: a domain ("github.com"), a wildcard for every
// subdomain ("*.pythonhosted.org"), an IPv4 address or CIDR
// ("192.0.2.0/24"), each optionally with ports ("example.com:443",
// "10.1.2.0/24:80,8000-8100"), or a preset ("@registries": GitHub, Debian,
// PyPI, npm, the Go proxy, crates.io; "@internet": every public address).
// A sandbox reaches a domain's addresses only after resolving the domain
// through nook's resolver (the gateway). The host, other sandboxes,
// link-local and metadata addresses are always blocked, and private
// ranges unless a CIDR rule names them.
type Network struct {
	Mode  string   `json:"mode"` // allowlist or none
	Allow []string `json:"allow,omitempty"`
	Deny  []string `json:"deny,omitempty"`
	// Address is the sandbox's IPv4 address with its prefix, e.g.
	// 10.89.0.2/30; Gateway is the host's end, where the sandbox's DNS
	// resolver listens.
	Address string        `json:"address,omitempty"`
	Gateway string        `json:"gateway,omitempty"`
	Exposed []ExposedPort `json:"exposed,omitempty"`
}

// SetNetworkRequest is the body of PUT /v1/sandboxes/{name}/network: the
// whole new policy, which replaces the old one at once.
type SetNetworkRequest struct {
	Net   string   `json:"net,omitempty"` // allowlist (default) or none
	Allow []string `json:"allow,omitempty"`
	Deny  []string `json:"deny,omitempty"`
}

// ExposeRequest is the body of POST /v1/sandboxes/{name}/expose.
type ExposeRequest struct {
	Port int `json:"port"` // the sandbox's TCP port
	// Auth is who may open its preview URL: "token" (the default: the
	// URL's token, kept in a cookie) or "none" (anyone who reaches the
	// preview listener).
	Auth string `json:"auth,omitempty"`
}

// Preview URL access (ExposeRequest.Auth).
const (
	PreviewAuthToken = "token"
	PreviewAuthNone  = "none"
)

// ExposedPort is a sandbox port reachable from the host.
type ExposedPort struct {
	Port        int    `json:"port"`         // in the sandbox
	HostAddress string `json:"host_address"` // host:port where the host reaches it
	// Public says its preview URL needs no token (exposed with auth none).
	Public bool `json:"public,omitempty"`
	// URL is its preview URL (nook serve --preview-listen), with a token
	// that opens it unless Public (24 hours; expose it again for another).
	URL string `json:"url,omitempty"`
}

// Net log entry kinds.
const (
	NetLogConnection = "connection" // a denied packet (the first of a connection)
	NetLogDNS        = "dns"        // a refused DNS query or a dropped answer
)

// NetLogEntry is one thing a sandbox was denied.
type NetLogEntry struct {
	Time time.Time `json:"time"`
	Kind string    `json:"kind"` // connection or dns
	// Destination is "203.0.113.10:443/tcp" for a connection, the name and
	// query type ("evil.example A") for DNS.
	Destination string `json:"destination"`
	// Reason is why, e.g. policy, blocked, host, sandbox, private, dns,
	// denied (a connection); not-allowed, tunnel, rate-limit, zone-budget,
	// rebinding, malformed (DNS).
	Reason string `json:"reason"`
	Detail string `json:"detail,omitempty"`
	// Suppressed counts earlier events not logged (rate limit).
	Suppressed int `json:"suppressed,omitempty"`
}

// NetLog is the body of GET /v1/sandboxes/{name}/network/log: the newest
// entries, oldest first (a sandbox keeps its last 1000).
type NetLog struct {
	Entries []NetLogEntry `json:"entries"`
}
