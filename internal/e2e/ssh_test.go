package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/testutil"
)

// sshClient runs OpenSSH's client tools against a daemon's SSH endpoint.
type sshClient struct {
	t          *testing.T
	d          *daemon
	dir        string
	host, port string
	known      string // known_hosts pinning the daemon's host key
}

func newSSHClient(t *testing.T, d *daemon, addr string) *sshClient {
	t.Helper()
	testutil.RequireCommand(t, "ssh", "openssh-client")
	var info api.Info
	if err := json.Unmarshal([]byte(d.must("info", "--json")), &info); err != nil {
		t.Fatal(err)
	}
	if info.SSH == nil || info.SSH.HostKey == "" || !strings.HasPrefix(info.SSH.Fingerprint, "SHA256:") {
		t.Fatalf("nook info says no SSH endpoint: %+v", info.SSH)
	}
	host, port, _ := net.SplitHostPort(addr)
	c := &sshClient{t: t, d: d, dir: t.TempDir(), host: host, port: port}
	c.known = filepath.Join(c.dir, "known_hosts")
	if err := os.WriteFile(c.known, []byte(fmt.Sprintf("[%s]:%s %s\n", host, port, info.SSH.HostKey)), 0o600); err != nil {
		t.Fatal(err)
	}
	return c
}

// key makes an Ed25519 key pair; it returns the private key's path.
func (c *sshClient) key(name string) string {
	c.t.Helper()
	p := filepath.Join(c.dir, name)
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", p).CombinedOutput(); err != nil {
		c.t.Fatalf("ssh-keygen: %v\n%s", err, out)
	}
	return p
}

// opts are the options every client call uses: this key only, the
// pinned host key, never a prompt.
func (c *sshClient) opts(key string) []string {
	return []string{"-i", key, "-o", "IdentitiesOnly=yes", "-o", "UserKnownHostsFile=" + c.known, "-o", "GlobalKnownHostsFile=/dev/null",
		"-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=20", "-F", "/dev/null"}
}

// run runs a client tool with stdin, within two minutes.
func (c *sshClient) run(stdin io.Reader, name string, args ...string) result {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), "NOOK_HOST=unix://"+c.d.socket())
	var stdout, stderr bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, &stdout, &stderr
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	case err != nil:
		c.t.Fatalf("%s: %v", name, err)
	}
	return r
}

// ssh runs `ssh login@host args...` with key.
func (c *sshClient) ssh(stdin io.Reader, key, login string, args ...string) result {
	c.t.Helper()
	a := append(c.opts(key), "-p", c.port, login+"@"+c.host)
	return c.run(stdin, "ssh", append(a, args...)...)
}

// sshTo runs a command over ssh with its stdout into w; the bytes
// written and the exit code.
func (c *sshClient) sshTo(w io.Writer, key, login string, args ...string) (int64, int) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ssh", append(append(c.opts(key), "-p", c.port, login+"@"+c.host), args...)...)
	cw := &countingWriter{w: w}
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = cw, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		c.t.Logf("ssh %s: %s", login, stderr.String())
		return cw.n, ee.ExitCode()
	case err != nil:
		c.t.Fatalf("ssh: %v", err)
	}
	return cw.n, 0
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// must runs a command over ssh that must succeed; its stdout.
func (c *sshClient) must(key, login string, args ...string) string {
	c.t.Helper()
	r := c.ssh(nil, key, login, args...)
	if r.code != 0 {
		c.t.Fatalf("ssh %s %v: exit %d\nstdout: %s\nstderr: %s", login, args, r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// refused checks that key cannot log in as login.
func (c *sshClient) refused(key, login, why string) {
	c.t.Helper()
	r := c.ssh(nil, key, login, "true")
	if r.code != 255 || !strings.Contains(r.stderr, "Permission denied") {
		c.t.Fatalf("%s: ssh %s logged in or failed otherwise: exit %d, stderr %s", why, login, r.code, r.stderr)
	}
}

func randomFile(t *testing.T, path string, size int) string {
	t.Helper()
	b := make([]byte, size)
	rand.Read(b)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func fileSum(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// TestSSH drives nook's SSH endpoint with the real OpenSSH client: what
// a person at a terminal, scp, sftp and editors' remote modes do, and the
// logins it must refuse.
func TestSSH(t *testing.T) {
	addr := freeAddr(t)
	d := newDaemon(t, "--ssh-listen", addr, "--min-idle-pause", "1s")
	c := newSSHClient(t, d, addr)
	keyA, keyB := c.key("a"), c.key("b")
	d.must("create", "--name", "ssha", "--ssh-key", keyA+".pub")
	d.must("create", "--name", "sshb")

	// A command: its stdout and stderr apart, its exit status.
	r := c.ssh(nil, keyA, "ssha", "echo out; echo err >&2; exit 3")
	if r.code != 3 || r.stdout != "out\n" || !strings.Contains(r.stderr, "err") {
		t.Fatalf("ssh command: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if got := strings.TrimSpace(c.must(keyA, "ssha", "id -un; pwd")); got != "root\n/root" {
		t.Fatalf("login as the default user: %q", got)
	}
	// NAME+USER: that user, its login shell, its home.
	d.must("exec", "ssha", "--", "useradd", "-m", "-s", "/bin/bash", "dev")
	if got := strings.TrimSpace(c.must(keyA, "ssha+dev", "id -un; pwd; echo $SHELL")); got != "dev\n/home/dev\n/bin/bash" {
		t.Fatalf("NAME+USER logs in as %q, not dev", got)
	}
	// A user whose shell is nologin gets what sshd gives it.
	if r := c.ssh(nil, keyA, "ssha+nobody", "id -un"); r.code == 0 || !strings.Contains(r.stdout+r.stderr, "not available") {
		t.Fatalf("nobody (shell nologin) logged in: exit %d %q %q", r.code, r.stdout, r.stderr)
	}

	// Environment: what AcceptEnv allows, and nothing else.
	if got := strings.TrimSpace(c.must(keyA, "ssha", "-o", "SetEnv=LC_NOOK=yes EVIL=1", `echo "$LC_NOOK/${EVIL:-unset}"`)); got != "yes/unset" {
		t.Fatalf("environment passed: %q, want yes/unset", got)
	}

	// A pipe through, both ways, whole.
	up := filepath.Join(c.dir, "up.bin")
	sum := randomFile(t, up, 48<<20)
	f, _ := os.Open(up)
	r = c.ssh(f, keyA, "ssha", "sha256sum")
	f.Close()
	if r.code != 0 || !strings.HasPrefix(r.stdout, sum) {
		t.Fatalf("stdin through ssh: %q (want %s), %s", r.stdout, sum, r.stderr)
	}
	if r = c.ssh(nil, keyA, "ssha", "head -c 50331648 /dev/zero"); r.code != 0 || len(r.stdout) != 48<<20 {
		t.Fatalf("stdout through ssh: %d bytes, exit %d", len(r.stdout), r.code)
	}
	// 1 GiB both ways, streamed (no file on the test's side), whole.
	gib := int64(1 << 30)
	sent := sha256.New()
	r = c.ssh(io.TeeReader(io.LimitReader(rand.Reader, gib), sent), keyA, "ssha", "tee /tmp/big | sha256sum")
	if want := hex.EncodeToString(sent.Sum(nil)); r.code != 0 || !strings.HasPrefix(r.stdout, want) {
		t.Fatalf("1 GiB into the sandbox: exit %d, %q (want %s): %s", r.code, r.stdout, want, r.stderr)
	}
	recv := sha256.New()
	n, code := c.sshTo(recv, keyA, "ssha", "cat /tmp/big && rm /tmp/big")
	if code != 0 || n != gib || !bytes.Equal(recv.Sum(nil), sent.Sum(nil)) {
		t.Fatalf("1 GiB out of the sandbox: exit %d, %d bytes, sum differs: %v", code, n, !bytes.Equal(recv.Sum(nil), sent.Sum(nil)))
	}

	// scp both ways (OpenSSH's scp speaks SFTP).
	scp := func(args ...string) {
		t.Helper()
		a := append(c.opts(keyA), "-P", c.port)
		if r := c.run(nil, "scp", append(a, args...)...); r.code != 0 {
			t.Fatalf("scp %v: exit %d: %s", args, r.code, r.stderr)
		}
	}
	scp(up, "ssha@"+c.host+":/tmp/up.bin")
	if got := c.must(keyA, "ssha", "sha256sum /tmp/up.bin"); !strings.HasPrefix(got, sum) {
		t.Fatalf("scp up: %q, want %s", got, sum)
	}
	down := filepath.Join(c.dir, "down.bin")
	scp("ssha@"+c.host+":/tmp/up.bin", down)
	if fileSum(t, down) != sum {
		t.Fatal("scp down: the file differs")
	}

	// sftp: ls, put, get, rename, mkdir, rm.
	batch := filepath.Join(c.dir, "batch")
	got := filepath.Join(c.dir, "got.bin")
	os.WriteFile(batch, []byte(fmt.Sprintf("mkdir /tmp/sd\nput %s /tmp/sd/f\nrename /tmp/sd/f /tmp/sd/g\nls -l /tmp/sd\nget /tmp/sd/g %s\nrm /tmp/sd/g\nrmdir /tmp/sd\n", up, got)), 0o644)
	r = c.run(nil, "sftp", append(c.opts(keyA), "-P", c.port, "-b", batch, "ssha@"+c.host)...)
	if r.code != 0 || !strings.Contains(r.stdout, "/tmp/sd/g") {
		t.Fatalf("sftp batch: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	if fileSum(t, got) != sum {
		t.Fatal("sftp get: the file differs")
	}
	// SFTP runs as the login user: the kernel checks what it may touch.
	os.WriteFile(batch, []byte(fmt.Sprintf("put %s /home/dev/mine\n-put %s /etc/passwd\n-rm /etc/hostname\n", up, up)), 0o644)
	r = c.run(nil, "sftp", append(c.opts(keyA), "-P", c.port, "-b", batch, "ssha+dev@"+c.host)...)
	if r.code != 0 || !strings.Contains(r.stderr, "ermission denied") {
		t.Fatalf("sftp as dev: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	if got := c.must(keyA, "ssha", "stat -c %U /home/dev/mine; test -s /etc/hostname && grep -c root /etc/passwd"); got != "dev\n1\n" {
		t.Fatalf("after sftp as dev: %q", got)
	}
	if r := c.ssh(nil, keyA, "ssha", "test -e /tmp/sd"); r.code != 1 {
		t.Fatalf("sftp rmdir left /tmp/sd (exit %d)", r.code)
	}

	// Port forwarding to the sandbox's own loopback (-W and -L use
	// direct-tcpip, as editors' remote modes do), and nowhere else.
	d.must("exec", "-d", "ssha", "--", "python3", "-m", "http.server", "8000", "--bind", "127.0.0.1", "--directory", "/etc")
	waitWithin(t, "the sandbox's web server", 30*time.Second, func() bool {
		return d.sh("ssha", "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 8000), 1)'").code == 0
	})
	r = c.ssh(strings.NewReader("GET /hostname HTTP/1.0\r\n\r\n"), keyA, "ssha", "-W", "localhost:8000")
	if r.code != 0 || !strings.Contains(r.stdout, "200 OK") {
		t.Fatalf("ssh -W localhost:8000: exit %d: %s %s", r.code, r.stdout, r.stderr)
	}
	// The client's EOF reaches the sandbox's server (which answers it),
	// and the forward ends when both sides are done.
	echo := `import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", 9000)); s.listen()
while True:
    c, _ = s.accept(); got = b""
    while True:
        b = c.recv(65536)
        if not b: break
        got += b
    c.sendall(got + b" bye"); c.close()`
	d.must("exec", "-d", "ssha", "--", "python3", "-c", echo)
	waitWithin(t, "the sandbox's echo server", 30*time.Second, func() bool {
		return d.sh("ssha", "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 9000), 1)'").code == 0
	})
	if r = c.ssh(strings.NewReader("hello"), keyA, "ssha", "-W", "localhost:9000"); r.code != 0 || r.stdout != "hello bye" {
		t.Fatalf("ssh -W with EOF: exit %d, %q, %s", r.code, r.stdout, r.stderr)
	}
	if r = c.ssh(strings.NewReader(""), keyA, "ssha", "-W", "10.0.0.1:80"); r.code == 0 || !strings.Contains(r.stderr, "prohibited") {
		t.Fatalf("ssh -W to another host: exit %d: %s", r.code, r.stderr)
	}
	lport := strings.Split(freeAddr(t), ":")[1]
	fwd := exec.Command("ssh", append(c.opts(keyA), "-N", "-L", "127.0.0.1:"+lport+":localhost:8000", "-p", c.port, "ssha@"+c.host)...)
	if err := fwd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fwd.Process.Kill(); fwd.Wait() })
	waitWithin(t, "ssh -L to the sandbox's web server", 30*time.Second, func() bool {
		resp, err := http.Get("http://127.0.0.1:" + lport + "/hostname")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	fwd.Process.Signal(syscall.SIGTERM)

	// A PTY: a login shell on a terminal of the client's size, resized.
	testutil.RequireCommand(t, "tmux", "tmux")
	sock := filepath.Join(c.dir, "tmux.sock")
	tmux := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("tmux", append([]string{"-S", sock}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("tmux %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	sshLine := "ssh " + strings.Join(c.opts(keyA), " ") + " -p " + c.port + " ssha@" + c.host
	tmux("new-session", "-d", "-s", "t", "-x", "100", "-y", "30", sshLine)
	t.Cleanup(func() { exec.Command("tmux", "-S", sock, "kill-server").Run() })
	screen := func(want string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			pane := tmux("capture-pane", "-p", "-t", "t")
			if strings.Contains(pane, want) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the terminal does not show %q:\n%s", want, pane)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	term := strings.TrimSpace(tmux("show-options", "-g", "-v", "default-terminal"))
	tmux("send-keys", "-t", "t", "tty; stty size; echo TERM=$TERM", "Enter")
	screen("30 100")
	screen("TERM=" + term)
	screen("/dev/pts/")
	tmux("resize-window", "-t", "t", "-x", "120", "-y", "40")
	tmux("send-keys", "-t", "t", "clear; stty size", "Enter")
	screen("40 120")
	tmux("send-keys", "-t", "t", "exit", "Enter")

	// Logins refused: a key nobody registered, a key of another sandbox.
	c.refused(keyB, "ssha", "an unregistered key")
	c.refused(keyA, "sshb", "sandbox ssha's key on sshb")
	c.refused(keyA, "nosuch", "a sandbox that does not exist")
	// A key the host registers without a sandbox logs in everywhere,
	// until it is removed.
	d.must("ssh-key", "add", keyB+".pub")
	c.must(keyB, "sshb", "true")
	var keys []api.SSHKey
	json.Unmarshal([]byte(d.must("ssh-key", "ls", "--json")), &keys)
	if len(keys) != 1 || keys[0].Sandbox != "" || keys[0].Owner != "host" {
		t.Fatalf("token-wide keys: %+v", keys)
	}
	d.must("ssh-key", "rm", keys[0].ID)
	c.refused(keyB, "sshb", "a removed key")
	// Sandbox keys: listed with their sandbox, and added later.
	d.must("ssh-key", "add", "sshb", keyB+".pub")
	c.must(keyB, "sshb", "true")
	c.refused(keyB, "ssha", "sshb's key on ssha")

	// nook ssh: a certificate for this login, the host key pinned.
	if got := d.must("ssh", "ssha", "--", "echo", "via-cert"); strings.TrimSpace(got) != "via-cert" {
		t.Fatalf("nook ssh: %q", got)
	}
	// A certificate is for one sandbox, one user, until it expires.
	keyC := c.key("c")
	pub, _ := os.ReadFile(keyC + ".pub")
	var cert api.SSHCert
	body, _ := json.Marshal(api.SSHCertRequest{PublicKey: string(pub), TTL: "3s"})
	out := c.run(bytes.NewReader(body), "curl", "-sS", "-f", "--unix-socket", d.socket(), "-H", "Content-Type: application/json", "--data-binary", "@-", "http://nook/v1/sandboxes/ssha/ssh-cert")
	if out.code != 0 || json.Unmarshal([]byte(out.stdout), &cert) != nil || cert.Login != "ssha" {
		t.Fatalf("ssh-cert: %d %s %s", out.code, out.stdout, out.stderr)
	}
	os.WriteFile(keyC+"-cert.pub", []byte(cert.Certificate+"\n"), 0o600)
	c.must(keyC, "ssha", "true")
	c.refused(keyC, "sshb", "a certificate for ssha on sshb")
	c.refused(keyC, "ssha+dev", "a certificate for the default user as dev")
	waitWithin(t, "the certificate to expire", 30*time.Second, func() bool { return time.Now().After(cert.ValidBefore.Add(time.Second)) })
	c.refused(keyC, "ssha", "an expired certificate")

	// A paused sandbox wakes on login.
	d.must("pause", "ssha")
	c.must(keyA, "ssha", "true")
	if st := d.inspect("ssha").State; st != "running" {
		t.Fatalf("after ssh to a paused sandbox it is %s", st)
	}

	// nook ssh-config: a block ssh uses as is, the host key checked by
	// KnownHostsCommand.
	cfg := filepath.Join(c.dir, "config")
	os.WriteFile(cfg, []byte(d.must("ssh-config", "ssha")), 0o600)
	r = c.run(nil, "ssh", "-F", cfg, "-i", keyA, "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes", "-o", "UserKnownHostsFile=/dev/null", "nook-ssha", "echo", "from-config")
	if r.code != 0 || strings.TrimSpace(r.stdout) != "from-config" {
		t.Fatalf("ssh with nook ssh-config's block: exit %d: %s %s", r.code, r.stdout, r.stderr)
	}

	// An SSH session is use of its sandbox only while it has traffic: a
	// command that writes keeps an idle pause away, an open silent shell
	// does not (and is told why it ended).
	d.must("create", "--name", "sshidle", "--idle-pause", "2s", "--ssh-key", keyA+".pub")
	if out := c.must(keyA, "sshidle", "for i in $(seq 20); do echo $i; sleep 0.25; done"); !strings.HasSuffix(out, "\n20\n") {
		t.Fatalf("a talking session: %q", out)
	}
	if sb := d.inspect("sshidle"); sb.State != "running" {
		t.Fatalf("a sandbox whose SSH session talked for 5 s (idle pause 2s) is %s", sb.State)
	}
	tmux("new-session", "-d", "-s", "idle", "-x", "80", "-y", "24", "ssh "+strings.Join(c.opts(keyA), " ")+" -p "+c.port+" sshidle@"+c.host+"; echo SESSION-ENDED; sleep 600")
	waitWithin(t, "the idle shell's prompt", 30*time.Second, func() bool { return strings.Contains(tmux("capture-pane", "-p", "-t", "idle"), "#") })
	d.waitState("sshidle", "paused", 60*time.Second)
	waitWithin(t, "the paused sandbox's session to end", 30*time.Second, func() bool {
		return strings.Contains(tmux("capture-pane", "-p", "-t", "idle"), "SESSION-ENDED")
	})
	c.must(keyA, "sshidle", "true") // and a login wakes it

	// A sandbox's keys go with it, and a connection open to it reaches no
	// later sandbox of the same name.
	ctl := filepath.Join(c.dir, "ctl")
	master := exec.Command("ssh", append(c.opts(keyB), "-o", "ControlMaster=yes", "-o", "ControlPath="+ctl, "-N", "-p", c.port, "sshb@"+c.host)...)
	if err := master.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { master.Process.Kill(); master.Wait() })
	waitWithin(t, "the SSH control socket", 30*time.Second, func() bool { _, err := os.Stat(ctl); return err == nil })
	mux := func() result {
		return c.run(nil, "ssh", append(c.opts(keyB), "-o", "ControlPath="+ctl, "-p", c.port, "sshb@"+c.host, "hostname")...)
	}
	if r := mux(); r.code != 0 {
		t.Fatalf("a session over the open connection: exit %d: %s", r.code, r.stderr)
	}
	d.must("rm", "sshb")
	d.must("create", "--name", "sshb")
	c.refused(keyB, "sshb", "the key of a removed sandbox of the same name")
	if r := mux(); r.code == 0 {
		t.Fatalf("a connection to the removed sshb opened a session in the new one: %q", r.stdout)
	}
}
