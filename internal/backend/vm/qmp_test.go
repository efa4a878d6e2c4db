package vm

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeQMP serves one QMP connection: the greeting, then for each command
// line it reads, the next of answers (each may hold several lines).
func fakeQMP(t *testing.T, answers ...string) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "qmp.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.Write([]byte(`{"QMP": {"version": {"qemu": {"micro": 0, "minor": 2, "major": 7}}, "capabilities": []}}` + "\n"))
		dec := json.NewDecoder(c)
		for _, a := range answers {
			var cmd map[string]any
			if err := dec.Decode(&cmd); err != nil {
				return
			}
			// Written in two parts: a line may arrive split.
			c.Write([]byte(a[:len(a)/2]))
			time.Sleep(time.Millisecond)
			c.Write([]byte(a[len(a)/2:]))
		}
	}()
	return sock
}

const qmpEvent = `{"timestamp": {"seconds": 1, "microseconds": 2}, "event": "STOP"}` + "\n"

// Events before an answer (even before the answer to qmp_capabilities,
// go-qemu's issue #210) are skipped; answers, errors and bad lines come
// back as such.
func TestQMPClient(t *testing.T) {
	sock := fakeQMP(t,
		qmpEvent+`{"return": {}}`+"\n",
		qmpEvent+qmpEvent+`{"return": {"status": "running", "running": true}}`+"\n",
		`{"error": {"class": "GenericError", "desc": "Node 'nope' not found"}}`+"\n",
		`{"timestamp": {}}`+"\n",
		"not json\n",
	)
	mon, err := dialQMP(t.Context(), sock)
	if err != nil {
		t.Fatal(err)
	}
	defer mon.close()
	if st, err := mon.status(); err != nil || st != "running" {
		t.Fatalf("status %q, %v", st, err)
	}
	if err := mon.run("blockdev-del", map[string]any{"node-name": "nope"}, nil); err == nil || !strings.Contains(err.Error(), "qmp blockdev-del: GenericError: Node 'nope' not found") {
		t.Fatalf("an error answer: %v", err)
	}
	if err := mon.run("query-status", nil, nil); err == nil || !strings.Contains(err.Error(), "has no return") {
		t.Fatalf("an answer with no return: %v", err)
	}
	if err := mon.run("query-status", nil, nil); err == nil || !strings.Contains(err.Error(), "not JSON") {
		t.Fatalf("garbage: %v", err)
	}
	// QEMU gone: said so, and the connection is not used again.
	if err := mon.run("cont", nil, nil); err == nil || !strings.Contains(err.Error(), "QEMU closed its monitor") {
		t.Fatalf("a closed monitor: %v", err)
	}
	if err := mon.run("cont", nil, nil); err == nil || !strings.Contains(err.Error(), "an earlier command on this connection failed") {
		t.Fatalf("a command after the connection broke: %v", err)
	}
}

// A line longer than the limit is refused, not buffered without end.
func TestQMPLineLimit(t *testing.T) {
	sock := fakeQMP(t, `{"return": {}}`+"\n", `{"return": "`+strings.Repeat("x", qmpMaxLine+10)+`"}`+"\n")
	mon, err := dialQMP(t.Context(), sock)
	if err != nil {
		t.Fatal(err)
	}
	defer mon.close()
	if err := mon.run("query-status", nil, nil); err == nil || !strings.Contains(err.Error(), "longer than") {
		t.Fatalf("a huge line: %v", err)
	}
}

// A descriptor goes along with its command (SCM_RIGHTS).
func TestQMPPassesFile(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "qmp.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	got := make(chan int, 1)
	go func() {
		c, err := l.AcceptUnix()
		if err != nil {
			return
		}
		defer c.Close()
		c.Write([]byte(`{"QMP": {}}` + "\n"))
		buf, oob := make([]byte, 4096), make([]byte, 128)
		c.Read(buf) // qmp_capabilities
		c.Write([]byte(`{"return": {}}` + "\n"))
		_, oobn, _, _, _ := c.ReadMsgUnix(buf, oob)
		got <- oobn
		c.Write([]byte(`{"return": {"fdset-id": 1, "fd": 9}}` + "\n"))
		time.Sleep(time.Second)
	}()
	mon, err := dialQMP(t.Context(), sock)
	if err != nil {
		t.Fatal(err)
	}
	defer mon.close()
	f, err := os.Open(sock[:len(sock)-len("qmp.sock")])
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var fd struct {
		FdsetID int `json:"fdset-id"`
	}
	if err := mon.runFile("add-fd", map[string]any{}, f, &fd); err != nil || fd.FdsetID != 1 {
		t.Fatalf("add-fd: %+v %v", fd, err)
	}
	if n := <-got; n == 0 {
		t.Fatal("no descriptor came with the command")
	}
}

func FuzzParseQMP(f *testing.F) {
	for _, s := range []string{qmpEvent, `{"return": {}}`, `{"return": [1,2]}`, `{"error": {"class": "X", "desc": "y"}}`, `{"error": null, "return": 1}`, `{}`, `[`, `{"event": 5}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		ret, event, err := parseQMP(line)
		if event && (ret != nil || err != nil) {
			t.Fatalf("an event with a return or an error: %q", line)
		}
		if err == nil && !event && ret == nil {
			t.Fatalf("no return, no error, no event: %q", line)
		}
	})
}
