package sshd

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

func TestDecodeRequest(t *testing.T) {
	pty := ssh.Marshal(ptyRequest{Term: "xterm", Cols: 80, Rows: 24})
	v, err := decodeRequest("pty-req", pty)
	if err != nil || v.(*ptyRequest).Term != "xterm" || v.(*ptyRequest).Cols != 80 {
		t.Fatalf("pty-req: %v %+v", err, v)
	}
	if _, err := decodeRequest("pty-req", pty[:5]); err == nil {
		t.Fatal("a truncated pty-req decoded")
	}
	if _, err := decodeRequest("exec", []byte{0xff, 0xff, 0xff, 0xff}); err == nil {
		t.Fatal("an exec whose string length exceeds the payload decoded")
	}
	if v, err := decodeRequest("x11-req", nil); v != nil || err != nil {
		t.Fatalf("unknown request: %v %v", v, err)
	}
	if c, r := termSize(1<<31, 0); c != 4096 || r != 0 {
		t.Fatalf("termSize = %d %d", c, r)
	}
}

func TestSplitLogin(t *testing.T) {
	for _, tc := range []struct {
		login, name, user string
		ok                bool
	}{
		{"task", "task", "", true},
		{"task+dev", "task", "dev", true},
		{"task+", "", "", false},
		{"task+-o", "", "", false},
		{"task+a:b", "", "", false},
		{"Task", "", "", false},
		{"../x", "", "", false},
		{"", "", "", false},
	} {
		name, user, err := splitLogin(tc.login)
		if (err == nil) != tc.ok || name != tc.name || user != tc.user {
			t.Errorf("splitLogin(%q) = %q %q %v", tc.login, name, user, err)
		}
	}
}

func TestFindPasswd(t *testing.T) {
	pw := "root:x:0:0:root:/root:/bin/bash\nbroken\ndev:x:1000:1000::/home/dev:\nsvc:x:7:7::/srv:nologin\n"
	e, ok := findPasswd(strings.NewReader(pw), "dev")
	if !ok || e.home != "/home/dev" || e.shell != "/bin/sh" {
		t.Fatalf("dev: %+v %v", e, ok)
	}
	if e, ok := findPasswd(strings.NewReader(pw), "0"); !ok || e.name != "root" || e.shell != "/bin/bash" {
		t.Fatalf("uid 0: %+v %v", e, ok)
	}
	if e, _ := findPasswd(strings.NewReader(pw), "svc"); e.shell != "/bin/sh" {
		t.Fatalf("a relative shell must not be run: %+v", e)
	}
	if _, ok := findPasswd(strings.NewReader(pw), "nobody"); ok {
		t.Fatal("found a user that is not there")
	}
}

func TestForwardTarget(t *testing.T) {
	for _, h := range []string{"localhost", "127.0.0.1", "::1", "LOCALHOST"} {
		if err := forwardTarget(h, 8000); err != nil {
			t.Errorf("%s refused: %v", h, err)
		}
	}
	for _, h := range []string{"10.0.0.1", "example.com", "169.254.169.254", "127.0.0.2"} {
		if err := forwardTarget(h, 8000); err == nil {
			t.Errorf("%s allowed", h)
		}
	}
	if err := forwardTarget("localhost", 0); err == nil {
		t.Error("port 0 allowed")
	}
}

func TestEnvAccepted(t *testing.T) {
	s := &Server{acceptEnv: []string{"LANG", "LC_*"}}
	for name, want := range map[string]bool{"LANG": true, "LC_ALL": true, "LD_PRELOAD": false, "PATH": false, "LANGUAGE": false, "": false, "LC_X=Y": false} {
		if got := s.envAccepted(name); got != want {
			t.Errorf("envAccepted(%q) = %v", name, got)
		}
	}
}

// FuzzDecodeRequest feeds session requests a client controls to their
// decoder: errors, never panics, and sizes within bounds.
func FuzzDecodeRequest(f *testing.F) {
	f.Add("pty-req", ssh.Marshal(ptyRequest{Term: "xterm-256color", Cols: 120, Rows: 40, Modes: "\x00"}))
	f.Add("window-change", ssh.Marshal(windowChange{Cols: 1, Rows: 1}))
	f.Add("env", ssh.Marshal(envRequest{Name: "LANG", Value: "C.UTF-8"}))
	f.Add("exec", ssh.Marshal(stringRequest{Value: "echo hi"}))
	f.Add("subsystem", ssh.Marshal(stringRequest{Value: "sftp"}))
	f.Add("signal", ssh.Marshal(stringRequest{Value: "INT"}))
	f.Fuzz(func(t *testing.T, kind string, payload []byte) {
		v, err := decodeRequest(kind, payload)
		if err != nil {
			return
		}
		switch r := v.(type) {
		case *ptyRequest:
			c, rows := termSize(r.Cols, r.Rows)
			if c > 4096 || rows > 4096 {
				t.Fatalf("terminal size %dx%d beyond the clamp", c, rows)
			}
		case *envRequest:
			_ = (&Server{acceptEnv: []string{"LC_*"}}).envAccepted(r.Name)
		}
	})
}

// One address cannot hold more than maxHandshakesPerIP connections that
// have not logged in: the next is closed at once, and the slot comes
// back when one of them goes.
func TestHandshakesPerIP(t *testing.T) {
	s, err := New(nil, Config{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	defer func() { cancel(); <-done }()
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	// Each held connection has read the server's version line: the
	// server counts it by then.
	dial := func() (net.Conn, error) {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			return nil, err
		}
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil || !strings.HasPrefix(line, "SSH-2.0-nook") {
			c.Close()
			return nil, fmt.Errorf("%q %v", line, err)
		}
		return c, nil
	}
	for i := 0; i < maxHandshakesPerIP; i++ {
		c, err := dial()
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		held = append(held, c)
	}
	if c, err := dial(); err == nil {
		c.Close()
		t.Fatalf("connection %d from one address was served", maxHandshakesPerIP+1)
	}
	held[0].Close()
	held = held[1:]
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := dial()
		if err == nil {
			held = append(held, c)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the slot did not come back: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
