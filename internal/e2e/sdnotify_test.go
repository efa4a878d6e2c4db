package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/testutil"
)

// notice is one datagram the daemon sent systemd's socket and, for a
// READY=1, what the API answered the moment it arrived.
type notice struct {
	fields  map[string]string
	api     []api.Sandbox
	apiErr  error
	arrived time.Time
}

// notifySocket holds a datagram socket as systemd does for a unit of
// Type=notify, and reads what comes: on READY=1 it lists the sandboxes at
// once, through the unix socket STATUS= names.
func notifySocket(t *testing.T) (string, <-chan notice) {
	t.Helper()
	path := filepath.Join(testutil.TempRoot(t), testutil.RandomName("notify"))
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ch := make(chan notice, 16)
	go func() {
		defer close(ch)
		buf := make([]byte, 4096)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return
			}
			nt := notice{fields: map[string]string{}, arrived: time.Now()}
			for _, line := range strings.Split(strings.TrimSpace(string(buf[:n])), "\n") {
				k, v, _ := strings.Cut(line, "=")
				nt.fields[k] = v
			}
			if nt.fields["READY"] == "1" {
				nt.api, nt.apiErr = listOver(strings.TrimPrefix(nt.fields["STATUS"], "serving on "))
			}
			ch <- nt
		}
	}()
	return path, ch
}

// listOver lists the sandboxes through the API on the unix socket at path.
func listOver(path string) ([]api.Sandbox, error) {
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", path)
	}}}
	resp, err := c.Get("http://nook/v1/sandboxes")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /v1/sandboxes: %s: %s", resp.Status, b)
	}
	var sbs []api.Sandbox
	if err := json.Unmarshal(b, &sbs); err != nil {
		return nil, fmt.Errorf("GET /v1/sandboxes: %w: %s", err, b)
	}
	return sbs, nil
}

func nextNotice(t *testing.T, ch <-chan notice, d *daemon) notice {
	t.Helper()
	select {
	case nt, ok := <-ch:
		if !ok {
			t.Fatal("the notify socket closed")
		}
		return nt
	case <-time.After(2 * time.Minute):
		t.Fatalf("no message on the notify socket in 2 minutes; daemon log:\n%s", d.log.String())
	}
	panic("unreachable")
}

// nook serve under systemd (packaging/nook.service, Type=notify): READY=1
// arrives once the API answers and the sandboxes a previous daemon left
// are re-adopted; STOPPING=1 when SIGTERM (systemctl stop) ends it, and
// the sandboxes outlive it.
func TestSystemdNotify(t *testing.T) {
	sock, notices := notifySocket(t)
	d := newDaemonInEnv(t, "", []string{"NOTIFY_SOCKET=" + sock})
	check := func() notice {
		t.Helper()
		nt := nextNotice(t, notices, d)
		if nt.fields["READY"] != "1" {
			t.Fatalf("the first message is %v, want READY=1", nt.fields)
		}
		if want := fmt.Sprint(d.cmd.Process.Pid); nt.fields["MAINPID"] != want {
			t.Errorf("MAINPID=%s, want the daemon's %s", nt.fields["MAINPID"], want)
		}
		if want := "serving on " + d.socket(); nt.fields["STATUS"] != want {
			t.Errorf("STATUS=%q, want %q", nt.fields["STATUS"], want)
		}
		if nt.apiErr != nil {
			t.Fatalf("the API did not answer when READY=1 arrived: %v", nt.apiErr)
		}
		return nt
	}
	if nt := check(); len(nt.api) != 0 {
		t.Fatalf("a new daemon lists %v", nt.api)
	}
	d.must("create", "--name", "notify-one", "--ttl", "30m")

	d.stop(syscall.SIGTERM)
	nt := nextNotice(t, notices, d)
	if nt.fields["STOPPING"] != "1" {
		t.Fatalf("after SIGTERM the daemon sent %v, want STOPPING=1", nt.fields)
	}

	// The next start re-adopts the sandbox before it says it is ready.
	d.start()
	nt = check()
	if len(nt.api) != 1 || nt.api[0].Name != "notify-one" || nt.api[0].State != api.StateRunning {
		t.Fatalf("when READY=1 arrived after a restart the API listed %+v, want notify-one running", nt.api)
	}
	if got := d.must("exec", "notify-one", "--", "echo", "adopted"); got != "adopted\n" {
		t.Fatalf("exec after the restart printed %q", got)
	}
	d.must("rm", "notify-one")
}
