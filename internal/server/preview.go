package server

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/daemon"
	"github.com/nookhq/nook/internal/fsutil"
	"github.com/nookhq/nook/internal/preview"
)

// previewTokenTTL is how long the token in an exposed port's preview URL
// opens it; exposing the port again gives another.
const previewTokenTTL = 24 * time.Hour

// previewSandboxes is the Manager as the preview server sees it.
type previewSandboxes struct {
	m    *daemon.Manager
	wake bool
}

func (p previewSandboxes) Port(ctx context.Context, name string, port int) (preview.PortInfo, error) {
	sb, err := p.m.Get(ctx, name)
	if err != nil {
		return preview.PortInfo{}, err
	}
	exposed, public, nonce := p.m.PreviewPort(sb.ID, port)
	return preview.PortInfo{SandboxID: sb.ID, State: string(sb.State), Exposed: exposed, Public: public, Nonce: nonce}, nil
}

// DialPort connects through the sandbox's agent. The connection is
// Passive: a kept-alive one is no use of the sandbox, its traffic is
// (the preview server reports it with Used). Without wake, a sandbox that
// paused since the preview server looked is not woken.
func (p previewSandboxes) DialPort(ctx context.Context, name string, port int) (net.Conn, error) {
	ctx = daemon.Passive(ctx)
	if !p.wake {
		ctx = daemon.LookOnly(ctx)
	}
	return p.m.DialPort(ctx, name, port)
}

func (p previewSandboxes) Used(sandboxID string) { p.m.Used(sandboxID) }

// previewEndpoint mints preview URLs for the API.
type previewEndpoint struct {
	m      *daemon.Manager
	srv    *preview.Server
	scheme string
	port   int // the listener's
}

func (e previewEndpoint) Info() api.PreviewInfo {
	u := preview.URL(e.scheme, e.srv.Domain(), e.port, "NAME", 1, "")
	return api.PreviewInfo{URL: strings.Replace(u, "://1-NAME.", "://PORT-NAME.", 1)}
}

func (e previewEndpoint) URL(sandboxID, name string, port int, public bool) string {
	tok := ""
	if !public {
		_, _, nonce := e.m.PreviewPort(sandboxID, port)
		tok = e.srv.Token(sandboxID, port, nonce, time.Now().Add(previewTokenTTL))
	}
	return preview.URL(e.scheme, e.srv.Domain(), e.port, name, port, tok)
}

// listenPreview starts the preview listener: the server, its listener
// (TLS with the operator's certificate) and the endpoint for the API.
func listenPreview(cfg Config, m *daemon.Manager, dataDir string) (*preview.Server, net.Listener, previewEndpoint, error) {
	var none previewEndpoint
	domain := cfg.PreviewDomain
	if domain == "" {
		domain = "localhost"
	}
	if err := preview.CheckDomain(domain); err != nil {
		return nil, nil, none, fmt.Errorf("--preview-domain: %w", err)
	}
	if (cfg.PreviewCert == "") != (cfg.PreviewKey == "") {
		return nil, nil, none, errors.New("--preview-cert and --preview-key go together")
	}
	key, err := loadPreviewKey(filepath.Join(dataDir, "preview.key"))
	if err != nil {
		return nil, nil, none, fmt.Errorf("preview key: %w", err)
	}
	l, err := net.Listen("tcp", cfg.PreviewListen)
	if err != nil {
		return nil, nil, none, fmt.Errorf("--preview-listen: %w", err)
	}
	scheme := "http"
	if cfg.PreviewCert != "" {
		cert, err := tls.LoadX509KeyPair(cfg.PreviewCert, cfg.PreviewKey)
		if err != nil {
			l.Close()
			return nil, nil, none, fmt.Errorf("--preview-cert: %w", err)
		}
		l = tls.NewListener(l, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}})
		scheme = "https"
	}
	_, portStr, _ := net.SplitHostPort(l.Addr().String())
	port, _ := strconv.Atoi(portStr)
	srv := preview.New(previewSandboxes{m: m, wake: cfg.PreviewWake}, preview.Config{Domain: domain, Key: key, Wake: cfg.PreviewWake, Log: cfg.Daemon.Log})
	return srv, l, previewEndpoint{m: m, srv: srv, scheme: scheme, port: port}, nil
}

// loadPreviewKey reads the key that signs preview tokens (32 random
// bytes, root's alone), making it on first use: tokens outlive restarts.
func loadPreviewKey(path string) ([]byte, error) {
	if b, err := os.ReadFile(path); err == nil && len(b) == 32 {
		return b, nil
	}
	b := make([]byte, 32)
	rand.Read(b)
	if err := fsutil.WriteFileAtomic(path, b); err != nil {
		return nil, err
	}
	return b, nil
}
