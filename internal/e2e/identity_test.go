package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/network"
	"github.com/nookhq/nook/internal/network/nettest"
)

// identityClaims are the claims the tests read.
type identityClaims struct {
	Subject     string            `json:"sub"`
	SandboxID   string            `json:"sandbox_id"`
	SandboxName string            `json:"sandbox_name"`
	ParentID    string            `json:"parent_id"`
	LineageID   string            `json:"lineage_id"`
	Creator     string            `json:"creator"`
	Template    string            `json:"template"`
	Labels      map[string]string `json:"labels"`
	IssuedAt    int64             `json:"iat"`
	Expiry      int64             `json:"exp"`
}

// identityIssuer serves what `nook oidc export` writes at the daemon's
// issuer URL (on the host's loopback), as a relying party's static
// hosting would.
type identityIssuer struct {
	url, dir string
}

func newIdentityIssuer(t *testing.T) (*identityIssuer, net.Listener) {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return &identityIssuer{url: "http://" + ln.Addr().String(), dir: t.TempDir()}, ln
}

func (is *identityIssuer) serve(t *testing.T, ln net.Listener) {
	srv := &http.Server{Handler: http.FileServer(http.Dir(is.dir)), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
}

// export writes the daemon's documents for the issuer to serve.
func (is *identityIssuer) export(d *daemon) {
	d.t.Helper()
	out := d.must("oidc", "export", is.dir)
	if !strings.Contains(out, filepath.Join(is.dir, ".well-known", "jwks.json")) {
		d.t.Fatalf("nook oidc export printed:\n%s", out)
	}
}

// verify checks a token with go-oidc against the served documents and
// returns its claims.
func (is *identityIssuer) verify(t *testing.T, token, audience string) (identityClaims, error) {
	t.Helper()
	ctx := context.Background()
	p, err := oidc.NewProvider(ctx, is.url)
	if err != nil {
		t.Fatalf("the issuer's discovery document: %v", err)
	}
	idt, err := p.Verifier(&oidc.Config{ClientID: audience, SupportedSigningAlgs: []string{oidc.ES256}}).Verify(ctx, token)
	if err != nil {
		return identityClaims{}, err
	}
	var c identityClaims
	if err := idt.Claims(&c); err != nil {
		t.Fatal(err)
	}
	return c, nil
}

// metadataToken fetches a token in a sandbox with one curl.
func (d *daemon) metadataToken(name, audience string) string {
	d.t.Helper()
	r := d.sh(name, "curl -sS -f -m 10 -H 'Nook-Metadata: true' 'http://169.254.169.254/v1/token?audience="+audience+"'")
	if r.code != 0 || strings.Count(r.stdout, ".") != 2 {
		d.t.Fatalf("%s: token from its metadata endpoint: exit %d, %q %q", name, r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// metadataStatus is the HTTP status a curl in a sandbox gets (0: none).
func (d *daemon) metadataStatus(name, args string) int {
	d.t.Helper()
	r := d.sh(name, "curl -s -o /dev/null -m 5 -w '%{http_code}' "+args)
	var code int
	fmt.Sscan(r.stdout, &code)
	return code
}

// hostGet sends a GET with the metadata header to addr from the simulated
// host (a process on the host), and returns the status and body.
func hostGet(w *world, addr, path string) (int, string, error) {
	c, err := nettest.DialNS(context.Background(), w.topo.Host, addr, 3*time.Second)
	if err != nil {
		return 0, "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "GET %s HTTP/1.0\r\nHost: 169.254.169.254\r\nNook-Metadata: true\r\n\r\n", path)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}

// sandboxNetns opens the network namespace of the container sandbox
// whose address is addr: the namespace of one of the host's processes
// (its init's, which runc made) whose interfaces hold it.
func sandboxNetns(t *testing.T, d *daemon, addr string) netns.NsHandle {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, e := range ents {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		p := filepath.Join("/proc", e.Name(), "ns", "net")
		ino, err := os.Readlink(p)
		if err != nil || seen[ino] {
			continue
		}
		seen[ino] = true
		ns, err := netns.GetFromPath(p)
		if err != nil {
			continue
		}
		var addrs []net.Addr
		nettest.Do(ns, func() (err error) { addrs, err = net.InterfaceAddrs(); return err })
		for _, a := range addrs {
			if strings.HasPrefix(a.String(), addr+"/") {
				return ns
			}
		}
		ns.Close()
	}
	t.Fatalf("no process's network namespace has %s", addr)
	return 0
}

// Identity tokens end to end, with the real daemon in a simulated host:
// one curl in a sandbox gets a token that go-oidc verifies against what
// `nook oidc export` wrote; its claims name the sandbox; no other sandbox,
// and no process on the host, gets a token with its subject; a fork gets a
// subject of its own in its parent's lineage; a key rotation, pause and
// resume, and a kill -9 of the daemon leave tokens verifiable and the
// endpoint serving; and removal leaves no listener.
func TestIdentity(t *testing.T) {
	w := newWorld(t)
	iss, ln := newIdentityIssuer(t)
	d := newDaemonIn(t, w.hostPath(), netDaemonArgs("--issuer", iss.url)...)
	iss.export(d)
	iss.serve(t, ln)

	// The daemon serves the same documents, without a token.
	disc, err := os.ReadFile(filepath.Join(iss.dir, ".well-known", "openid-configuration"))
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", d.socket())
	}}}
	resp, err := hc.Get("http://nook/.well-known/openid-configuration")
	if err != nil {
		t.Fatal(err)
	}
	served, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(served) != string(disc) {
		t.Fatalf("the daemon's discovery document: %d %s; exported: %s", resp.StatusCode, served, disc)
	}

	d.must("create", "--name", "alpha", "--label", "team=ml")
	d.must("create", "--name", "beta")
	alphaID, betaID := mustID(t, d, "alpha"), mustID(t, d, "beta")
	alphaNet := d.network("alpha")
	host := strings.TrimPrefix(iss.url, "http://")
	host = host[:strings.IndexByte(host, ':')]
	wantSub := func(id string) string { return "spiffe://" + host + "/sandbox/" + id }

	// One curl; the token verifies and says who the sandbox is.
	tok := d.metadataToken("alpha", "aud-alpha")
	c, err := iss.verify(t, tok, "aud-alpha")
	if err != nil {
		t.Fatalf("alpha's token does not verify: %v", err)
	}
	if c.Subject != wantSub(alphaID) || c.SandboxID != alphaID || c.SandboxName != "alpha" || c.LineageID != alphaID ||
		c.ParentID != "" || c.Creator != "host" || c.Template != "base" || c.Labels["team"] != "ml" {
		t.Fatalf("alpha's claims: %+v", c)
	}
	if c.Expiry-c.IssuedAt != 600 {
		t.Fatalf("default lifetime %ds, want 600", c.Expiry-c.IssuedAt)
	}
	if _, err := iss.verify(t, tok, "another-audience"); err == nil {
		t.Fatal("alpha's token verified for another audience")
	}
	// The name, a lifetime, and the sandbox's facts.
	r := d.sh("alpha", "curl -sS -f -H 'Nook-Metadata: true' 'http://metadata.nook.internal/v1/token?audience=aud&ttl=2m'")
	if c, err := iss.verify(t, r.stdout, "aud"); err != nil || c.Expiry-c.IssuedAt != 120 {
		t.Fatalf("a 2m token by name: %v %+v (%q %q)", err, c, r.stdout, r.stderr)
	}
	r = d.sh("alpha", "curl -sS -f -H 'Nook-Metadata: true' http://169.254.169.254/v1/sandbox")
	var facts struct{ ID, Name, Subject string }
	if err := json.Unmarshal([]byte(r.stdout), &facts); err != nil || facts.ID != alphaID || facts.Name != "alpha" || facts.Subject != wantSub(alphaID) {
		t.Fatalf("/v1/sandbox: %v %q", err, r.stdout)
	}

	// What clouds' metadata servers refuse, nook refuses.
	tokURL := "'http://169.254.169.254/v1/token?audience=x'"
	for _, tc := range []struct {
		what, args string
		want       int
	}{
		{"no header", tokURL, 403},
		{"X-Forwarded-For", "-H 'Nook-Metadata: true' -H 'X-Forwarded-For: 10.0.0.1' " + tokURL, 403},
		{"Forwarded", "-H 'Nook-Metadata: true' -H 'Forwarded: for=10.0.0.1' " + tokURL, 403},
		{"a rebinding Host", "-H 'Nook-Metadata: true' -H 'Host: evil.example' " + tokURL, 403},
		{"POST", "-X POST -H 'Nook-Metadata: true' " + tokURL, 405},
		{"no audience", "-H 'Nook-Metadata: true' 'http://169.254.169.254/v1/token'", 400},
	} {
		if got := d.metadataStatus("alpha", tc.args); got != tc.want {
			t.Errorf("%s: HTTP %d, want %d", tc.what, got, tc.want)
		}
	}

	// beta reaches its own endpoint only: its token names beta; alpha's
	// gateway is the host, out of its reach.
	bc, err := iss.verify(t, d.metadataToken("beta", "aud"), "aud")
	if err != nil || bc.Subject != wantSub(betaID) {
		t.Fatalf("beta's token: %v %+v", err, bc)
	}
	for _, port := range []string{fmt.Sprint(network.MetadataPort), "80"} {
		d.mustRefuse("beta", "-H 'Nook-Metadata: true' 'http://"+alphaNet.Gateway+":"+port+"/v1/token?audience=aud'", 7)
	}
	// beta with alpha's source address (as if it had CAP_NET_ADMIN): its
	// packets reach only beta's endpoint, whose answers go to alpha's
	// address, so no connection is ever made.
	nsh := sandboxNetns(t, d, sandboxAddr(d.network("beta")))
	defer nsh.Close()
	err = nettest.Do(nsh, func() error {
		dl := net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(sandboxAddr(alphaNet))},
			Control: func(_, _ string, rc syscall.RawConn) error {
				return rc.Control(func(fd uintptr) { unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_FREEBIND, 1) })
			}}
		conn, err := dl.Dial("tcp4", "169.254.169.254:80")
		if err != nil {
			return nil
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(3 * time.Second))
		fmt.Fprintf(conn, "GET /v1/token?audience=aud HTTP/1.0\r\nHost: 169.254.169.254\r\nNook-Metadata: true\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err == nil && resp.StatusCode == 200 {
			return fmt.Errorf("a token for a spoofed source address")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// A process on the host: the endpoint answers its own sandbox alone.
	// Its connection is closed unanswered.
	code, body, err := hostGet(w, alphaNet.Gateway+":"+fmt.Sprint(network.MetadataPort), "/v1/token?audience=aud")
	if err == nil {
		t.Fatalf("a process on the host got an answer from alpha's endpoint: HTTP %d %s", code, body)
	}

	// A token file the agent keeps fresh, for credential providers that
	// read one (AWS_WEB_IDENTITY_TOKEN_FILE).
	d.must("create", "--name", "gamma", "--identity-audience", "sts.test")
	// There when the create answers.
	file := d.sh("gamma", `cat "$NOOK_IDENTITY_TOKEN_FILE"`).stdout
	if c, err := iss.verify(t, file, "sts.test"); err != nil || c.SandboxName != "gamma" {
		t.Fatalf("the token file: %v %+v", err, c)
	}
	if r := d.sh("gamma", `echo "$NOOK_IDENTITY_TOKEN_FILE"; stat -c %a "$NOOK_IDENTITY_TOKEN_FILE"`); r.stdout != api.IdentityTokenFile+"\n644\n" {
		t.Fatalf("the token file's path and mode: %q", r.stdout)
	}
	// Its fork never holds gamma's token: from the moment the fork
	// exists, the file is absent or the fork's own.
	gfork := strings.Fields(d.must("fork", "gamma", "--name", "gamma-fork"))[0]
	gforkID := mustID(t, d, gfork)
	if r := d.sh(gfork, `cat "$NOOK_IDENTITY_TOKEN_FILE"`); r.code == 0 {
		if c, err := iss.verify(t, r.stdout, "sts.test"); err != nil || c.SandboxID != gforkID {
			t.Fatalf("the fork's token file right after the fork: %v, %+v (fork %s)", err, c, gforkID)
		}
	}
	waitFor(t, "the fork's token file", func() bool {
		r := d.sh(gfork, `cat "$NOOK_IDENTITY_TOKEN_FILE"`)
		c, err := iss.verify(t, r.stdout, "sts.test")
		return r.code == 0 && err == nil && c.SandboxID == gforkID
	})
	d.must("rm", "gamma", gfork)

	// The operator, through the CLI; the log says who asked.
	var at api.IdentityToken
	if err := json.Unmarshal([]byte(d.must("identity", "token", "alpha", "--audience", "ops", "--json")), &at); err != nil {
		t.Fatal(err)
	}
	if c, err := iss.verify(t, at.Token, "ops"); err != nil || c.Subject != wantSub(alphaID) || at.Subject != c.Subject {
		t.Fatalf("nook identity token: %v %+v %+v", err, c, at)
	}
	waitFor(t, "the identity log", func() bool {
		var l api.IdentityLog
		json.Unmarshal([]byte(d.must("identity", "log", "alpha", "--json")), &l)
		vias := map[string]bool{}
		for _, e := range l.Entries {
			vias[e.Via+" "+e.Audience] = true
		}
		return vias["metadata aud-alpha"] && vias["api:host ops"]
	})
	d.expectCLI(t, []cliCase{
		{[]string{"identity", "token", "alpha"}, 1, `"audience" not set`},
		{[]string{"identity", "token", "alpha", "--audience", "x", "--ttl", "5h"}, 1, "outside"},
		{[]string{"identity", "token", "ghost", "--audience", "x"}, 1, `no sandbox named "ghost"`},
	})

	// A fork is someone else: its own subject, its parent's lineage.
	forkName := strings.Fields(d.must("fork", "alpha", "--name", "alpha-fork"))[0]
	forkID := mustID(t, d, forkName)
	fc, err := iss.verify(t, d.metadataToken(forkName, "aud"), "aud")
	if err != nil || fc.Subject != wantSub(forkID) || fc.ParentID != alphaID || fc.LineageID != alphaID || forkID == alphaID {
		t.Fatalf("the fork's token: %v %+v", err, fc)
	}

	// A rollback is the same sandbox: the same subject.
	d.must("snapshot", "alpha", "--name", "s1")
	d.must("rollback", "alpha", "s1")
	if c, err := iss.verify(t, d.metadataToken("alpha", "aud"), "aud"); err != nil || c.Subject != wantSub(alphaID) {
		t.Fatalf("after a rollback: %v %+v", err, c)
	}

	// A rotation: the old token still verifies; new ones are signed by
	// the key published before it signed.
	old := d.metadataToken("alpha", "aud")
	d.must("identity", "rotate")
	iss.export(d)
	if _, err := iss.verify(t, old, "aud"); err != nil {
		t.Fatalf("a token signed before the rotation: %v", err)
	}
	if _, err := iss.verify(t, d.metadataToken("alpha", "aud"), "aud"); err != nil {
		t.Fatalf("a token signed after the rotation: %v", err)
	}

	// Pause and resume, and kill -9 of the daemon: the endpoint comes
	// back, the keys are the same.
	d.must("pause", "alpha")
	d.must("resume", "alpha")
	if _, err := iss.verify(t, d.metadataToken("alpha", "aud"), "aud"); err != nil {
		t.Fatalf("after pause and resume: %v", err)
	}
	d.stop(syscall.SIGKILL)
	d.start()
	if _, err := iss.verify(t, old, "aud"); err != nil {
		t.Fatalf("after kill -9, a token from before: %v", err)
	}
	if _, err := iss.verify(t, d.metadataToken("alpha", "aud"), "aud"); err != nil {
		t.Fatalf("after kill -9 (documents exported before it): %v", err)
	}

	// Removal closes the endpoint.
	for _, n := range []string{"alpha", "beta", forkName} {
		d.must("rm", n)
	}
	var tcp string
	nettest.Do(w.topo.Host, func() error {
		b, _ := os.ReadFile("/proc/thread-self/net/tcp")
		tcp = string(b)
		return nil
	})
	for _, port := range []uint16{network.MetadataPort, network.EgressPort} {
		if strings.Contains(strings.ToUpper(tcp), fmt.Sprintf(":%04X 00000000:0000 0A", port)) {
			t.Errorf("a gateway service (port %d) still listens:\n%s", port, tcp)
		}
	}
	checkNoNetworkLeft(t, w, d)
}

// A vm's guest gets its token the same way.
func TestIdentityVM(t *testing.T) {
	requireVMInSimulatedHost(t)
	w := newWorld(t)
	iss, ln := newIdentityIssuer(t)
	d := newDaemonIn(t, w.hostPath(), netDaemonArgs("--issuer", iss.url)...)
	iss.export(d)
	iss.serve(t, ln)
	d.must("create", "--isolation", "vm", "--name", "guest", "--cpus", "1", "--memory", "512M")
	id := mustID(t, d, "guest")
	c, err := iss.verify(t, d.metadataToken("guest", "aud"), "aud")
	if err != nil || c.SandboxID != id || !strings.HasSuffix(c.Subject, "/sandbox/"+id) {
		t.Fatalf("the vm's token: %v %+v", err, c)
	}
	if got := d.metadataStatus("guest", "'http://169.254.169.254/v1/token?audience=x'"); got != 403 {
		t.Fatalf("without the header: HTTP %d", got)
	}
}
