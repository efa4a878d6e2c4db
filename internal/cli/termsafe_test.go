package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/nookhq/nook/api"
)

// evil is what a hostile sandbox puts in a file name, a command line, a
// DNS query: an OSC that retitles the terminal, C1 CSI (as a rune and as a
// lone byte), a carriage return and a newline that forge a line, and a
// right-to-left override.
const evil = "x\x1b]0;pwned\x07\u009b2J\x9b\r\nfake line\u202eexe"

// TestEscapeTerminalOutput runs the CLI against a fake daemon that
// answers with sandbox-controlled strings full of terminal controls: the
// human output escapes them (and still shows them), errors too, and
// --json prints exactly what the daemon sent.
func TestEscapeTerminalOutput(t *testing.T) {
	now := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	sb := api.Sandbox{ID: "sb1", Name: "box", Template: evil, Isolation: "vm", State: "failed", Reason: evil,
		GuestKernel: evil, Accelerator: "tcg", Boot: "cold", Env: map[string]string{"K": evil}, CreatedAt: now, ExpiresAt: now}
	file := api.FileInfo{Path: "/root/" + evil, Name: evil, Type: api.FileTypeSymlink, Mode: "0777", ModTime: now, LinkTarget: evil}
	answers := map[string]any{
		"GET /v1/sandboxes":                 []api.Sandbox{sb},
		"GET /v1/sandboxes/box":             sb,
		"GET /v1/sandboxes/box/processes":   []api.Process{{PID: 7, Cmd: []string{"sh", "-c", evil, evil + "x"}, StartedAt: now, Exit: &api.ExitStatus{ExitCode: -1, Signal: evil}}},
		"GET /v1/sandboxes/box/network":     api.Network{Mode: api.NetAllowlist, Allow: []string{evil}, Address: "10.89.0.2/30", Gateway: "10.89.0.1"},
		"GET /v1/sandboxes/box/network/log": api.NetLog{Entries: []api.NetLogEntry{{Time: now, Kind: "dns", Destination: evil + " A", Reason: "not-allowed", Detail: evil}}},
		"GET /v1/sandboxes/box/snapshots":   []api.Snapshot{{ID: "s1", Name: evil, Sandbox: "box", CreatedAt: now}, {ID: "s2", Name: evil, Parent: "s1", CreatedAt: now}},
		"GET /v1/sandboxes/box/files/list":  api.FileList{Path: "/root", Entries: []api.FileInfo{file}},
		"GET /v1/sandboxes/box/files/stat":  file,
		"GET /v1/tokens":                    []api.Token{{ID: "t1", Name: evil, CreatedAt: now}},
		"GET /v1/sandboxes/box/files/watch": api.FileEvent{Type: evil, Path: "/root/" + evil, Time: now},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("path") == "/missing" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			json.NewEncoder(w).Encode(api.ErrorBody{Error: api.Error{Code: api.CodeNotFound, Message: "stat /missing/" + evil + ": no such file"}})
			return
		}
		if r.Method == http.MethodDelete {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			json.NewEncoder(w).Encode(api.ErrorBody{Error: api.Error{Code: api.CodeNotFound, Message: "no sandbox " + evil}})
			return
		}
		v, ok := answers[r.Method+" "+r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(v) // one line: the watch's one event, then the stream ends
	}))
	defer srv.Close()
	t.Setenv("NOOK_HOST", srv.URL)
	t.Setenv("NOOK_TOKEN", "")

	for _, tc := range []struct {
		args   []string
		answer string // the daemon's answer --json must print exactly
	}{
		{[]string{"fs", "ls", "box:/root"}, "GET /v1/sandboxes/box/files/list"},
		{[]string{"fs", "ls", "-r", "box:/root"}, "GET /v1/sandboxes/box/files/list"},
		{[]string{"fs", "stat", "box:/root/x"}, "GET /v1/sandboxes/box/files/stat"},
		{[]string{"fs", "stat", "box:/missing"}, ""},
		{[]string{"fs", "watch", "box:/root"}, "GET /v1/sandboxes/box/files/watch"},
		{[]string{"ps", "box"}, "GET /v1/sandboxes/box/processes"},
		{[]string{"ls"}, "GET /v1/sandboxes"},
		{[]string{"inspect", "box"}, "GET /v1/sandboxes/box"},
		{[]string{"net", "box"}, "GET /v1/sandboxes/box/network"},
		{[]string{"net", "log", "box"}, "GET /v1/sandboxes/box/network/log"},
		{[]string{"snapshots", "box"}, "GET /v1/sandboxes/box/snapshots"},
		{[]string{"token", "ls"}, ""},
		{[]string{"rm", "a", "b"}, ""}, // two errors, one line each
	} {
		name := strings.Join(tc.args, " ")
		var stdout, stderr bytes.Buffer
		Main(tc.args, &stdout, &stderr)
		for stream, b := range map[string][]byte{"stdout": stdout.Bytes(), "stderr": stderr.Bytes()} {
			if bad := terminalControls(b); bad != "" {
				t.Errorf("nook %s: %s holds %s:\n%q", name, stream, bad, b)
			}
		}
		all := stdout.String() + stderr.String()
		if !strings.Contains(all, `x\x1b]0;pwned\a\u009b2J`) {
			t.Errorf("nook %s: the name is not shown escaped:\n%s", name, all)
		}
		if strings.Contains(all, "\nfake line") {
			t.Errorf("nook %s: the sandbox forged a line:\n%s", name, all)
		}
		if tc.answer == "" {
			continue
		}
		stdout.Reset()
		stderr.Reset()
		Main(append(tc.args, "--json"), &stdout, &stderr)
		want, _ := json.Marshal(answers[tc.answer])
		var got, wantV any
		json.Unmarshal(want, &wantV)
		if err := json.Unmarshal(stdout.Bytes(), &got); err != nil || !reflect.DeepEqual(got, wantV) {
			t.Errorf("nook %s --json: %v\n%s\nwant\n%s", name, err, stdout.Bytes(), want)
		}
	}
}

// terminalControls describes the first thing in b a terminal would act
// on (a control character but newline, invalid UTF-8, a bidi control),
// or returns "".
func terminalControls(b []byte) string {
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			return "invalid UTF-8"
		case r < 0x20 && r != '\n', r >= 0x7f && r <= 0x9f:
			return fmt.Sprintf("the control character %U", r)
		case r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069, r == 0x2028, r == 0x2029:
			return "a bidi or line control"
		}
		i += size
	}
	return ""
}
