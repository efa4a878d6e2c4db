package sdnotify

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// listen holds a datagram socket as systemd does, at name (a path, or
// @NAME in the abstract namespace).
func listen(t *testing.T, name string) *net.UnixConn {
	t.Helper()
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// receive reads one datagram.
func receive(t *testing.T, c *net.UnixConn) string {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 4096)
	n, err := c.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	return string(buf[:n])
}

func TestSendPathAndAbstract(t *testing.T) {
	for name, addr := range map[string]string{
		"path":     filepath.Join(t.TempDir(), "notify"),
		"abstract": fmt.Sprintf("@nook-sdnotify-test-%d-%d", os.Getpid(), time.Now().UnixNano()),
	} {
		t.Run(name, func(t *testing.T) {
			c := listen(t, addr)
			t.Setenv(EnvSocket, addr)
			n, err := FromEnv()
			if err != nil || n == nil {
				t.Fatalf("FromEnv with %s=%s: %v, %v", EnvSocket, addr, n, err)
			}
			if v, ok := os.LookupEnv(EnvSocket); ok {
				t.Fatalf("%s is still set (%q): children would inherit it", EnvSocket, v)
			}
			if err := n.Send(Ready, Status("serving"), MainPID()); err != nil {
				t.Fatal(err)
			}
			want := fmt.Sprintf("READY=1\nSTATUS=serving\nMAINPID=%d\n", os.Getpid())
			if got := receive(t, c); got != want {
				t.Fatalf("received %q, want %q", got, want)
			}
			if err := n.Send(Stopping); err != nil {
				t.Fatal(err)
			}
			if got := receive(t, c); got != "STOPPING=1\n" {
				t.Fatalf("received %q, want STOPPING=1", got)
			}
		})
	}
}

// The variable is gone from what a started process inherits.
func TestChildrenDoNotInherit(t *testing.T) {
	t.Setenv(EnvSocket, "@nook-sdnotify-child")
	if _, err := FromEnv(); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("env").Output()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), EnvSocket) {
		t.Fatalf("a child's environment has %s:\n%s", EnvSocket, out)
	}
}

func TestUnsetIsNoop(t *testing.T) {
	t.Setenv(EnvSocket, "")
	os.Unsetenv(EnvSocket)
	n, err := FromEnv()
	if n != nil || err != nil {
		t.Fatalf("FromEnv without %s: %v, %v; want nil, nil", EnvSocket, n, err)
	}
	if err := n.Send(Ready); err != nil {
		t.Fatalf("a nil Notifier's Send: %v", err)
	}
}

func TestErrors(t *testing.T) {
	t.Setenv(EnvSocket, "vsock:2:1234")
	if _, err := FromEnv(); err == nil || !strings.Contains(err.Error(), "vsock:2:1234") {
		t.Fatalf("FromEnv with a vsock address: %v; want an error naming it", err)
	}
	if _, ok := os.LookupEnv(EnvSocket); ok {
		t.Fatalf("%s is still set after an error", EnvSocket)
	}
	// Nobody listening: an error to log, not a hang.
	t.Setenv(EnvSocket, filepath.Join(t.TempDir(), "absent"))
	n, err := FromEnv()
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Send(Ready); err == nil {
		t.Fatal("Send to a socket nobody holds succeeded")
	}
	c := listen(t, filepath.Join(t.TempDir(), "notify"))
	n = &Notifier{addr: c.LocalAddr().(*net.UnixAddr)}
	for _, bad := range []string{"READY", "STATUS=a\nREADY=1"} {
		if err := n.Send(bad); err == nil {
			t.Errorf("Send(%q) succeeded", bad)
		}
	}
}
