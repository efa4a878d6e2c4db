package e2b

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/e2b/envdpb/process"
	"github.com/nookhq/nook/internal/e2b/envdpb/process/processconnect"
	"github.com/nookhq/nook/internal/errdefs"
)

// The SDK's metadata query: each pair escaped, the whole escaped again.
func TestMetadataFilter(t *testing.T) {
	got, err := metadataFilter("user%3Dalice%26tag%3Da%252Bb%2520c")
	if err != nil || len(got) != 2 || got["user"] != "alice" || got["tag"] != "a+b c" {
		t.Errorf("filter: %v %v", got, err)
	}
	if _, err := metadataFilter("%zz"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("bad escape: %v", err)
	}
}

// envd reports an exit as Go's os.ProcessState does; the SDK throws on a
// non-zero code with the error text.
func TestEndEvent(t *testing.T) {
	ok := endEvent(api.ExitStatus{})
	if ok.ExitCode != 0 || !ok.Exited || ok.Status != "exit status 0" || ok.Error != nil {
		t.Errorf("exit 0: %+v", ok)
	}
	three := endEvent(api.ExitStatus{ExitCode: 3})
	if three.ExitCode != 3 || !three.Exited || three.GetError() != "exit status 3" {
		t.Errorf("exit 3: %+v", three)
	}
	killed := endEvent(api.ExitStatus{ExitCode: -1, Signal: "KILL"})
	if killed.ExitCode != -1 || killed.Exited || killed.Status != "signal: killed" {
		t.Errorf("killed: %+v", killed)
	}
}

func TestNamesTokensAndTimes(t *testing.T) {
	re := regexp.MustCompile(`^e2b-[a-z0-9]{12}$`)
	if n := newName(); !re.MatchString(n) || n == newName() {
		t.Errorf("name %q", n)
	}
	key, err := loadKey(t.TempDir() + "/e2b.key")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{key: key}
	a, b := s.accessToken("id1"), s.accessToken("id2")
	if a == b || len(a) != 40 || a != s.accessToken("id1") {
		t.Errorf("tokens %q %q", a, b)
	}
	if ttlOf(5) != "60s" || ttlOf(300) != "300s" {
		t.Errorf("ttl: %s %s", ttlOf(5), ttlOf(300))
	}
	h := http.Header{}
	if keepaliveEvery(h) != 90*time.Second {
		t.Error("default keepalive")
	}
	h.Set("Keepalive-Ping-Interval", "50")
	if keepaliveEvery(h) != 50*time.Second {
		t.Error("asked keepalive")
	}
	h.Set("Keepalive-Ping-Interval", "100000")
	if keepaliveEvery(h) != 300*time.Second {
		t.Error("bounded keepalive")
	}
}

// The key survives a restart: sandboxes keep their access tokens.
func TestKeyKept(t *testing.T) {
	p := t.TempDir() + "/e2b.key"
	k1, err := loadKey(p)
	if err != nil {
		t.Fatal(err)
	}
	k2, err := loadKey(p)
	if err != nil || !bytes.Equal(k1, k2) {
		t.Errorf("key changed across loads: %v", err)
	}
}

// refuser is a Process service that refuses every call: what the fuzz
// test reaches once connect-go decoded a request.
type refuser struct {
	processconnect.UnimplementedProcessHandler
}

func (refuser) Start(context.Context, *connect.Request[process.StartRequest], *connect.ServerStream[process.StartResponse]) error {
	return errdefs.Invalid("refused")
}

// A Connect request body from the network, whatever its bytes, gets an
// answer: never a panic, never an unbounded read.
func FuzzConnectEnvelope(f *testing.F) {
	_, h := processconnect.NewProcessHandler(refuser{}, connect.WithInterceptors(errorInterceptor{}), connect.WithReadMaxBytes(16<<20))
	f.Add([]byte{0, 0, 0, 0, 2, '{', '}'}, true)
	f.Add([]byte{0, 0, 0, 0, 5, 'x', 'y'}, true)
	f.Add([]byte{0, 0xff, 0xff, 0xff, 0xff}, false)
	f.Add([]byte{1, 0, 0, 0, 3, 1, 2, 3}, false)
	f.Add([]byte{2, 0, 0, 0, 0}, true)
	f.Fuzz(func(t *testing.T, body []byte, asJSON bool) {
		ct := "application/connect+proto"
		if asJSON {
			ct = "application/connect+json"
		}
		req := httptest.NewRequest(http.MethodPost, processconnect.ProcessStartProcedure, bytes.NewReader(body))
		req.Header.Set("Content-Type", ct)
		req.Header.Set("Connect-Protocol-Version", "1")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code == 0 {
			t.Fatal("no answer")
		}
	})
}

// A sandbox's passwd and group files name its owners; lines that are not
// NAME:x:ID are skipped, the first name of an id wins.
func TestParseNames(t *testing.T) {
	got := parseNames(strings.NewReader("root:x:0:0:root:/root:/bin/bash\n# comment\nbroken\nuser:x:1000:1000::/home/user:/bin/bash\nalias:x:1000:1000\nneg:x:-1:0\n:x:5:5\n"))
	if len(got) != 2 || got[0] != "root" || got[1000] != "user" {
		t.Errorf("names: %v", got)
	}
	n := &idNames{users: got}
	if n.user(1000) != "user" || n.user(7) != "7" || n.group(0) != "root" {
		t.Errorf("lookups: %q %q %q", n.user(1000), n.user(7), n.group(0))
	}
	var none *idNames
	if none.user(0) != "root" || none.group(42) != "42" {
		t.Error("nil names")
	}
}

// Whatever a sandbox's /etc/passwd holds, reading it ends and gives ids
// that are not negative.
func FuzzParseNames(f *testing.F) {
	f.Add([]byte("root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/bash\n"))
	f.Add([]byte(strings.Repeat("a", 70000) + ":x:1:1\nb:x:2:2\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		for id := range parseNames(bytes.NewReader(b)) {
			if id < 0 {
				t.Fatalf("negative id %d", id)
			}
		}
	})
}

// Only the edge's own domain routes a host name to a sandbox's port.
func TestHostRoute(t *testing.T) {
	for _, c := range []struct {
		host, domain, id, port string
		ok                     bool
	}{
		{"8000-e2b-abc.localhost:3000", "localhost:3000", "e2b-abc", "8000", true},
		{"8000-e2b-abc.LOCALHOST", "localhost:3000", "e2b-abc", "8000", true},
		{"8000-e2b-abc.attacker.example", "localhost:3000", "", "", false},
		{"8000-e2b-abc.localhost.attacker.example", "localhost", "", "", false},
		{"127.0.0.1:3000", "localhost:3000", "", "", false},
		{"localhost:3000", "localhost:3000", "", "", false},
		{"x8000-e2b.localhost", "localhost", "", "", false},
		{"8000-.localhost", "localhost", "", "", false},
		{"8000-a.localhost", "", "", "", false},
	} {
		id, port, ok := hostRoute(c.host, c.domain)
		if ok != c.ok || id != c.id || port != c.port {
			t.Errorf("hostRoute(%q, %q) = %q %q %v", c.host, c.domain, id, port, ok)
		}
	}
}
