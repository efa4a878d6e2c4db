package e2e

import (
	"archive/zip"
	"bytes"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"net/http/cgi"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/network/nettest"
	"github.com/nookhq/nook/internal/secrets"
	"github.com/nookhq/nook/internal/testutil"
)

// The secrets' values: canaries that must never be seen inside a
// sandbox, in the daemon's files or in its log, and never reach a host
// they are not bound to.
const (
	tokenValue = "tok-CANARY-4f1d2a9c77e0b3"
	gitValue   = "git-CANARY-81bd0c3e55aa19"
	pypiValue  = "pypi-CANARY-1c9e77d0a4f2b8"
)

var canaries = []string{tokenValue, gitValue, pypiValue}

// canaryForms are the forms a value could leak in: raw, base64,
// URL-encoded, and inside the Basic credentials the clients send.
func canaryForms() [][]byte {
	var out [][]byte
	for _, v := range canaries {
		out = append(out, []byte(v), []byte(base64.StdEncoding.EncodeToString([]byte(v))), []byte(url.QueryEscape(v)))
		for _, user := range []string{"x-access-token:", "__token__:"} {
			out = append(out, []byte(base64.StdEncoding.EncodeToString([]byte(user+v))))
		}
	}
	return out
}

// scanFile looks for forms in a file's data (its holes skipped: disk
// images are sparse), a piece at a time.
func scanFile(path string, forms [][]byte) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", err
	}
	size := fi.Size()
	buf := make([]byte, 8<<20+256)
	for off := int64(0); off < size; {
		data, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
		if err != nil {
			break // ENXIO: no data after off
		}
		hole, err := unix.Seek(int(f.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			hole = size
		}
		for pos := data; pos < hole; pos += 8 << 20 {
			n, _ := f.ReadAt(buf, pos)
			for _, form := range forms {
				if bytes.Contains(buf[:n], form) {
					return string(form), nil
				}
			}
		}
		off = hole
	}
	return "", nil
}

func leaksCanary(b []byte) string {
	for _, f := range canaryForms() {
		if bytes.Contains(b, f) {
			return string(f)
		}
	}
	return ""
}

// secretWorld is the hosts of *.secret.test on one address (webSecret),
// over HTTPS with certificates from a test CA the daemon trusts
// (SSL_CERT_FILE), and plain HTTP: api (echoes every request),
// other (the same, bound to nothing), git (a git server over smart
// HTTP that wants gitValue for org/repo.git) and pypi (a package index
// that wants pypiValue). Every request each host receives is kept.
type secretWorld struct {
	caFile string
	commit string // org/repo.git's HEAD

	mu  sync.Mutex
	got map[string][]string
}

func (sw *secretWorld) received(host string) string {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	return strings.Join(sw.got[host], "\n----\n")
}

func (w *world) serveSecrets(t *testing.T) *secretWorld {
	t.Helper()
	sw := &secretWorld{got: map[string][]string{}}
	ca, err := secrets.NewCA("world", []string{"secret.test"})
	if err != nil {
		t.Fatal(err)
	}
	sw.caFile = filepath.Join(t.TempDir(), "world-ca.pem")
	if err := os.WriteFile(sw.caFile, ca.CertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	gitRoot := t.TempDir()
	sw.commit = makeRepos(t, gitRoot)
	git := &cgi.Handler{Path: filepath.Join(gitExecPath(t), "git-http-backend"), Env: []string{"GIT_PROJECT_ROOT=" + gitRoot, "GIT_HTTP_EXPORT_ALL=1"}}
	wheel := makeWheel(t)

	auth := func(rw http.ResponseWriter, r *http.Request, want, pathPrefix string) bool {
		_, pw, ok := r.BasicAuth()
		if ok && pw == want && strings.HasPrefix(r.URL.Path, pathPrefix) {
			return true
		}
		rw.Header().Set("WWW-Authenticate", `Basic realm="secret.test"`)
		http.Error(rw, "authentication required", http.StatusUnauthorized)
		return false
	}
	h := http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		host, _, err := net.SplitHostPort(r.Host)
		if err != nil {
			host = r.Host
		}
		host = strings.ToLower(strings.TrimSuffix(host, "."))
		dump, _ := httputil.DumpRequest(r, !strings.HasPrefix(host, "git."))
		sw.mu.Lock()
		sw.got[host] = append(sw.got[host], string(dump))
		sw.mu.Unlock()
		switch {
		case host == "git.secret.test":
			if auth(rw, r, gitValue, "/org/repo.git/") {
				git.ServeHTTP(rw, r)
			}
		case host == "pypi.secret.test":
			if !auth(rw, r, pypiValue, "/") {
				return
			}
			switch r.URL.Path {
			case "/simple/nookdemo/":
				fmt.Fprint(rw, `<!DOCTYPE html><html><body><a href="/files/nookdemo-1.0-py3-none-any.whl">nookdemo-1.0-py3-none-any.whl</a></body></html>`)
			case "/files/nookdemo-1.0-py3-none-any.whl":
				rw.Write(wheel)
			default:
				http.NotFound(rw, r)
			}
		case host == "api.secret.test" && r.URL.Path == "/redirect":
			http.Redirect(rw, r, "https://other.secret.test/landing", http.StatusFound)
		default: // echo
			rw.Header().Set("X-Echo-Authorization", r.Header.Get("Authorization"))
			rw.Write(dump)
		}
	})
	var tlsLn, plainLn net.Listener
	if err := nettest.Do(w.topo.World, func() (err error) {
		if tlsLn, err = net.Listen("tcp4", webSecret+":443"); err != nil {
			return err
		}
		plainLn, err = net.Listen("tcp4", webSecret+":80")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, TLSConfig: &tls.Config{
		GetCertificate: func(hi *tls.ClientHelloInfo) (*tls.Certificate, error) {
			return ca.Leaf(strings.ToLower(hi.ServerName))
		},
	}}
	go srv.ServeTLS(tlsLn, "", "")
	plain := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go plain.Serve(plainLn)
	t.Cleanup(func() { srv.Close(); plain.Close() })
	return sw
}

func gitExecPath(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("git", "--exec-path").Output()
	if err != nil {
		t.Fatalf("git: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// makeRepos makes the bare repositories org/repo.git and org/other.git
// under root, and returns repo's HEAD.
func makeRepos(t *testing.T, root string) string {
	t.Helper()
	src := filepath.Join(t.TempDir(), "src")
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("git", args...)
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@t", "GIT_CONFIG_NOSYSTEM=1", "HOME="+root)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return strings.TrimSpace(string(out))
	}
	run("init", "-q", "-b", "main", src)
	if err := os.WriteFile(filepath.Join(src, "README"), []byte("the repository of secrets_test.go\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	run("-C", src, "add", "README")
	run("-C", src, "commit", "-q", "-m", "first")
	for _, r := range []string{"repo", "other"} {
		run("clone", "-q", "--bare", src, filepath.Join(root, "org", r+".git"))
	}
	return run("-C", src, "rev-parse", "HEAD")
}

// makeWheel returns a minimal pure-Python wheel of nookdemo 1.0.
func makeWheel(t *testing.T) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	files := map[string]string{
		"nookdemo/__init__.py":            "VERSION = '1.0'\n",
		"nookdemo-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: nookdemo\nVersion: 1.0\n",
		"nookdemo-1.0.dist-info/WHEEL":    "Wheel-Version: 1.0\nGenerator: nook-e2e\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
		"nookdemo-1.0.dist-info/RECORD":   "nookdemo/__init__.py,,\nnookdemo-1.0.dist-info/METADATA,,\nnookdemo-1.0.dist-info/WHEEL,,\nnookdemo-1.0.dist-info/RECORD,,\n",
	}
	for _, name := range []string{"nookdemo/__init__.py", "nookdemo-1.0.dist-info/METADATA", "nookdemo-1.0.dist-info/WHEEL", "nookdemo-1.0.dist-info/RECORD"} {
		f, err := zw.Create(name)
		if err != nil {
			t.Fatal(err)
		}
		f.Write([]byte(files[name]))
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// scanScript looks for the canaries (given reversed, so that its own
// command line does not hold them) in every process's environment and
// readable memory but its own, and in every file of the sandbox; it
// prints what it found, or "clean".
const scanScript = `
import os, sys, base64, urllib.parse
forms = []
for r in sys.argv[1:]:
    v = r[::-1]
    forms += [v.encode(), base64.b64encode(v.encode()), urllib.parse.quote(v).encode()]
    for user in ('x-access-token:', '__token__:'):
        forms.append(base64.b64encode((user + v).encode()))
hits = []
def check(what, b):
    for f in forms:
        if f in b:
            hits.append(what)
            return True
    return False
def scan(what, f, lo, hi):
    # In 8 MiB pieces that overlap by more than the longest form.
    pos = lo
    while pos < hi:
        n = min(8 << 20, hi - pos)
        f.seek(pos)
        b = f.read(n + 256)
        if not b or check(what, b):
            return
        pos += n
me = str(os.getpid())
for pid in [p for p in os.listdir('/proc') if p.isdigit() and p != me]:
    try:
        check('environ of ' + pid, open('/proc/%s/environ' % pid, 'rb').read())
        check('cmdline of ' + pid, open('/proc/%s/cmdline' % pid, 'rb').read())
        mem = open('/proc/%s/mem' % pid, 'rb', 0)
        for line in open('/proc/%s/maps' % pid).read().splitlines():
            addr, perms = line.split()[:2]
            lo, hi = [int(x, 16) for x in addr.split('-')]
            if 'r' not in perms or hi - lo > (4 << 30):
                continue
            try:
                scan('memory of %s (%s)' % (pid, line.split()[-1]), mem, lo, hi)
            except (OSError, ValueError, OverflowError):
                pass
    except OSError:
        pass
for root, dirs, files in os.walk('/'):
    dirs[:] = [d for d in dirs if os.path.join(root, d) not in ('/proc', '/sys', '/dev')]
    for f in files:
        p = os.path.join(root, f)
        try:
            if os.path.islink(p) or not os.path.isfile(p):
                continue
            with open(p, 'rb') as fh:
                scan('file ' + p, fh, 0, os.path.getsize(p))
        except OSError:
            pass
print('\n'.join(hits) or 'clean')
`

// Secrets that never enter the sandbox: bound to hosts at create, seen
// inside only as placeholders that the host replaces on the way to
// those hosts (TLS terminated with the sandbox's own CA, trusted as
// shipped by curl, git, python3, pip and node), refused anywhere else
// with a 403 that names the rule, scrubbed from the answers; a private
// repository cloned at create with one; nowhere in the sandbox's files,
// processes' environments or memory, its snapshot, or the daemon's files
// and log; forks get new placeholders.
func TestSecrets(t *testing.T) {
	w := newWorld(t)
	sw := w.serveSecrets(t)
	d := newDaemonInEnv(t, w.hostPath(), []string{"SSL_CERT_FILE=" + sw.caFile}, netDaemonArgs()...)
	for name, v := range map[string]string{"TOKEN": tokenValue, "GIT": gitValue, "PYPI": pypiValue} {
		f := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(f, []byte(v+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		d.must("secret", "set", name, "--file", f)
	}
	if ls := d.must("secret", "ls"); !strings.Contains(ls, "TOKEN") || leaksCanary([]byte(ls)) != "" {
		t.Fatalf("secret ls: %s", ls)
	}
	allow := []string{"--allow", "api.secret.test", "--allow", "other.secret.test", "--allow", "git.secret.test", "--allow", "pypi.secret.test"}
	cr, err := d.nook(append([]string{"create", "--name", "sec", "--memory", "1G",
		"--secret", "TOKEN@api.secret.test:inherit", "--secret", "GIT@git.secret.test:path=/org/repo.git", "--secret", "PYPI@pypi.secret.test",
		"--repo", "https://git.secret.test/org/repo.git"}, allow...)...)
	if err != nil || cr.code != 0 {
		t.Fatalf("create: %v exit %d\n%s", err, cr.code, cr.stderr)
	}
	// The clone's progress, as it came.
	if !strings.Contains(cr.stderr, "cloning https://git.secret.test/org/repo.git into /workspace") || !strings.Contains(cr.stderr, "cloned https://git.secret.test/org/repo.git at "+sw.commit) {
		t.Fatalf("create --repo showed no progress:\n%s", cr.stderr)
	}

	var sb api.Sandbox
	if err := json.Unmarshal([]byte(d.must("inspect", "sec", "--json")), &sb); err != nil {
		t.Fatal(err)
	}
	if sb.Repo == nil || sb.Repo.Commit != sw.commit || sb.Repo.Path != "/workspace" {
		t.Fatalf("the clone's record: %+v; want commit %s", sb.Repo, sw.commit)
	}
	placeholder := map[string]string{}
	for _, b := range sb.Secrets {
		placeholder[b.Secret] = b.Placeholder
	}
	if len(placeholder) != 3 || !strings.HasPrefix(placeholder["TOKEN"], "nook_secret_") {
		t.Fatalf("bindings: %+v", sb.Secrets)
	}

	ok := func(name, what, script, want string) string {
		t.Helper()
		r := d.sh(name, script)
		if r.code != 0 || !strings.Contains(r.stdout, want) {
			t.Fatalf("%s: exit %d\nstdout: %s\nstderr: %s\nwant %q", what, r.code, r.stdout, r.stderr, want)
		}
		if f := leaksCanary([]byte(r.stdout + r.stderr)); f != "" {
			t.Fatalf("%s: the sandbox saw the secret (%s):\n%s", what, f, r.stdout)
		}
		return r.stdout
	}
	refused := func(what, script string) {
		t.Helper()
		r := d.sh("sec", script)
		if !strings.Contains(r.stdout, "403") {
			t.Fatalf("%s: not refused with a 403: exit %d\nstdout: %s\nstderr: %s", what, r.code, r.stdout, r.stderr)
		}
	}

	// The bound host gets the value; the sandbox sees its placeholder.
	echo := ok("sec", "curl to the bound host", `curl -sS -m 10 -D - https://api.secret.test/echo -H "Authorization: Bearer $TOKEN"`, "Bearer "+placeholder["TOKEN"])
	if !strings.Contains(strings.ToLower(echo), "x-echo-authorization: bearer "+placeholder["TOKEN"]) {
		t.Fatalf("the echoed header should hold the placeholder:\n%s", echo)
	}
	if got := sw.received("api.secret.test"); !strings.Contains(got, "Authorization: Bearer "+tokenValue) {
		t.Fatalf("api.secret.test did not get the value:\n%s", got)
	}
	ok("sec", "python3 urllib", `python3 -c "
import os, urllib.request
r = urllib.request.Request('https://api.secret.test/py', headers={'Authorization': 'Bearer ' + os.environ['TOKEN']})
print(urllib.request.urlopen(r, timeout=10).read().decode())"`, "GET /py")
	ok("sec", "the name in capitals with a trailing dot", `curl -sS -m 10 https://API.SECRET.TEST./caps -H "Authorization: Bearer $TOKEN"`, "GET /caps")
	ok("sec", "the clone", "git -C /workspace log --format=%H -1 && git -C /workspace fetch -q && echo fetched", sw.commit)
	ok("sec", "pip from a private index", `python3 -m venv /tmp/v && /tmp/v/bin/pip download -q --no-deps -d /tmp/dl --index-url "https://__token__:$PYPI@pypi.secret.test/simple/" nookdemo && ls /tmp/dl`,
		"nookdemo-1.0-py3-none-any.whl")

	// Refused, with a 403 that names the rule; the hosts get nothing.
	refused("SNI of the bound host, Host of another", `curl -sS -m 10 -o /dev/null -w '%{http_code}' https://api.secret.test/ -H 'Host: other.secret.test' -H "Authorization: Bearer $TOKEN"`)
	refused("plain HTTP", `curl -sS -m 10 -o /dev/null -w '%{http_code}' http://api.secret.test/plain -H "Authorization: Bearer $TOKEN"`)
	refused("a query string", `curl -sS -m 10 -o /dev/null -w '%{http_code}' "https://api.secret.test/q?token=$TOKEN"`)
	refused("another header", `curl -sS -m 10 -o /dev/null -w '%{http_code}' https://api.secret.test/h -H "X-Leak: $TOKEN"`)
	refused("a kept-alive connection turned to another host", `python3 -c "
import http.client, os
c = http.client.HTTPSConnection('api.secret.test', 443, timeout=10)
c.request('GET', '/first', headers={'Authorization': 'Bearer ' + os.environ['TOKEN']}); c.getresponse().read()
c.request('GET', '/second', headers={'Host': 'other.secret.test', 'Authorization': 'Bearer ' + os.environ['TOKEN']})
print(c.getresponse().status)"`)
	refused("another repository", `git -c credential.helper='!f() { test "$1" = get && printf "username=x-access-token\npassword=%s\n" "$GIT"; }; f' clone -q https://git.secret.test/org/other.git /tmp/other 2>&1; echo`)
	// Where the placeholder goes to a host it is not bound to, over TLS
	// nook does not open, that host gets the placeholder: worthless. (Its
	// certificate is the world's test CA's, which the sandbox does not
	// trust: -k.)
	ok("sec", "the placeholder sent to another host", `curl -sSk -m 10 https://other.secret.test/direct -H "Authorization: Bearer $TOKEN"`, placeholder["TOKEN"])
	ok("sec", "a redirect to another host followed with credentials", `curl -sSk -m 10 -L --location-trusted https://api.secret.test/redirect -H "Authorization: Bearer $TOKEN"`, "GET /landing")
	for _, path := range []string{"GET / ", "GET /plain", "GET /q?", "GET /h ", "GET /second"} {
		if strings.Contains(sw.received("api.secret.test"), path) {
			t.Errorf("api.secret.test received a refused request (%s)", path)
		}
	}
	if strings.Contains(sw.received("git.secret.test"), "other.git") && strings.Contains(sw.received("git.secret.test"), "Authorization") {
		for _, req := range strings.Split(sw.received("git.secret.test"), "\n----\n") {
			if strings.Contains(req, "other.git") && strings.Contains(req, "Authorization") {
				t.Errorf("git.secret.test received other.git with credentials:\n%s", req)
			}
		}
	}
	for _, host := range []string{"other.secret.test", "git.secret.test", "pypi.secret.test", "api.secret.test"} {
		got := sw.received(host)
		for i, v := range canaries {
			bound := map[int]string{0: "api.secret.test", 1: "git.secret.test", 2: "pypi.secret.test"}[i]
			if host != bound && strings.Contains(got, base64.StdEncoding.EncodeToString([]byte(v))[:12]) || host != bound && strings.Contains(got, v) {
				t.Errorf("%s received secret %d, bound only to %s:\n%s", host, i, bound, got)
			}
		}
	}

	// Forks: a new placeholder for the inherited binding; the parent's
	// is worthless there; the others are not inherited.
	d.must("fork", "sec", "--name", "sec-fork")
	var fork api.Sandbox
	if err := json.Unmarshal([]byte(d.must("inspect", "sec-fork", "--json")), &fork); err != nil {
		t.Fatal(err)
	}
	if len(fork.Secrets) != 1 || fork.Secrets[0].Secret != "TOKEN" || fork.Secrets[0].Placeholder == placeholder["TOKEN"] {
		t.Fatalf("fork's bindings: %+v", fork.Secrets)
	}
	ok("sec-fork", "the fork's own placeholder", `curl -sS -m 10 https://api.secret.test/fork -H "Authorization: Bearer $TOKEN"`, fork.Secrets[0].Placeholder)
	// The parent's placeholder, which the fork's processes restored from
	// the snapshot still hold, is refused there with a clear reason. The
	// bindings not inherited are gone.
	if r := d.sh("sec-fork", `test -z "$GIT" && curl -sS -m 10 -D - -o /dev/null https://api.secret.test/old -H "Authorization: Bearer `+placeholder["TOKEN"]+`"`); !strings.Contains(r.stdout, " 403") || !strings.Contains(strings.ToLower(r.stdout), "forked from") {
		t.Fatalf("the parent's placeholder in the fork: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	if strings.Contains(sw.received("api.secret.test"), "GET /old") {
		t.Fatal("api.secret.test received the parent's placeholder from the fork")
	}

	// @internet: the bound host's connections are intercepted all the same.
	d.must("create", "--name", "sec-open", "--allow", "@internet", "--secret", "TOKEN@api.secret.test")
	ok("sec-open", "under @internet", `curl -sS -m 10 https://api.secret.test/open -H "Authorization: Bearer $TOKEN"`, "GET /open")
	if !strings.Contains(sw.received("api.secret.test"), "GET /open") || strings.Count(sw.received("api.secret.test"), "Bearer "+tokenValue) < 4 {
		t.Fatalf("api.secret.test under @internet:\n%s", sw.received("api.secret.test"))
	}

	// node (fetch) trusts the CA through NODE_EXTRA_CA_CERTS.
	testutil.Template(t, "e2b")
	d.must("create", "--name", "sec-node", "--template", "e2b", "--allow", "api.secret.test", "--secret", "TOKEN@api.secret.test")
	ok("sec-node", "node fetch", `node -e "fetch('https://api.secret.test/node', {headers: {Authorization: 'Bearer ' + process.env.TOKEN}}).then(r => r.text()).then(t => console.log(t), e => { console.error(e); process.exit(1) })"`, "GET /node")

	// The refusals are in the network log, with the secret's name.
	var log api.NetLog
	if err := json.Unmarshal([]byte(d.must("net", "log", "sec", "--json")), &log); err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, e := range log.Entries {
		if e.Reason == "secret" && strings.Contains(e.Detail, "TOKEN") {
			seen++
		}
	}
	if seen < 5 {
		t.Errorf("net log has %d refusals naming TOKEN:\n%s", seen, d.must("net", "log", "sec"))
	}

	// Nowhere: the sandbox's processes, memory and files; its snapshot
	// and everything else the daemon keeps; the daemon's log.
	d.must("snapshot", "sec", "--name", "after")
	var rev []string
	for _, v := range canaries {
		b := []byte(v)
		for i, j := 0, len(b)-1; i < j; i, j = i+1, j-1 {
			b[i], b[j] = b[j], b[i]
		}
		rev = append(rev, string(b))
	}
	for _, name := range []string{"sec", "sec-fork"} {
		r, err := d.nookWithin(5*time.Minute, []string{"NOOK_HOST=unix://" + d.socket()}, append([]string{"exec", name, "--", "python3", "-c", scanScript}, rev...)...)
		if err != nil || r.code != 0 || strings.TrimSpace(r.stdout) != "clean" {
			t.Fatalf("%s: the secret is in the sandbox: %v exit %d\n%s\n%s", name, err, r.code, r.stdout, r.stderr)
		}
	}
	scanDaemonFiles(t, d)
	if f := leaksCanary([]byte(d.log.String())); f != "" {
		t.Errorf("the daemon's log holds a secret (%s)", f)
	}

	// A removed secret is refused from then on.
	d.must("secret", "rm", "TOKEN")
	refused("a removed secret", `curl -sS -m 10 -o /dev/null -w '%{http_code}' https://api.secret.test/gone -H "Authorization: Bearer $TOKEN"`)
}

// The same in a vm: its agent trusts the CA, the host replaces the
// placeholder on the way out.
func TestSecretsVM(t *testing.T) {
	requireVMInSimulatedHost(t)
	w := newWorld(t)
	sw := w.serveSecrets(t)
	d := newDaemonInEnv(t, w.hostPath(), []string{"SSL_CERT_FILE=" + sw.caFile}, netDaemonArgs()...)
	f := filepath.Join(t.TempDir(), "TOKEN")
	if err := os.WriteFile(f, []byte(tokenValue), 0o600); err != nil {
		t.Fatal(err)
	}
	d.must("secret", "set", "TOKEN", "--file", f)
	d.must("create", "--isolation", "vm", "--name", "guest", "--cpus", "1", "--memory", "512M",
		"--allow", "api.secret.test", "--secret", "TOKEN@api.secret.test")
	r := d.sh("guest", `curl -sS -m 20 https://api.secret.test/vm -H "Authorization: Bearer $TOKEN"; echo; echo "$TOKEN"`)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	ph := lines[len(lines)-1]
	if r.code != 0 || !strings.HasPrefix(ph, "nook_secret_") || !strings.Contains(r.stdout, "Bearer "+ph) || leaksCanary([]byte(r.stdout)) != "" {
		t.Fatalf("curl in the vm: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	if got := sw.received("api.secret.test"); !strings.Contains(got, "GET /vm") || !strings.Contains(got, "Bearer "+tokenValue) {
		t.Fatalf("api.secret.test from the vm:\n%s", got)
	}
	// Its snapshot holds the guest's memory: the value is not in it, nor
	// anywhere else the daemon keeps.
	d.must("snapshot", "guest", "--name", "after")
	scanDaemonFiles(t, d)
}

// scanDaemonFiles fails the test if any file under the daemon's data
// directory holds a canary in any form.
func scanDaemonFiles(t *testing.T, d *daemon) {
	t.Helper()
	forms := canaryForms()
	files := 0
	filepath.WalkDir(d.data, func(p string, e fs.DirEntry, err error) error {
		if err != nil || !e.Type().IsRegular() {
			return nil
		}
		files++
		if f, err := scanFile(p, forms); err != nil {
			t.Errorf("scan %s: %v", p, err)
		} else if f != "" {
			t.Errorf("the daemon's file %s holds a secret (%s)", p, f)
		}
		return nil
	})
	if files == 0 {
		t.Fatalf("no file under %s to scan", d.data)
	}
}
