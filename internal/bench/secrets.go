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
	ca, err := secrets.NewCA("bench world", []string{"secret.test"})
	if err != nil {
		return nil, "", err
	}
	path := filepath.Join(dir, "bench-ca.pem")
	return ca, path, os.WriteFile(path, ca.CertPEM, 0o644)
}

// serveTLS answers GET / with "ok" and GET /big?n=BYTES with that many
// zero bytes, over HTTPS on benchSecret's 443 and 8443.
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
	cfg := &tls.Config{GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return ca.Leaf("secret.test") }}
	var srvs []*http.Server
	for _, port := range []string{"443", "8443"} {
		var ln net.Listener
		if err := nettest.Do(s.world, func() (err error) { ln, err = net.Listen("tcp4", benchSecret+":"+port); return err }); err != nil {
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

// secretScript times HTTPS GETs on new connections from inside a
// sandbox, the secret's placeholder in Authorization: to secret.test
// through nook's interception (443) and straight out (8443), alternating,
// in milliseconds; then a download of argv[2] bytes each way, in MB/s.
// Both verify the server: the interception's with the sandbox's CA, the
// straight one's with the world's (argv[3]).
const secretScript = `
import http.client, json, os, socket, ssl, sys, time
n, size, world_ca = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
ctx = ssl.create_default_context(cafile='/etc/nook/ca-bundle.crt')
ctx.load_verify_locations(cadata=world_ca)
hdr = {'Host': 'secret.test', 'Authorization': 'Bearer ' + os.environ['BENCH_TOKEN']}
ip = socket.gethostbyname('secret.test') # once: the resolver answers a sandbox 50 queries a second
class Conn(http.client.HTTPSConnection):
    def connect(self):
        s = socket.create_connection((ip, self.port), timeout=30)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1) # as curl does
        self.sock = ctx.wrap_socket(s, server_hostname='secret.test')
def get(port, path='/'):
    c = Conn('secret.test', port, context=ctx, timeout=30)
    c.request('GET', path, headers=hdr)
    r = c.getresponse()
    if r.status != 200:
        sys.exit('GET %s:%d: %d %s' % (path, port, r.status, r.read()[:200]))
    got = 0
    while True:
        b = r.read(1 << 20)
        if not b:
            break
        got += len(b)
    c.close()
    return got
def timed(port):
    t = time.perf_counter(); get(port); return (time.perf_counter() - t) * 1000
timed(443); timed(8443)
direct, intercepted = [], []
for _ in range(n):
    direct.append(timed(8443)); intercepted.append(timed(443))
rates = {}
for port in (8443, 443):
    t = time.perf_counter()
    got = get(port, '/big?n=%d' % size)
    if got != size:
        sys.exit('download through %d: %d bytes of %d' % (port, got, size))
    rates[port] = size / (time.perf_counter() - t) / 1e6
print(json.dumps({'direct': direct, 'intercepted': intercepted, 'direct_mbs': rates[8443], 'intercepted_mbs': rates[443]}))
`

// secretResults are the interception's figures beside the straight path's.
type secretResults struct {
	direct, intercepted       []time.Duration
	directMBs, interceptedMBs float64
}

// benchSecrets binds a secret to secret.test in a new sandbox and times
// HTTPS requests and a download through the interception, beside the
// same straight out.
func benchSecrets(ctx context.Context, cl *sdk.Client, ca *secrets.CA, n int, size int64) (secretResults, error) {
	var res secretResults
	if err := cl.SetSecret(ctx, "BENCH_TOKEN", []byte("bench-token-value-0123456789")); err != nil {
		return res, err
	}
	if _, err := cl.CreateSandbox(ctx, api.CreateSandboxRequest{Name: "netbench-secret",
		Allow: []string{"secret.test", benchSecret + "/32"}, Secrets: []string{"BENCH_TOKEN@secret.test"}}); err != nil {
		return res, err
	}
	defer cl.DeleteSandbox(context.WithoutCancel(ctx), "netbench-secret")
	var out, errb bytes.Buffer
	st, err := cl.Exec(ctx, "netbench-secret", api.ExecRequest{Cmd: []string{"python3", "-c", secretScript, fmt.Sprint(n), fmt.Sprint(size), string(ca.CertPEM)}}, &out, &errb)
	if err != nil {
		return res, err
	}
	if st.ExitCode != 0 {
		var refused []string
		if l, err := cl.NetLog(ctx, "netbench-secret"); err == nil {
			for _, e := range l.Entries {
				refused = append(refused, e.Destination+" "+e.Reason+" "+e.Detail)
			}
		}
		return res, fmt.Errorf("exit %d: %s\nrefused: %s", st.ExitCode, strings.TrimSpace(errb.String()), strings.Join(refused, "; "))
	}
	var r struct {
		Direct         []float64 `json:"direct"`
		Intercepted    []float64 `json:"intercepted"`
		DirectMBs      float64   `json:"direct_mbs"`
		InterceptedMBs float64   `json:"intercepted_mbs"`
	}
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		return res, fmt.Errorf("%w: %q", err, out.String())
	}
	return secretResults{millis(r.Direct), millis(r.Intercepted), r.DirectMBs, r.InterceptedMBs}, nil
}
