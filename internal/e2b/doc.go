// Package e2b is nook's drop-in for E2B's SDKs: a program written for
// E2B (the `e2b` npm or Python package) runs on nook with E2B_API_URL and
// E2B_SANDBOX_URL set to `nook serve --e2b-listen`'s address and
// E2B_API_KEY to a nook token (`nook token create --e2b`). It is a
// translation at the edge over the daemon's Manager and each sandbox's
// agent, not a second implementation of sandboxes: an E2B sandbox is a
// nook sandbox whose name is its E2B ID.
//
// One listener serves both halves of E2B's protocol (Server.ServeHTTP):
//
//   - the control API (control.go, e2b-dev/infra's spec/openapi.yml):
//     create (/sandboxes and /v2/sandboxes; templateID base -> nook's e2b
//     recipe, timeout -> TTL, metadata -> labels, envVars -> env,
//     autoPause -> on-expire pause, allow_internet_access and
//     network.allowOut/denyOut -> the egress policy, @internet by
//     default as in E2B, network.allowPublicTraffic -> whether its ports
//     need a traffic token, metadata nook.isolation -> container or vm),
//     connect (resumes a paused sandbox: 201, else 200; lengthens the
//     lifetime to the timeout, never shortens it), list (metadata and
//     state filters, order, pages with X-Next-Token), get, kill, timeout,
//     refreshes, pause (409 when paused already), metrics (one sample:
//     CPU share since the last, memory, from the sandbox's cgroup),
//     snapshots (an E2B snapshot is a template, SANDBOX:SNAPSHOT, that a
//     create forks from; list, delete), fork, network (the egress policy
//     replaced; an admin's key only), templates and template aliases
//     (Template.exists). X-API-Key is a
//     nook token, its scope enforced: admin everything; read-only looks,
//     and never gets an access token; sandbox:NAME its own sandbox, and
//     never lengthens its life. Errors are E2B's {"code","message"} with
//     the status codes the SDKs branch on (401, 404, 409, 429).
//   - sandbox traffic, which names its sandbox by E2b-Sandbox-Id and
//     E2b-Sandbox-Port, or by a host name PORT-ID.DOMAIN under the edge's
//     own domain (the SDKs' getHost). Port 49983 is envd's API, answered
//     by the edge itself (envd.go): the Process and Filesystem services
//     (Connect RPC, JSON or binary, over HTTP/1.1: connectrpc.com/connect
//     with code generated from envd's protos, proto/ and envdpb/,
//     scripts/proto.sh), /files (multipart and octet-stream, gzip, and
//     the SDKs' signed URLs: the signature finds the sandbox) and
//     /health. Every call carries the sandbox's access token
//     (X-Access-Token: an HMAC of the sandbox's ID under the key in
//     DATA-DIR/e2b.key, so it lives as long as the sandbox); without it
//     /health answers as for no sandbox. A sandbox that is gone or not
//     running answers 502 and is not woken (only connect wakes one); a
//     stream whose sandbox goes away is aborted, not ended. Any other
//     port is proxied to the sandbox's loopback through its agent (the
//     agent's dial op: HTTP, WebSockets, server-sent events), for anyone
//     if the sandbox's traffic is public (E2B creates, by default), else
//     with its E2b-Traffic-Access-Token.
//
// Processes (process.go) are nook background processes started and
// followed on one agent stream (Manager.ExecFollow): they run on when a
// stream ends, their output is kept by the agent, and connect attaches
// again. envd's process lifetime is the start call's Connect-Timeout-Ms,
// as upstream. Input, resize and close-stdin go through an attach with
// input the edge keeps per process. Commands run, and files are written
// and made, as the request's user (HTTP basic auth's name, or /files'
// username), else the template's default user (E2B's base: user), and
// relative paths are read in that user's home. Owners are named as the
// sandbox's /etc/passwd and /etc/group name them (names.go).
//
// Files carry their user.* extended attributes as metadata (an upload's
// X-Metadata-KEY headers set them, keys in lower case).
//
// Not served yet: metrics history, template builds, volumes and
// secrets of E2B's API, E2B's egress proxy and per-domain rules, range
// requests on /files, autoResume, and the Python SDK's own test (no
// PyPI here: its calls are the JS SDK's, which the suite drives).
package e2b
