package bench

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"text/tabwriter"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/network/nettest"
	"github.com/nookhq/nook/internal/quickack"
)

// Reaching a sandbox as a machine: the SSH endpoint and preview URLs
// (internal/sshd, internal/preview), each beside what nook did before
// for the same job, in one daemon in the simulated host.

const (
	benchSSHListen     = "127.0.0.1:2222"
	benchPreviewListen = "127.0.0.1:8080"
	// benchApp answers GET with "ok", HTTP/1.1 with keep-alive.
	benchApp = `
import http.server
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")
http.server.ThreadingHTTPServer(("0.0.0.0", 8000), H).serve_forever()
`
)

func runRemote(ctx context.Context, cfg Config, root string, s *simNet) error {
	if _, err := exec.LookPath("ssh"); err != nil {
		fmt.Fprintln(cfg.Out, "SSH and preview benchmarks skipped: OpenSSH's ssh is not installed (make deps installs openssh-client)")
		return nil
	}
	d, err := startProcDaemon(ctx, cfg, s, filepath.Join(root, "remote"), "--warm-pool", "-1", "--network=true",
		"--ssh-listen", benchSSHListen, "--preview-listen", benchPreviewListen)
	if err != nil {
		return err
	}
	defer d.stop()
	cl := d.cl
	const name = "remote"
	if _, err := cl.CreateSandbox(ctx, api.CreateSandboxRequest{Name: name}); err != nil {
		return err
	}
	dir := filepath.Join(root, "remote-client")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	spub, _ := ssh.NewPublicKey(pub)
	block, err := ssh.MarshalPrivateKey(priv, "bench")
	if err != nil {
		return err
	}
	key := filepath.Join(dir, "id")
	if err := os.WriteFile(key, pem.EncodeToMemory(block), 0o600); err != nil {
		return err
	}
	if _, err := cl.AddSSHKey(ctx, name, string(ssh.MarshalAuthorizedKey(spub))); err != nil {
		return err
	}
	info, err := cl.Info(ctx)
	if err != nil || info.SSH == nil {
		return fmt.Errorf("the daemon's SSH endpoint: %v", err)
	}
	known := filepath.Join(dir, "known_hosts")
	host, port, _ := net.SplitHostPort(benchSSHListen)
	if err := os.WriteFile(known, []byte(fmt.Sprintf("[%s]:%s %s\n", host, port, info.SSH.HostKey)), 0o600); err != nil {
		return err
	}
	netns := fmt.Sprintf("--net=/proc/%d/fd/%d", os.Getpid(), int(s.host))
	nook := filepath.Join(filepath.Dir(cfg.AgentBinary), "nook")
	// Both clients start in the simulated host through nsenter: the same
	// cost on each side.
	sshCmd := func(remote string) *exec.Cmd {
		return exec.CommandContext(ctx, "nsenter", netns, "ssh", "-F", "/dev/null", "-i", key, "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
			"-o", "UserKnownHostsFile="+known, "-o", "StrictHostKeyChecking=yes", "-p", port, name+"@"+host, remote)
	}
	nookCmd := func(args ...string) *exec.Cmd {
		c := exec.CommandContext(ctx, "nsenter", append([]string{netns, nook}, args...)...)
		c.Env = append(os.Environ(), "NOOK_HOST=unix://"+d.socket())
		return c
	}
	run := func(c *exec.Cmd) (time.Duration, error) {
		var stderr bytes.Buffer
		c.Stderr = &stderr
		start := time.Now()
		if err := c.Run(); err != nil {
			return 0, fmt.Errorf("%v: %v: %s", c.Args, err, stderr.String())
		}
		return time.Since(start), nil
	}

	fmt.Fprintln(cfg.Out, "remote: ssh NAME@host true beside nook exec NAME -- true, 30 each, alternating...")
	var viaSSH, viaNook []time.Duration
	for i := 0; i < 30; i++ {
		t, err := run(sshCmd("true"))
		if err != nil {
			return err
		}
		viaSSH = append(viaSSH, t)
		if t, err = run(nookCmd("exec", name, "--", "true")); err != nil {
			return err
		}
		viaNook = append(viaNook, t)
	}

	fmt.Fprintln(cfg.Out, "remote: 1 GiB through ssh (stdout and stdin) beside nook exec's stream...")
	const size = 1 << 30
	rate := func(c *exec.Cmd) (float64, error) {
		t, err := run(c)
		if err != nil {
			return 0, err
		}
		return float64(size) / t.Seconds() / 1e6, nil
	}
	down := fmt.Sprintf("head -c %d /dev/zero", size)
	var sshDown, sshUp, nookDown []float64
	for i := 0; i < 3; i++ {
		c := sshCmd(down)
		c.Stdout = io.Discard
		r, err := rate(c)
		if err != nil {
			return err
		}
		sshDown = append(sshDown, r)
		c = sshCmd(fmt.Sprintf("head -c %d > /dev/null", size))
		c.Stdin = io.LimitReader(zeroReader{}, size)
		if r, err = rate(c); err != nil {
			return err
		}
		sshUp = append(sshUp, r)
		c = nookCmd("exec", name, "--", "head", "-c", fmt.Sprint(size), "/dev/zero")
		c.Stdout = io.Discard
		if r, err = rate(c); err != nil {
			return err
		}
		nookDown = append(nookDown, r)
	}

	fmt.Fprintln(cfg.Out, "remote: HTTP GET (keep-alive) through the preview URL beside the exposed TCP forward, 300 each, alternating...")
	if _, err := cl.Start(ctx, name, api.ExecRequest{Cmd: []string{"python3", "-c", benchApp}}); err != nil {
		return err
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		st, err := cl.Exec(ctx, name, api.ExecRequest{Cmd: []string{"python3", "-c", "import socket; socket.create_connection(('127.0.0.1', 8000), 1)"}}, io.Discard, io.Discard)
		if err == nil && st.ExitCode == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the sandbox's web app did not start")
		}
	}
	e, err := cl.ExposePort(ctx, name, api.ExposeRequest{Port: 8000, Auth: api.PreviewAuthNone})
	if err != nil {
		return err
	}
	if e.URL == "" {
		return fmt.Errorf("expose gave no preview URL")
	}
	// The clients ask for quick ACKs, as the preview's side in the
	// sandbox does: Python's server writes headers and body apart with
	// Nagle on, and a delayed ACK would stall either path by 40 ms.
	client := func(addr string) *http.Client {
		return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 1, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			c, err := nettest.DialNS(ctx, s.host, addr, 5*time.Second)
			if err != nil {
				return nil, err
			}
			return quickack.Wrap(c), nil
		}}}
	}
	preview, direct := client(benchPreviewListen), client(e.HostAddress)
	get := func(c *http.Client, url string) (time.Duration, error) {
		start := time.Now()
		resp, err := c.Get(url)
		if err != nil {
			return 0, err
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || string(b) != "ok" {
			return 0, fmt.Errorf("GET %s: %d %q %v", url, resp.StatusCode, b, err)
		}
		return time.Since(start), nil
	}
	var viaPreview, viaForward []time.Duration
	for i := 0; i < 320; i++ {
		tp, err := get(preview, e.URL)
		if err != nil {
			return err
		}
		tf, err := get(direct, "http://"+e.HostAddress+"/")
		if err != nil {
			return err
		}
		if i >= 20 { // the first connections' setup left out: keep-alive is what is measured
			viaPreview, viaForward = append(viaPreview, tp), append(viaForward, tf)
		}
	}

	fmt.Fprintln(cfg.Out)
	tw := tabwriter.NewWriter(cfg.Out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "remote\tp50\tp99\tbaseline\tbaseline p50\tbaseline p99\tdifference p50\ttarget")
	fmt.Fprintf(tw, "ssh NAME@host true (OpenSSH client: handshake, login, exec)\t%s\t%s\tnook exec NAME -- true (CLI)\t%s\t%s\t%s\t-\n",
		ms(pct(viaSSH, .5)), ms(pct(viaSSH, .99)), ms(pct(viaNook, .5)), ms(pct(viaNook, .99)), ms(pct(viaSSH, .5)-pct(viaNook, .5)))
	fmt.Fprintf(tw, "HTTP GET through the preview URL (keep-alive)\t%s\t%s\tthe exposed TCP forward (keep-alive)\t%s\t%s\t%s\tadded <= 1ms\n",
		ms(pct(viaPreview, .5)), ms(pct(viaPreview, .99)), ms(pct(viaForward, .5)), ms(pct(viaForward, .99)), ms(pct(viaPreview, .5)-pct(viaForward, .5)))
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(cfg.Out)
	tw = tabwriter.NewWriter(cfg.Out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "1 GiB (median of 3)\tthroughput\tbaseline\tbaseline throughput\ttarget")
	fmt.Fprintf(tw, "ssh NAME 'head -c 1G /dev/zero' (sandbox -> client)\t%.0f MB/s\tnook exec's stream, the same command\t%.0f MB/s\t>= 200 MB/s\n", median(sshDown), median(nookDown))
	fmt.Fprintf(tw, "ssh NAME 'head -c 1G > /dev/null' < zeros (client -> sandbox)\t%.0f MB/s\t-\t-\t>= 200 MB/s\n", median(sshUp))
	return tw.Flush()
}
