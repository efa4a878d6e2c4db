// Package egress checks the name behind every connection a sandbox opens
// to an address it reached through a domain rule, on the host, where the
// sandbox can neither see nor signal it.
//
// A domain rule opens the addresses its name resolved to; popular hosts
// share those addresses with thousands of others (CDNs, cloud front
// ends), so an address alone does not say which site a connection is
// for. The network package's prerouting rule redirects every new TCP
// connection from a sandbox to a DNS-learned address (the learn and
// learnp sets), unless a CIDR rule (or @internet) allows that address or
// a deny rule refuses it, to the sandbox's own gateway's EgressPort, where
// the daemon runs one Proxy per sandbox. The Proxy reads the original
// destination (SO_ORIGINAL_DST) and then:
//
//   - raw TCP: if a rule NAME:PORT/tcp allows a name this sandbox resolved
//     to the destination, it splices at once, reading nothing (a
//     server-first protocol sends nothing to read);
//   - TLS: it reads the ClientHello with crypto/tls's own parser (no
//     decryption), normalizes the server name (IDNA ASCII, lower case, no
//     trailing dot), and splices only if the policy allows that name on
//     the destination's port and the sandbox's own resolver resolved it to
//     the destination address (Names, fed by the resolver's answers, each
//     until its TTL); the ClientHello goes upstream as it came;
//   - plain HTTP: it parses every request with Go's HTTP parser and checks
//     the first request's Host the same way; a later request on the same
//     connection for another host is refused (a keep-alive connection
//     cannot turn to another site); a request is re-sent in normalized
//     framing; CONNECT is refused; an Upgrade (WebSocket) is spliced after
//     its request;
//   - anything else, a ClientHello without a server name, an HTTP request
//     without a Host: refused.
//
// A refusal is a TCP reset (the client fails at once) and an Event for
// the sandbox's network log with its reason. Both directions then copy
// socket to socket, which Go does with splice(2).
//
// What it refuses besides names: a ClientHello offering Encrypted Client
// Hello (its outer name is not the real one; Chrome sends one by default:
// --disable-features=EncryptedClientHello), a server name or Host that is
// not plain ASCII (what goes upstream is what was checked), a Host with
// anything around its name and numeric port (each request goes upstream
// with the Host that was checked), an Upgrade other than WebSocket as a
// connection's first request (h2c would carry any authority), HTTP
// headers over 64 KiB, and a destination that is the host itself or a
// sandbox (the proxy dials from the host). The daemon holds at most 1024
// of a sandbox's connections at once; headers get 10 s (the first) and 2
// minutes (later ones).
//
// What it cannot see: TLS is not decrypted, so a server that routes by
// the HTTP Host inside TLS rather than by the server name (domain
// fronting: some CDNs, default nginx virtual hosts) can still be asked
// for another site under an allowed server name; a connection admitted
// to a name carries what the client sends after the ClientHello (on a
// rule's other ports too: give domain rules the ports they need). UDP
// other than QUIC reaches a domain rule's addresses unchecked (there is
// no name to check). The proxy lives in the daemon: sandboxes outlive a
// daemon restart, but their connections through it (to domain rules'
// addresses) do not; clients reconnect.
package egress
