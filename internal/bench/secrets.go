package bench

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/network/nettest"
	"github.com/nookhq/nook/internal/secrets"
	"github.com/nookhq/nook/sdk"
)

// benchSecret is secret.test, served over HTTPS on 443 (what a sandbox
// with a secret bound to it reaches through nook's interception) and
// 8443 (straight out, a CIDR rule: the baseline), with certificates from
// benchCA, which the daemon trusts through SSL_CERT_FILE.
const benchSecret = "203.0.113.30"

// benchCA makes the world's test CA and writes it to dir.
func benchCA(dir string) (*secrets.CA, string, error) {
	ca, err := secrets.NewCA("bench world", []string{"test"})
	if err != nil {
		return nil, "", err
	}
	path := filepath.Join(dir, "bench-ca.pem")
	return ca, path, os.WriteFile(path, ca.CertPEM, 0o644)
}

// serveTLS answers GET / with "ok" and GET /big?n=BYTES with that many
// zero bytes, over HTTPS on every world address's 443 and 8443, with a
// certificate for the name the client asks for.
func (s *simNet) serveTLS(ca *secrets.CA) (func(), error) {
	zeros := make([]byte, 1<<20)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/big" {
			io.WriteString(w, "ok")
			return
		}
		n, _ := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
		w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		for n > 0 {
			k, err := w.Write(zeros[:min(n, int64(len(zeros)))])
			if err != nil {
				return
			}
			n -= int64(k)
		}
	})
	cfg := &tls.Config{GetCertificate: func(hi *tls.ClientHelloInfo) (*tls.Certificate, error) { return ca.Leaf(hi.ServerName) }}
	var srvs []*http.Server
	for _, port := range []string{"443", "8443"} {
		var ln net.Listener
		if err := nettest.Do(s.world, func() (err error) { ln, err = net.Listen("tcp4", "0.0.0.0:"+port); return err }); err != nil {
			for _, srv := range srvs {
				srv.Close()
			}
			return nil, err
		}
		srv := &http.Server{Handler: h, TLSConfig: cfg, ReadHeaderTimeout: 10 * time.Second}
		go srv.ServeTLS(ln, "", "")
		srvs = append(srvs, srv)
	}
	return func() {
		for _, srv := range srvs {
			srv.Close()
		}
	}, nil
}

// httpsScript times HTTPS GETs on new connections from inside a
// sandbox, alternating between argv[4] (the subject, HOST:PORT) and
// argv[5] (the baseline), in milliseconds; then a download of argv[2]
// bytes from each, in MB/s. It verifies the servers with the system's
// roots (and the sandbox's secrets CA, when it has one) and the world's
// CA (argv[3]); with BENCH_TOKEN set, its placeholder goes in
// Authorization. Each name is resolved once (the resolver answers a
// sandbox 50 queries a second).
const httpsScript = `
import http.client, json, os, socket, ssl, sys, time
n, size, world_ca = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
targets = {'subject': sys.argv[4], 'baseline': sys.argv[5]}
bundle = '/etc/nook/ca-bundle.crt'
ctx = ssl.create_default_context(cafile=bundle if os.path.exists(bundle) else None)
ctx.load_verify_locations(cadata=world_ca)
ips = {}
class Conn(http.client.HTTPSConnection):
    def connect(self):
        s = socket.create_connection((ips[self.host], self.port), timeout=30)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1) # as curl does
        self.sock = ctx.wrap_socket(s, server_hostname=self.host)
def get(target, path='/'):
    host, port = target.rsplit(':', 1)
    if host not in ips:
        ips[host] = socket.gethostbyname(host)
    hdr = {}
    if 'BENCH_TOKEN' in os.environ:
        hdr['Authorization'] = 'Bearer ' + os.environ['BENCH_TOKEN']
    c = Conn(host, int(port), context=ctx, timeout=30)
    c.request('GET', path, headers=hdr)
    r = c.getresponse()
    if r.status != 200:
        sys.exit('GET %s%s: %d %s' % (target, path, r.status, r.read()[:200]))
    got = 0
    while True:
        b = r.read(1 << 20)
        if not b:
            break
        got += len(b)
    c.close()
    return got
def timed(target):
    t = time.perf_counter(); get(target); return (time.perf_counter() - t) * 1000
out = {'subject': [], 'baseline': []}
for k in out:
    timed(targets[k])
for _ in range(n):
    for k in ('baseline', 'subject'):
        out[k].append(timed(targets[k]))
for k in ('baseline', 'subject'):
    t = time.perf_counter()
    got = get(targets[k], '/big?n=%d' % size)
    if got != size:
        sys.exit('download from %s: %d bytes of %d' % (targets[k], got, size))
    out[k + '_mbs'] = size / (time.perf_counter() - t) / 1e6
print(json.dumps(out))
`

// httpsResults are a subject path's figures beside its baseline's.
type httpsResults struct {
	baseline, subject       []time.Duration
	baselineMBs, subjectMBs float64
}

// httpsRun runs httpsScript in a sandbox.
func httpsRun(ctx context.Context, cl *sdk.Client, name string, ca *secrets.CA, n int, size int64, subject, baseline string) (httpsResults, error) {
	var res httpsResults
	var out, errb bytes.Buffer
	st, err := cl.Exec(ctx, name, api.ExecRequest{Cmd: []string{"python3", "-c", httpsScript, fmt.Sprint(n), fmt.Sprint(size), string(ca.CertPEM), subject, baseline}}, &out, &errb)
	if err != nil {
		return res, err
	}
	if st.ExitCode != 0 {
		var refused []string
		if l, err := cl.NetLog(ctx, name); err == nil {
			for _, e := range l.Entries {
				refused = append(refused, e.Destination+" "+e.Reason+" "+e.Detail)
			}
		}
		return res, fmt.Errorf("exit %d: %s\nrefused: %s", st.ExitCode, strings.TrimSpace(errb.String()), strings.Join(refused, "; "))
	}
	var r struct {
		Baseline    []float64 `json:"baseline"`
		Subject     []float64 `json:"subject"`
		BaselineMBs float64   `json:"baseline_mbs"`
		SubjectMBs  float64   `json:"subject_mbs"`
	}
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		return res, fmt.Errorf("%w: %q", err, out.String())
	}
	return httpsResults{millis(r.Baseline), millis(r.Subject), r.BaselineMBs, r.SubjectMBs}, nil
}

// benchSecrets binds a secret to secret.test in a new sandbox and times
// HTTPS requests and a download through the interception (443), beside
// the same straight out (8443, a CIDR rule).
func benchSecrets(ctx context.Context, cl *sdk.Client, ca *secrets.CA, n int, size int64) (httpsResults, error) {
	if err := cl.SetSecret(ctx, "BENCH_TOKEN", []byte("bench-token-value-0123456789")); err != nil {
		return httpsResults{}, err
	}
	if _, err := cl.CreateSandbox(ctx, api.CreateSandboxRequest{Name: "netbench-secret",
		Allow: []string{"secret.test", benchSecret + "/32"}, Secrets: []string{"BENCH_TOKEN@secret.test"}}); err != nil {
		return httpsResults{}, err
	}
	defer cl.DeleteSandbox(context.WithoutCancel(ctx), "netbench-secret")
	return httpsRun(ctx, cl, "netbench-secret", ca, n, size, "secret.test:443", "secret.test:8443")
}
