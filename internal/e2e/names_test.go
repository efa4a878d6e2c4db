package e2e

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/nookhq/nook/api"
)

// The names behind a sandbox's connections to domain rules' addresses,
// checked on the host: evil.test shares allowed.test's address (as sites
// on one CDN do), and only allowed.test is allowed. TLS whose server name
// is another site, plain HTTP whose Host is another site (also later on a
// kept-alive connection), TLS without a name, and anything neither TLS nor
// HTTP are reset, and logged with why; a NAME:PORT/tcp rule lets any TCP
// through, a server-first protocol too; QUIC is refused at once.
func TestNetworkNames(t *testing.T) {
	w := newWorld(t)
	d := newDaemonIn(t, w.hostPath(), netDaemonArgs()...)
	d.must("create", "--name", "names", "--allow", "allowed.test", "--allow", "raw.test:7000/tcp")
	ok := func(what, script, want string) {
		t.Helper()
		if r := d.sh("names", script); r.code != 0 || !strings.HasPrefix(r.stdout, want) {
			t.Fatalf("%s: exit %d, %q %q; want %q", what, r.code, r.stdout, r.stderr, want)
		}
	}
	refused := func(what, script string) {
		t.Helper()
		if r := d.sh("names", script); r.code == 0 && r.stdout != "" {
			t.Fatalf("%s went through: %q", what, r.stdout)
		}
	}
	ok("TLS to the allowed name", "curl -sSk -m 5 https://allowed.test/", "tls-web")
	ok("its name in capitals with a trailing dot", "curl -sSk -m 5 https://ALLOWED.TEST./", "tls-web")
	ok("HTTP to the allowed name", "curl -sS -m 5 http://allowed.test/", "allowed-web")
	refused("TLS naming another site at the same address", "curl -sSk -m 5 --resolve evil.test:443:"+webAllowed+" https://evil.test/")
	refused("HTTP naming another site", "curl -sS -m 5 -H 'Host: evil.test' http://allowed.test/")
	refused("a kept-alive connection turned to another site", `python3 -c "
import http.client
c = http.client.HTTPConnection('allowed.test', 80, timeout=5)
c.request('GET', '/'); c.getresponse().read()
c.request('GET', '/', headers={'Host': 'evil.test'}); print(c.getresponse().read().decode())
"`)
	refused("TLS without a server name", "curl -sSk -m 5 https://"+webAllowed+"/")
	// A line that is neither TLS nor HTTP, then what comes back.
	rawTCP := func(host, port, send string) string {
		return `python3 -c "
import socket
s = socket.create_connection(('` + host + `', ` + port + `), timeout=5)
s.sendall(b'` + send + `')
print(s.recv(100).decode(errors='replace'), end='')
"`
	}
	refused("neither TLS nor HTTP", rawTCP("allowed.test", "80", `HELLO\\r\\n\\r\\n`))
	ok("raw TCP where a /tcp rule allows it (the server speaks first)", rawTCP("raw.test", "7000", ""), "220 raw")
	ok("the same protocol to the same address on the HTTP port, for comparison", rawTCP("allowed.test", "80", `GET / HTTP/1.0\\r\\nHost: allowed.test\\r\\n\\r\\n`), "HTTP/1.0 200")
	ok("QUIC refused at once", `python3 -c "
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(5)
s.connect(('allowed.test', 443))
for _ in range(3):
    s.send(b'quic')
    try:
        s.recv(10); print('answered'); break
    except socket.timeout:
        print('timeout'); break
    except OSError:
        continue
else:
    print('refused')
"`, "refused")

	var log api.NetLog
	if err := json.Unmarshal([]byte(d.must("net", "log", "names", "--json")), &log); err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"name TLS server name evil.test": false, "name HTTP Host evil.test": false, "mismatch": false,
		"no-name": false, "protocol": false, "quic": false}
	for _, e := range log.Entries {
		for k := range want {
			reason, detail, _ := strings.Cut(k, " ")
			if e.Reason == reason && strings.Contains(e.Detail, detail) {
				want[k] = true
			}
		}
	}
	for k, seen := range want {
		if !seen {
			t.Errorf("net log lacks %q:\n%s", k, d.must("net", "log", "names"))
		}
	}
}
