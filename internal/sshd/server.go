package sshd

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/daemon"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/quickack"
)

// Config configures the SSH endpoint.
type Config struct {
	// DataDir keeps the host key and the user CA (DataDir/ssh).
	DataDir string
	// AcceptEnv are the environment variables a client may pass (names,
	// or prefixes ending in *), as sshd's AcceptEnv; nil: LANG and LC_*.
	AcceptEnv []string
	// MaxConns caps the open connections (default 1024).
	MaxConns int
	Log      *slog.Logger
}

// Server is nook's SSH endpoint for every sandbox of one Manager.
type Server struct {
	m         *daemon.Manager
	log       *slog.Logger
	hostKey   ssh.Signer
	ca        ssh.Signer
	acceptEnv []string
	maxConns  int
	addr      atomic.Value // string: where it listens
	conns     atomic.Int64
	wg        sync.WaitGroup
	// perSandbox counts open connections by sandbox ID, handshakes those
	// not logged in yet by remote address.
	perSandbox capped
	handshakes capped
}

// Permissions extensions the authentication hands to the connection:
// the sandbox's ID and the login user, and what admitted it (a key's
// fingerprint, or the token a certificate was minted for), which every
// new channel checks again.
const (
	extSandboxID = "nook-sandbox-id"
	extUser      = "nook-user"
	extKey       = "nook-key"
	extCertToken = "nook-cert-token"
)

// certTokenExt is the certificate extension naming the API token that
// minted it ("" or absent: the host's socket): the certificate logs in
// only while that token is valid.
const certTokenExt = "nook-token@nook"

// maxConnsPerSandbox caps one sandbox's open SSH connections, and
// maxHandshakesPerIP the connections one address has not logged in on
// yet: a stranger cannot hold every connection slot with silent
// connections for the handshake's 30 s.
const (
	maxConnsPerSandbox = 32
	maxHandshakesPerIP = 16
)

// authTimeout bounds a login's work (the daemon's lookups) and the whole
// handshake.
const (
	lookupTimeout    = 10 * time.Second
	handshakeTimeout = 30 * time.Second
)

// New loads (or makes) the host key and the user CA in cfg.DataDir/ssh.
func New(m *daemon.Manager, cfg Config) (*Server, error) {
	dir := filepath.Join(cfg.DataDir, "ssh")
	host, err := loadSigner(filepath.Join(dir, "host_ed25519_key"), "nook host key")
	if err != nil {
		return nil, fmt.Errorf("ssh host key: %w", err)
	}
	ca, err := loadSigner(filepath.Join(dir, "user_ca_ed25519_key"), "nook user CA")
	if err != nil {
		return nil, fmt.Errorf("ssh user CA: %w", err)
	}
	s := &Server{m: m, log: cfg.Log, hostKey: host, ca: ca, acceptEnv: cfg.AcceptEnv, maxConns: cfg.MaxConns}
	s.perSandbox.max, s.handshakes.max = maxConnsPerSandbox, maxHandshakesPerIP
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.acceptEnv == nil {
		s.acceptEnv = []string{"LANG", "LC_*"}
	}
	if s.maxConns <= 0 {
		s.maxConns = 1024
	}
	s.addr.Store("")
	return s, nil
}

// SetAddress records where the endpoint listens, for Info, before Serve
// runs (Serve records it too).
func (s *Server) SetAddress(addr string) { s.addr.Store(addr) }

// Info describes the endpoint for /v1/info.
func (s *Server) Info() api.SSHInfo {
	return api.SSHInfo{
		Address:     s.addr.Load().(string),
		HostKey:     strings.TrimSpace(string(ssh.MarshalAuthorizedKey(s.hostKey.PublicKey()))),
		Fingerprint: ssh.FingerprintSHA256(s.hostKey.PublicKey()),
		UserCA:      strings.TrimSpace(string(ssh.MarshalAuthorizedKey(s.ca.PublicKey()))),
	}
}

// principal is what a certificate for sb (as user) names: the sandbox's
// ID, so that it is good for no later sandbox of the same name, and the
// user it logs in as.
func principal(sandboxID, user string) string {
	if user == "" {
		return sandboxID
	}
	return sandboxID + "+" + user
}

// SignCert certifies publicKey for logging in to sb as user ("" its
// default user) for ttl, for as long as the API token tokenID ("" the
// host's socket) is valid.
func (s *Server) SignCert(sb *core.Sandbox, user, publicKey, tokenID string, ttl time.Duration) (api.SSHCert, error) {
	pub, _, err := daemon.ParseSSHKey(publicKey)
	if err != nil {
		return api.SSHCert{}, err
	}
	if user != "" {
		if err := checkUser(user); err != nil {
			return api.SSHCert{}, err
		}
	}
	now := time.Now()
	serial := make([]byte, 8)
	rand.Read(serial)
	cert := &ssh.Certificate{
		Key:             pub,
		Serial:          binary.BigEndian.Uint64(serial),
		CertType:        ssh.UserCert,
		KeyId:           "nook:" + sb.Name,
		ValidPrincipals: []string{principal(sb.ID, user)},
		// A minute back: the client's clock may be behind the host's.
		ValidAfter:  uint64(now.Add(-time.Minute).Unix()),
		ValidBefore: uint64(now.Add(ttl).Unix()),
		Permissions: ssh.Permissions{Extensions: map[string]string{
			"permit-pty": "", "permit-port-forwarding": "",
		}},
	}
	if tokenID != "" {
		cert.Permissions.Extensions[certTokenExt] = tokenID
	}
	if err := cert.SignCert(rand.Reader, s.ca); err != nil {
		return api.SSHCert{}, fmt.Errorf("sign SSH certificate: %w", err)
	}
	login := sb.Name
	if user != "" {
		login += "+" + user
	}
	return api.SSHCert{
		Certificate: strings.TrimSpace(string(ssh.MarshalAuthorizedKey(cert))),
		Login:       login, ValidBefore: time.Unix(int64(cert.ValidBefore), 0).UTC(), SSH: s.Info(),
	}, nil
}

// checkUser checks the user part of a login name: a user name of the
// sandbox (or a numeric uid), nothing the agent could read otherwise.
func checkUser(u string) error {
	if len(u) > 32 || u == "" || u[0] == '-' {
		return errdefs.Invalid("user %q is not a user name", u)
	}
	for _, c := range u {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return errdefs.Invalid("user %q is not a user name", u)
		}
	}
	return nil
}

// splitLogin reads an SSH user name: NAME, or NAME+USER.
func splitLogin(login string) (name, user string, err error) {
	name, user, plus := strings.Cut(login, "+")
	if err := core.ValidateName(name); err != nil {
		return "", "", err
	}
	if plus {
		if err := checkUser(user); err != nil {
			return "", "", err
		}
	}
	return name, user, nil
}

// errAuth is every refused login's answer: it tells a stranger nothing
// about which sandboxes exist.
var errAuth = errors.New("permission denied")

func (s *Server) config() *ssh.ServerConfig {
	cfg := &ssh.ServerConfig{
		PublicKeyCallback: s.authenticate,
		MaxAuthTries:      6,
		ServerVersion:     "SSH-2.0-nook",
	}
	// AES-GCM only: the client's preference picks the cipher, and
	// OpenSSH's client lists chacha20-poly1305 and AES-CTR first, which
	// Go runs at half AES-GCM's speed (AES-NI). Every client of the last
	// decade has AES-GCM (OpenSSH 6.2, PuTTY 0.76, libssh2 1.11, sshj).
	cfg.Ciphers = []string{"aes128-gcm@openssh.com", "aes256-gcm@openssh.com"}
	cfg.AddHostKey(s.hostKey)
	return cfg
}

// authenticate admits a public key or a certificate for the sandbox the
// login names.
func (s *Server) authenticate(c ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
	name, user, err := splitLogin(c.User())
	if err != nil {
		return nil, errAuth
	}
	ctx, cancel := context.WithTimeout(context.Background(), lookupTimeout)
	defer cancel()
	sb, err := s.m.Get(ctx, name)
	if err != nil {
		if !errors.Is(err, errdefs.ErrNotFound) {
			s.log.Warn("ssh login: look up the sandbox", "sandbox", name, "err", err)
		}
		return nil, errAuth
	}
	perms := &ssh.Permissions{Extensions: map[string]string{extSandboxID: sb.ID, extUser: user}}
	if cert, ok := key.(*ssh.Certificate); ok {
		checker := &ssh.CertChecker{
			IsUserAuthority: func(auth ssh.PublicKey) bool {
				return string(auth.Marshal()) == string(s.ca.PublicKey().Marshal())
			},
		}
		// Authenticate checks the CA, the validity window and that the
		// certificate names this sandbox (by ID) and user.
		p, err := checker.Authenticate(certLogin{c, principal(sb.ID, user)}, cert)
		if err != nil {
			s.log.Info("ssh login refused: certificate", "sandbox", name, "remote", c.RemoteAddr().String(), "err", err)
			return nil, errAuth
		}
		perms.Extensions[extCertToken] = p.Extensions[certTokenExt]
	} else {
		perms.Extensions[extKey] = ssh.FingerprintSHA256(key)
	}
	if err := s.allowed(ctx, sb, perms); err != nil {
		if !errors.Is(err, errAuth) {
			s.log.Warn("ssh login: check the key", "sandbox", name, "err", err)
		}
		return nil, errAuth
	}
	return perms, nil
}

// allowed checks that what admitted a login still admits it to sb: its
// key is still registered (for sb, or for a token still valid that
// reaches sb), or the token its certificate was minted for is still
// valid. Logins and every new channel ask.
func (s *Server) allowed(ctx context.Context, sb *core.Sandbox, perms *ssh.Permissions) error {
	if sb.ID != perms.Extensions[extSandboxID] {
		return errAuth // the name is another sandbox's now
	}
	var ok bool
	var err error
	if fp, isKey := perms.Extensions[extKey]; isKey {
		ok, err = s.m.SSHKeyAllows(ctx, sb, fp)
	} else {
		ok, err = s.m.SSHTokenAllows(ctx, perms.Extensions[extCertToken], sb)
	}
	if err != nil {
		return err
	}
	if !ok {
		return errAuth
	}
	return nil
}

// capped counts open things by key (a sandbox's connections, an
// address's handshakes), at most max per key.
type capped struct {
	mu  sync.Mutex
	n   map[string]int
	max int
}

// acquire counts one more for key, refusing one beyond max; release
// gives it back.
func (c *capped) acquire(key string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n[key] >= c.max {
		return false
	}
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[key]++
	return true
}

func (c *capped) release(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n[key]--; c.n[key] <= 0 {
		delete(c.n, key)
	}
}

// remoteIP is a connection's remote address without its port.
func remoteIP(c net.Conn) string {
	host, _, err := net.SplitHostPort(c.RemoteAddr().String())
	if err != nil {
		return c.RemoteAddr().String()
	}
	return host
}

// certLogin is the connection as the certificate check sees it: its user
// is the principal the certificate must name.
type certLogin struct {
	ssh.ConnMetadata
	principal string
}

func (c certLogin) User() string { return c.principal }

// Serve accepts SSH connections on l until ctx ends or l fails; it
// returns once every connection it accepted is closed.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	s.addr.Store(l.Addr().String())
	cfg := s.config()
	stop := context.AfterFunc(ctx, func() { l.Close() })
	defer stop()
	var conns sync.Map // net.Conn -> struct{}: closed when ctx ends
	defer func() {
		conns.Range(func(k, _ any) bool { k.(net.Conn).Close(); return true })
		s.wg.Wait()
	}()
	var backoff time.Duration
	for {
		nc, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			// Out of file descriptors and the like: wait and try again,
			// as net/http does, rather than stop serving.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.log.Warn("ssh: accept", "err", err, "retry_in", backoff)
			select {
			case <-time.After(backoff):
			case <-ctx.Done():
				return nil
			}
			continue
		}
		backoff = 0
		if s.conns.Add(1) > int64(s.maxConns) {
			s.conns.Add(-1)
			nc.Close()
			continue
		}
		ip := remoteIP(nc)
		if !s.handshakes.acquire(ip) {
			s.conns.Add(-1)
			nc.Close()
			continue
		}
		conns.Store(nc, struct{}{})
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer s.conns.Add(-1)
			defer conns.Delete(nc)
			defer nc.Close()
			// Quick ACKs: OpenSSH's client writes without TCP_NODELAY
			// outside interactive sessions, and a delayed ACK holds its
			// next packet 40 ms (twice per login, measured).
			s.serveConn(ctx, quickack.Wrap(nc), cfg, func() { s.handshakes.release(ip) })
		}()
	}
}
