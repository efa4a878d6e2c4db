package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/testutil"
)

// E2B's own JS SDK (npm e2b 2.51.0, unchanged, installed by make deps
// into .cache/e2b-sdk) drives a daemon serving --e2b-listen, configured
// the way an E2B user points it at a self-hosted API: E2B_API_URL and
// E2B_SANDBOX_URL at the listener, E2B_API_KEY a token from `nook token
// create --e2b`. The suite (testdata/e2b/suite.mjs) runs commands
// (output, exit codes, streaming, background processes, stdin, E2B's
// default user and root), a pty, the filesystem (reads, writes, binary
// data, several files at once, directories, renames, watches, relative
// paths and owners by user), the lifecycle (list by metadata,
// timeout, info, pause and resume keeping files and processes, kill)
// and the refusals (a wrong API key, a wrong envd access token, an
// unknown sandbox, malformed Connect frames), each case in its own
// sandbox.
func TestE2BSDK(t *testing.T) { runE2BSuite(t, "all") }

// The same SDK drives a vm sandbox (chosen by the nook.isolation
// metadata): commands, files and a port, through the vm's agent.
func TestE2BSDKVM(t *testing.T) {
	requireVM(t)
	runE2BSuite(t, "vm")
}

// The egress policy an E2B create and updateNetwork give, with the
// daemon and the SDK in a simulated host whose world serves allowed.test
// and denied.test.
func TestE2BSDKNetwork(t *testing.T) {
	w := newWorld(t)
	runE2BSuiteIn(t, "net", w.hostPath())
}

// runE2BSuite runs testdata/e2b/suite.mjs's cases of a set (all, or vm)
// against a daemon of its own.
func runE2BSuite(t *testing.T, set string) { runE2BSuiteIn(t, set, "") }

// runE2BSuiteIn is runE2BSuite with the daemon and node in the network
// namespace at netnsPath ("": this one).
func runE2BSuiteIn(t *testing.T, set, netnsPath string) {
	root := testutil.ModuleRoot(t)
	sdk := filepath.Join(root, ".cache", "e2b-sdk")
	suite := filepath.Join(root, "internal", "e2e", "testdata", "e2b", "suite.mjs")
	if _, err := os.Stat(filepath.Join(sdk, "node_modules", "e2b", "dist", "index.mjs")); err != nil {
		if _, err := exec.LookPath("npm"); err != nil {
			testutil.Missing(t, "npm is not installed, so E2B's SDK cannot be (make deps installs it)")
		}
		t.Fatalf("E2B's SDK is not installed in %s: run make deps", sdk)
	}
	// make deps installs what testdata/e2b's lock file pins: an older
	// install would test another SDK than the one named.
	want, err := os.ReadFile(filepath.Join(root, "internal", "e2e", "testdata", "e2b", "package-lock.json"))
	if err != nil {
		t.Fatal(err)
	}
	if have, _ := os.ReadFile(filepath.Join(sdk, ".installed-lock.json")); !bytes.Equal(have, want) {
		t.Fatalf("E2B's SDK in %s is not the one testdata/e2b/package-lock.json pins: run make deps", sdk)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		testutil.Missing(t, "node is not installed, so E2B's JS SDK cannot run (make deps installs npm, which brings it)")
	}

	// E2B's base template is nook's e2b recipe: built here, ahead, so
	// that its first build does not run against the SDK's timeouts.
	testutil.Template(t, "e2b")

	addr := freeAddr(t)
	var d *daemon
	if netnsPath != "" {
		d = newDaemonIn(t, netnsPath, netDaemonArgs("--e2b-listen", addr)...)
	} else {
		d = newDaemon(t, "--e2b-listen", addr)
	}
	key := strings.TrimSpace(d.must("token", "create", "--e2b", "--name", "e2b-test"))
	if hx, ok := strings.CutPrefix(key, "e2b_"); !ok || len(hx) < 20 || strings.ToLower(hx) != hx {
		t.Fatalf("token create --e2b printed %q, not e2b_ and lowercase hex", key)
	} else if _, err := hex.DecodeString(hx); err != nil {
		t.Fatalf("token create --e2b printed %q, not e2b_ and lowercase hex", key)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, suite)
	if netnsPath != "" {
		cmd = exec.CommandContext(ctx, "nsenter", "--net="+netnsPath, node, suite)
	}
	// The SDK reads E2B_* from the environment: none of the caller's may
	// point it elsewhere (E2B_DOMAIN, E2B_DEBUG, ...).
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "E2B_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "E2B_API_URL=http://"+addr, "E2B_SANDBOX_URL=http://"+addr, "E2B_API_KEY="+key, "E2B_SDK_DIR="+sdk, "E2B_SUITE="+set)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	// The suite's lines go to the test log as they come.
	var failed []string
	passed := 0
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		t.Log(line)
		switch {
		case strings.HasPrefix(line, "ok - "):
			passed++
		case strings.HasPrefix(line, "not ok - "):
			failed = append(failed, line)
		}
	}
	if err := sc.Err(); err != nil {
		t.Errorf("reading the E2B suite's output: %v", err)
		io.Copy(io.Discard, r) // so that it is not stuck writing
	}
	r.Close()
	err = cmd.Wait()
	if ctx.Err() != nil {
		t.Fatalf("the E2B suite did not finish within its deadline (%d cases passed): %v", passed, ctx.Err())
	}
	if err != nil || len(failed) > 0 {
		t.Fatalf("the E2B suite failed (%v): %d cases passed, %d failed:\n%s", err, passed, len(failed), strings.Join(failed, "\n"))
	}
	if passed == 0 {
		t.Fatal("the E2B suite ran no case")
	}
}

// e2bCall sends one request to an E2B edge and returns its status and
// body.
func e2bCall(t *testing.T, method, url string, headers map[string]string, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range headers {
		if strings.EqualFold(k, "Host") {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// Attacks on the E2B edge, each once a hole: a read-only API key got a
// sandbox's envd access token (root exec); a sandbox's own key lengthened
// its life; any caller reached any port of any sandbox, nook's own ones
// included, by header or by a host name of any domain (DNS rebinding);
// /health told anyone which names exist.
func TestEscapeE2BEdge(t *testing.T) {
	addr := freeAddr(t)
	base := "http://" + addr
	d := newDaemon(t, "--e2b-listen", addr)
	admin := strings.TrimSpace(d.must("token", "create", "--e2b"))
	readOnly := strings.TrimSpace(d.must("token", "create", "--e2b", "--scope", "read-only"))

	// A nook sandbox (not made through E2B) serving a port.
	d.must("create", "--name", "native")
	d.must("exec", "-d", "native", "--", "sh", "-c", "mkdir -p /srv && echo secret > /srv/s.txt && cd /srv && exec python3 -m http.server 8000")
	port := map[string]string{"E2b-Sandbox-Id": "native", "E2b-Sandbox-Port": "8000"}
	// It answers from inside.
	deadline := time.Now().Add(20 * time.Second)
	for {
		r, _ := d.nook("exec", "native", "--", "python3", "-c", "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8000/s.txt').read().decode())")
		if r.code == 0 || time.Now().After(deadline) {
			break
		}
	}
	if code, body := e2bCall(t, "GET", base+"/s.txt", port, ""); code != http.StatusForbidden || strings.Contains(body, "secret") {
		t.Errorf("a port of a nook sandbox without its traffic token: %d %s", code, body)
	}
	// An admin's connect gives the traffic token, which opens it.
	code, body := e2bCall(t, "POST", base+"/sandboxes/native/connect", map[string]string{"X-API-Key": admin}, `{"timeout": 600}`)
	if code != http.StatusOK {
		t.Fatalf("connect: %d %s", code, body)
	}
	var view struct {
		EnvdAccessToken    string  `json:"envdAccessToken"`
		TrafficAccessToken *string `json:"trafficAccessToken"`
	}
	json.Unmarshal([]byte(body), &view)
	if view.TrafficAccessToken == nil || view.EnvdAccessToken == "" {
		t.Fatalf("connect of a nook sandbox gave no traffic token: %s", body)
	}
	withToken := map[string]string{"E2b-Sandbox-Id": "native", "E2b-Sandbox-Port": "8000", "E2b-Traffic-Access-Token": *view.TrafficAccessToken}
	if code, body := e2bCall(t, "GET", base+"/s.txt", withToken, ""); code != http.StatusOK || strings.TrimSpace(body) != "secret" {
		t.Errorf("a port with its traffic token: %d %s", code, body)
	}
	// A host name of another domain routes nowhere.
	if code, body := e2bCall(t, "GET", base+"/s.txt", map[string]string{"Host": "8000-native.attacker.example", "E2b-Traffic-Access-Token": *view.TrafficAccessToken}, ""); code == http.StatusOK || strings.Contains(body, "secret") {
		t.Errorf("a foreign host name reached the sandbox: %d %s", code, body)
	}
	// A read-only key sees the sandbox but not its access token.
	code, body = e2bCall(t, "GET", base+"/sandboxes/native", map[string]string{"X-API-Key": readOnly}, "")
	if code != http.StatusOK || strings.Contains(body, "envdAccessToken") || strings.Contains(body, view.EnvdAccessToken) {
		t.Errorf("a read-only key's view of a sandbox: %d %s", code, body)
	}
	// /health without the token answers as for no sandbox.
	if code, _ := e2bCall(t, "GET", base+"/health", map[string]string{"E2b-Sandbox-Id": "native", "E2b-Sandbox-Port": "49983"}, ""); code != http.StatusBadGateway {
		t.Errorf("/health without a token: %d", code)
	}
	if code, _ := e2bCall(t, "GET", base+"/health", map[string]string{"E2b-Sandbox-Id": "native", "E2b-Sandbox-Port": "49983", "X-Access-Token": view.EnvdAccessToken}, ""); code != http.StatusNoContent {
		t.Errorf("/health with its token: %d", code)
	}
	// A sandbox's own key cannot lengthen its life.
	own := strings.TrimSpace(d.must("token", "create", "--e2b", "--scope", "sandbox:native"))
	before := d.must("inspect", "native", "--json")
	if code, body := e2bCall(t, "POST", base+"/sandboxes/native/timeout", map[string]string{"X-API-Key": own}, `{"timeout": 7776000}`); code != http.StatusForbidden {
		t.Errorf("a sandbox's key set its timeout: %d %s", code, body)
	}
	if code, body := e2bCall(t, "POST", base+"/sandboxes/native/connect", map[string]string{"X-API-Key": own}, `{"timeout": 7776000}`); code != http.StatusOK {
		t.Errorf("a sandbox's key connecting: %d %s", code, body)
	}
	// Nor make sandboxes, by a fork or by a create from its snapshot, or
	// widen its network.
	if code, body := e2bCall(t, "POST", base+"/sandboxes/native/fork", map[string]string{"X-API-Key": own}, `{"count": 1}`); code != http.StatusForbidden {
		t.Errorf("a sandbox's key forked it: %d %s", code, body)
	}
	if code, body := e2bCall(t, "POST", base+"/v2/sandboxes", map[string]string{"X-API-Key": own}, `{"templateID": "native:snap"}`); code != http.StatusForbidden {
		t.Errorf("a sandbox's key created from its snapshot: %d %s", code, body)
	}
	if code, body := e2bCall(t, "PUT", base+"/sandboxes/native/network", map[string]string{"X-API-Key": own}, `{"allowOut": ["0.0.0.0/0"]}`); code != http.StatusForbidden {
		t.Errorf("a sandbox's key changed its network: %d %s", code, body)
	}
	var listed []api.Sandbox
	if err := json.Unmarshal([]byte(d.must("ls", "--json")), &listed); err != nil || len(listed) != 1 {
		t.Errorf("%d sandboxes after the sandbox key's attempts, want 1 (%v)", len(listed), err)
	}
	var b, a struct {
		ExpiresAt time.Time `json:"expires_at"`
	}
	json.Unmarshal([]byte(before), &b)
	json.Unmarshal([]byte(d.must("inspect", "native", "--json")), &a)
	if b.ExpiresAt.IsZero() || !a.ExpiresAt.Equal(b.ExpiresAt) {
		t.Errorf("a sandbox's key moved its expiry from %s to %s", b.ExpiresAt, a.ExpiresAt)
	}
	d.must("rm", "native")
}
