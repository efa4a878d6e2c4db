package e2e

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/nookhq/nook/internal/network/nettest"
)

// previewApp is a web app for the sandbox (Python's standard library
// only): it echoes what it was sent (path, Host, Cookie and nook's
// header), streams server-sent events (the second only once /tmp/go
// exists), and echoes one WebSocket message.
const previewApp = `
import base64, hashlib, http.server, os, struct, time
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_GET(self):
        if self.path.startswith("/sse"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            self.wfile.write(b"data: one\n\n"); self.wfile.flush()
            for _ in range(1200):
                if os.path.exists("/tmp/go"): break
                time.sleep(0.05)
            self.wfile.write(b"data: two\n\n"); self.wfile.flush()
            self.close_connection = True
            return
        if self.headers.get("Upgrade", "").lower() == "websocket":
            acc = base64.b64encode(hashlib.sha1((self.headers["Sec-WebSocket-Key"] + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
            self.send_response(101)
            self.send_header("Upgrade", "websocket"); self.send_header("Connection", "Upgrade")
            self.send_header("Sec-WebSocket-Accept", acc)
            self.end_headers()
            r = self.rfile
            b0, b1 = r.read(2)
            n = b1 & 127
            if n == 126: n = struct.unpack(">H", r.read(2))[0]
            mask = r.read(4)
            data = bytes(c ^ mask[i % 4] for i, c in enumerate(r.read(n)))
            out = b"echo:" + data
            self.wfile.write(bytes([0x81, len(out)]) + out); self.wfile.flush()
            self.close_connection = True
            return
        body = ("path=%s host=%s cookie=%s header=%s" % (self.path, self.headers.get("Host"), self.headers.get("Cookie"), self.headers.get("Nook-Preview-Token"))).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
http.server.ThreadingHTTPServer(("0.0.0.0", 8000), H).serve_forever()
`

// TestPreview opens sandboxes' web apps at their preview URLs with curl
// and a WebSocket client, as a browser would: routing by host name, the
// token and its cookie, streams, and what must be refused.
func TestPreview(t *testing.T) {
	w := newWorld(t)
	const listen = "127.0.0.1:8080" // in the simulated host's namespace
	d := newDaemonIn(t, w.hostPath(), netDaemonArgs("--preview-listen", listen)...)
	d.must("create", "--name", "web")
	d.must("create", "--name", "web2")
	d.must("exec", "-d", "web", "--", "python3", "-c", previewApp)
	waitFor(t, "the sandbox's web app", func() bool { return d.sh("web", "curl -s -o /dev/null http://127.0.0.1:8000/").code == 0 })

	out := strings.Split(strings.TrimSpace(d.must("expose", "web", "8000")), "\n")
	if len(out) != 2 || !strings.HasPrefix(out[1], "http://8000-web.localhost:8080/?nook_token=") {
		t.Fatalf("expose printed %q, want the host address and the preview URL", out)
	}
	hostAddr, url := out[0], out[1]
	token := strings.TrimPrefix(url, "http://8000-web.localhost:8080/?nook_token=")
	base := "http://8000-web.localhost:8080"

	// curl in the simulated host, the preview names resolved to its
	// listener as *.localhost resolves on any host.
	curlRun := func(args ...string) (string, error) {
		a := append([]string{"--net=" + w.hostPath(), "curl", "-sS", "--max-time", "30", "--resolve", "*:8080:127.0.0.1", "-w", "\n%{http_code}"}, args...)
		b, err := exec.Command("nsenter", a...).CombinedOutput()
		return string(b), err
	}
	curl := func(args ...string) string {
		t.Helper()
		out, err := curlRun(args...)
		if err != nil {
			t.Fatalf("curl %v: %v\n%s", args, err, out)
		}
		return out
	}
	status := func(out string) string { return out[strings.LastIndex(out, "\n")+1:] }

	// Without the token: refused, saying how to get one.
	if got := curl(base + "/"); status(got) != "401" || !strings.Contains(got, "nook expose") {
		t.Fatalf("no token: %s", got)
	}
	// The URL's token: a redirect that sets the cookie, then the app,
	// which sees neither the token nor nook's cookie, but its own.
	if got := curl("-o", "/dev/null", "-D", "-", url); status(got) != "303" || !strings.Contains(got, "nook_preview=") || !strings.Contains(got, "HttpOnly") {
		t.Fatalf("the URL's first visit: %s", got)
	}
	jar := t.TempDir() + "/jar"
	got := curl("-L", "-c", jar, "-b", jar, url)
	if status(got) != "200" || !strings.Contains(got, "path=/ host=8000-web.localhost:8080 cookie=None header=None") {
		t.Fatalf("through the token's redirect: %s", got)
	}
	if got := curl("-b", jar, "-b", "app=1", base+"/x?y=2"); status(got) != "200" || !strings.Contains(got, "path=/x?y=2") || !strings.Contains(got, "cookie=app=1 ") {
		t.Fatalf("the cookie, beside the app's: %s", got)
	}
	if got := curl("-H", "Nook-Preview-Token: "+token, base+"/"); status(got) != "200" || !strings.Contains(got, "header=None") {
		t.Fatalf("the header: %s", got)
	}
	// The token is for its sandbox and port only; names that route to no
	// exposed port all answer alike.
	d.must("expose", "web2", "8000")
	if got := curl("-H", "Nook-Preview-Token: "+token, "http://8000-web2.localhost:8080/"); status(got) != "401" {
		t.Fatalf("web's token on web2: %s", got)
	}
	notExposed := curl("-H", "Nook-Preview-Token: "+token, "http://9000-web.localhost:8080/")
	unknown := curl("-H", "Nook-Preview-Token: "+token, "http://8000-nosuch.localhost:8080/")
	if status(notExposed) != "404" || notExposed != unknown {
		t.Fatalf("a port not exposed and a sandbox that does not exist answer differently:\n%s\n%s", notExposed, unknown)
	}
	if got := curl("-H", "Host: 8000-web.evil.test", "http://127.0.0.1:8080/"); status(got) != "404" {
		t.Fatalf("another domain: %s", got)
	}
	// (The server closes at once: curl may see the reset after the answer.)
	if got, _ := curlRun("-H", "Nook-Preview-Token: "+token, "-H", "X-Big: "+strings.Repeat("a", 70<<10), base+"/"); status(got) != "431" {
		t.Fatalf("an oversized header: %.300s", got)
	}

	// Server-sent events arrive as sent: the first while the app still
	// holds the second back.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sse := exec.CommandContext(ctx, "nsenter", "--net="+w.hostPath(), "curl", "-sS", "-N", "--resolve", "*:8080:127.0.0.1", "-H", "Nook-Preview-Token: "+token, base+"/sse")
	pipe, _ := sse.StdoutPipe()
	if err := sse.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(pipe)
	next := func(want string) {
		t.Helper()
		for lines.Scan() {
			if lines.Text() == want {
				return
			}
		}
		t.Fatalf("the event stream ended before %q: %v", want, lines.Err())
	}
	next("data: one")
	d.must("exec", "web", "--", "touch", "/tmp/go")
	next("data: two")
	sse.Wait()

	// A WebSocket through the preview URL.
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return nettest.DialNS(ctx, w.topo.Host, listen, 10*time.Second)
	}}}
	ws, _, err := websocket.Dial(ctx, "ws://8000-web.localhost:8080/ws", &websocket.DialOptions{HTTPClient: hc, HTTPHeader: http.Header{"Nook-Preview-Token": {token}}})
	if err != nil {
		t.Fatalf("WebSocket through the preview URL: %v", err)
	}
	if err := ws.Write(ctx, websocket.MessageText, []byte("hi")); err != nil {
		t.Fatal(err)
	}
	if _, msg, err := ws.Read(ctx); err != nil || string(msg) != "echo:hi" {
		t.Fatalf("WebSocket echo: %q %v", msg, err)
	}
	ws.CloseNow()

	// A paused sandbox wakes for a request its token admits.
	d.must("pause", "web")
	if got := curl("-H", "Nook-Preview-Token: "+token, base+"/"); status(got) != "200" {
		t.Fatalf("a paused sandbox's preview: %s", got)
	}
	if st := d.inspect("web").State; st != "running" {
		t.Fatalf("after a preview request the sandbox is %s", st)
	}
	// --auth none: anyone who reaches the listener.
	out = strings.Split(strings.TrimSpace(d.must("expose", "web", "8000", "--auth", "none")), "\n")
	if len(out) != 2 || out[1] != base+"/" {
		t.Fatalf("expose --auth none printed %q", out)
	}
	if got := curl(base + "/"); status(got) != "200" {
		t.Fatalf("a public port without a token: %s", got)
	}
	// The TCP forward stays, for what is not HTTP.
	if got := httpGet(t, w, hostAddr); !strings.HasPrefix(got, "200 ") {
		t.Fatalf("the exposed TCP forward: %q", got)
	}
	// Unexposed: gone from the preview too.
	d.must("unexpose", "web", "8000")
	if got := curl(base + "/"); status(got) != "404" {
		t.Fatalf("an unexposed port: %s", got)
	}
	// Unexposing revoked the tokens minted for it: exposed again, the
	// port needs a new one.
	out = strings.Split(strings.TrimSpace(d.must("expose", "web", "8000")), "\n")
	if got := curl("-H", "Nook-Preview-Token: "+token, base+"/"); status(got) != "401" {
		t.Fatalf("a token minted before an unexpose: %s", got)
	}
	if got := curl("-L", "-b", "", out[1]); status(got) != "200" {
		t.Fatalf("the new URL: %s", got)
	}
}
