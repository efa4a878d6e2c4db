package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/net/netutil"

	"github.com/nookhq/nook/internal/daemon"
	"github.com/nookhq/nook/internal/e2b"
	"github.com/nookhq/nook/internal/metrics"
	"github.com/nookhq/nook/internal/sdnotify"
	"github.com/nookhq/nook/internal/sshd"
)

func closeAll(ls []net.Listener) {
	for _, l := range ls {
		l.Close()
	}
}

// DefaultSocket is where the daemon listens and the CLI looks by default.
const DefaultSocket = "/run/nook/nook.sock"

// Config configures a running daemon.
type Config struct {
	Daemon daemon.Config
	Socket string // unix socket; default /run/nook/nook.sock (or RunDir/nook.sock when RunDir is set)
	Listen string // optional TCP address, e.g. 127.0.0.1:7070; requires bearer tokens
	// TLSCert and TLSKey are the TCP listener's certificate and key
	// (PEM); without them it uses a self-signed one kept in the data
	// directory, made on first start.
	TLSCert, TLSKey string
	// InsecureHTTP serves plain HTTP on the TCP listener (behind a TLS
	// proxy on the same host only).
	InsecureHTTP bool
	// E2BListen, if set, is a TCP address serving E2B's API and envd's
	// (internal/e2b), plain HTTP, as E2B's SDKs speak it.
	E2BListen string
	// E2BDomain is what E2B sandboxes' host names end in (PORT-ID.DOMAIN,
	// the SDKs' getHost); default localhost:PORT of E2BListen.
	E2BDomain string
	// SSHListen, if set, is a TCP address serving SSH to every sandbox
	// (internal/sshd); SSHAcceptEnv the variables clients may pass.
	SSHListen    string
	SSHAcceptEnv []string
	// PreviewListen, if set, is a TCP address serving preview URLs,
	// PORT-NAME.PreviewDomain (internal/preview); over TLS with
	// PreviewCert and PreviewKey (a wildcard certificate). PreviewWake:
	// a request wakes a paused sandbox.
	PreviewListen, PreviewDomain string
	PreviewCert, PreviewKey      string
	PreviewWake                  bool
	// MaxConns caps the TCP listener's open connections (default
	// DefaultMaxConns); IdleTimeout closes idle keep-alive connections
	// (default DefaultIdleTimeout).
	MaxConns    int
	IdleTimeout time.Duration
	// Fingerprint, if set, is called with the TLS certificate's
	// fingerprint once the TCP listener is up.
	Fingerprint func(string)
	// Ready, if set, is called once the listeners accept connections.
	Ready func()
	// DebugSocket, if set, is a unix socket (root only) serving Go's
	// profiles (net/http/pprof) for diagnosing the daemon.
	DebugSocket string
	// MetricsListen, if set, is a TCP address serving Prometheus metrics
	// at /metrics (internal/metrics), plain HTTP without authentication:
	// loopback or a private network.
	MetricsListen string
}

// Serve runs the daemon until ctx ends. Sandboxes keep running after it
// returns; the next start re-adopts them.
func Serve(ctx context.Context, cfg Config) error {
	log := cfg.Daemon.Log
	if log == nil {
		log = slog.Default()
		cfg.Daemon.Log = log
	}
	// Under systemd (Type=notify, packaging/nook.service): read before
	// anything starts a process, which must not inherit the socket.
	notify, nerr := sdnotify.FromEnv()
	if nerr != nil {
		log.Warn("the daemon cannot tell systemd it is ready", "err", nerr)
	}
	sdNotify := func(msgs ...string) {
		if err := notify.Send(msgs...); err != nil {
			log.Warn("tell systemd", "err", err)
		}
	}
	if cfg.Socket == "" {
		cfg.Socket = DefaultSocket
		if cfg.Daemon.RunDir != "" {
			cfg.Socket = filepath.Join(cfg.Daemon.RunDir, "nook.sock")
		}
	}
	if abs, err := filepath.Abs(cfg.Socket); err == nil {
		cfg.Socket = abs
	}
	dataDir := cfg.Daemon.DataDir
	if dataDir == "" {
		dataDir = "/var/lib/nook"
	}
	if err := os.MkdirAll(dataDir, 0o711); err != nil {
		return err
	}
	// One daemon per data directory.
	lock, err := os.OpenFile(filepath.Join(dataDir, "daemon.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return fmt.Errorf("another nook daemon is already using %s (stop it first)", dataDir)
	}

	if cfg.DebugSocket != "" {
		// Up before the daemon's start, so that its re-adoption of
		// sandboxes can be profiled too.
		dl, err := listenUnix(cfg.DebugSocket)
		if err != nil {
			return fmt.Errorf("debug socket: %w", err)
		}
		ds := &http.Server{Handler: debugHandler(), ReadHeaderTimeout: 10 * time.Second}
		go ds.Serve(dl)
		defer func() {
			ds.Close()
			os.Remove(cfg.DebugSocket)
		}()
	}
	var mx *metrics.Metrics
	if cfg.MetricsListen != "" {
		mx = metrics.New(log)
		cfg.Daemon.Observer = mx
	}
	m, err := daemon.New(ctx, cfg.Daemon)
	if err != nil {
		return err
	}
	defer m.Close()
	srv := New(m, log)
	if err := srv.EnableMCP(cfg.Socket); err != nil {
		return err
	}

	ul, err := listenUnix(cfg.Socket)
	if err != nil {
		return err
	}
	servers := []*http.Server{newHTTPServer(srv.Handler(false), cfg.IdleTimeout, log)}
	listeners := []net.Listener{ul}
	if cfg.Listen != "" {
		tl, err := listenTCP(cfg, dataDir, log)
		if err != nil {
			ul.Close()
			return err
		}
		if tl.Fingerprint != "" {
			srv.tlsFingerprint = tl.Fingerprint
			log.Info("the TCP listener serves HTTPS: clients pin the certificate with NOOK_TLS_FINGERPRINT", "fingerprint", tl.Fingerprint)
			if cfg.Fingerprint != nil {
				cfg.Fingerprint(tl.Fingerprint)
			}
		}
		servers = append(servers, newHTTPServer(srv.Handler(true), cfg.IdleTimeout, log))
		listeners = append(listeners, tl)
	}
	if cfg.E2BListen != "" {
		el, err := net.Listen("tcp", cfg.E2BListen)
		if err != nil {
			closeAll(listeners)
			return fmt.Errorf("--e2b-listen: %w", err)
		}
		domain := cfg.E2BDomain
		if domain == "" {
			_, port, _ := net.SplitHostPort(el.Addr().String())
			domain = "localhost:" + port
		}
		edge, err := e2b.New(m, log, dataDir, domain)
		if err != nil {
			el.Close()
			closeAll(listeners)
			return err
		}
		if host, _, _ := net.SplitHostPort(el.Addr().String()); !net.ParseIP(host).IsLoopback() {
			log.Warn("the E2B listener serves plain HTTP beyond this host: API keys and sandbox access tokens cross the network readable; put a TLS proxy in front", "address", el.Addr().String())
		}
		servers = append(servers, newHTTPServer(edge, cfg.IdleTimeout, log))
		listeners = append(listeners, netutil.LimitListener(el, cmp.Or(cfg.MaxConns, DefaultMaxConns)))
	}
	if cfg.PreviewListen != "" {
		psrv, pl, pe, err := listenPreview(cfg, m, dataDir)
		if err != nil {
			closeAll(listeners)
			return err
		}
		defer psrv.Close()
		srv.SetPreview(pe)
		ps := newHTTPServer(psrv, cfg.IdleTimeout, log)
		// Streams (server-sent events, WebSockets) have no write timeout.
		ps.MaxHeaderBytes = 64 << 10
		servers = append(servers, ps)
		listeners = append(listeners, netutil.LimitListener(pl, cmp.Or(cfg.MaxConns, DefaultMaxConns)))
	}
	if mx != nil {
		ml, err := listenMetrics(cfg.MetricsListen, mx, m)
		if err != nil {
			closeAll(listeners)
			return err
		}
		servers = append(servers, newHTTPServer(mx.Mux(), cfg.IdleTimeout, log))
		listeners = append(listeners, netutil.LimitListener(ml, cmp.Or(cfg.MaxConns, DefaultMaxConns)))
	}
	errc := make(chan error, len(servers)+2)
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var sshDone chan struct{}
	var sshAddr string
	if cfg.SSHListen != "" {
		sl, err := net.Listen("tcp", cfg.SSHListen)
		if err != nil {
			closeAll(listeners)
			return fmt.Errorf("--ssh-listen: %w", err)
		}
		ssrv, err := sshd.New(m, sshd.Config{DataDir: dataDir, AcceptEnv: cfg.SSHAcceptEnv, Log: log})
		if err != nil {
			sl.Close()
			closeAll(listeners)
			return err
		}
		sshAddr = sl.Addr().String()
		ssrv.SetAddress(sshAddr)
		srv.SetSSH(ssrv)
		sshDone = make(chan struct{})
		go func() {
			defer close(sshDone)
			if err := ssrv.Serve(runCtx, sl); err != nil {
				errc <- fmt.Errorf("ssh: %w", err)
			}
		}()
		log.Info("nook SSH listening", "address", sl.Addr().String(), "host_key", ssrv.Info().Fingerprint)
	}
	for i := range servers {
		go func(s *http.Server, l net.Listener) {
			if err := s.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- err
			}
		}(servers[i], listeners[i])
		log.Info("nook daemon listening", "address", listeners[i].Addr().String())
	}
	go m.Run(runCtx)
	// Ready: sandboxes are re-adopted (daemon.New) and every listener
	// accepts.
	var addrs []string
	for _, l := range listeners {
		addrs = append(addrs, l.Addr().String())
	}
	if sshAddr != "" {
		addrs = append(addrs, sshAddr+" (SSH)")
	}
	sdNotify(sdnotify.Ready, sdnotify.MainPID(), sdnotify.Status("serving on "+strings.Join(addrs, ", ")))
	if cfg.Ready != nil {
		cfg.Ready()
	}
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	sdNotify(sdnotify.Stopping, sdnotify.Status("stopping; sandboxes keep running"))
	shutdownCtx, done := context.WithTimeout(context.Background(), 5*time.Second)
	defer done()
	for _, s := range servers {
		s.Shutdown(shutdownCtx)
	}
	if sshDone != nil {
		cancel()
		select {
		case <-sshDone:
		case <-shutdownCtx.Done():
			log.Warn("ssh sessions did not end in time; the daemon stops anyway")
		}
	}
	os.Remove(cfg.Socket)
	log.Info("nook daemon stopped; sandboxes keep running")
	return err
}

// debugHandler serves Go's profiles, as net/http/pprof registers them.
func debugHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// listenUnix listens on a unix socket only root can use, replacing a stale
// socket file but never a live daemon's.
func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return nil, fmt.Errorf("another nook daemon is already serving at %s", path)
	}
	os.Remove(path)
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	// Root only. Until the chmod, the directory (root's) keeps others out.
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}
