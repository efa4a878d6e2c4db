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
//     create (/sandboxes and /v2/sandboxes; timeout -> TTL, metadata ->
//     labels, envVars -> env, autoPause -> on-expire pause, network
//     allow/deny -> the egress policy), connect (resumes a paused
//     sandbox: 201, else 200; extends the lifetime, never shortens it),
//     list (metadata and state filters, pages with X-Next-Token), get,
//     kill, timeout, pause (409 when paused already), metrics (none yet),
//     templates. X-API-Key is a nook token; errors are E2B's
//     {"code","message"} with the status codes the SDKs branch on.
//   - sandbox traffic, which names its sandbox by E2b-Sandbox-Id (and
//     E2b-Sandbox-Port, envd's 49983) and carries the sandbox's access
//     token (X-Access-Token, an HMAC of the sandbox's ID under the key in
//     DATA-DIR/e2b.key): envd's Process and Filesystem services
//     (Connect RPC, JSON or binary, over HTTP/1.1: connectrpc.com/connect
//     with code generated from envd's protos, proto/ and envdpb/,
//     scripts/proto.sh), its /files upload and download, and /health.
//     A sandbox that is gone or not running answers 502 without being
//     woken (the SDKs' isRunning); a stream whose sandbox goes away is
//     aborted, not ended.
//
// Processes (process.go) are nook background processes: they run on when
// a stream ends, their output is kept by the agent, and a start streams
// it through an attach (start event, data, end event; keepalives at the
// interval the client asks for). envd's process lifetime is the start
// call's Connect-Timeout-Ms, as upstream. Input, resize and close-stdin
// go through an attach with input that the edge keeps per process.
package e2b
