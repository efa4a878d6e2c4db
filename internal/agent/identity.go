package agent

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// IdentityConfig asks the agent to keep the sandbox's identity token for
// an audience fresh in a file, for credential providers that read a token
// file (AWS_WEB_IDENTITY_TOKEN_FILE and the like). The agent fetches it
// from the sandbox's metadata endpoint like any process there would.
type IdentityConfig struct {
	// Sandbox is the sandbox's ID: a fork (same memory, same agent, a new
	// ID) keeps no token of its parent's.
	Sandbox  string `json:"sandbox"`
	Audience string `json:"audience"`
	File     string `json:"file"`
	URL      string `json:"url"` // the endpoint's token URL for Audience
}

// Bounds of the wait between two fetches of the token: half its
// remaining lifetime, within these; after a failure, backoff from
// tokenRetryMin doubling to tokenRetryMax.
const (
	tokenRefreshMin = 5 * time.Second
	tokenRefreshMax = 5 * time.Minute
	tokenRetryMin   = time.Second
	tokenRetryMax   = 30 * time.Second
)

// tokenKeeper keeps one token file fresh.
type tokenKeeper struct {
	cfg   IdentityConfig
	log   *slog.Logger
	nudge chan struct{}
	stop  chan struct{}
	done  chan struct{}
	first chan struct{} // closed once the first fetch ended, well or not
	// ctx ends with stop: a fetch in flight ends at once.
	ctx    context.Context
	cancel context.CancelFunc
}

// keepToken starts keeping cfg's token fresh, in place of what kept one
// before; nil stops it.
func (s *Server) keepToken(cfg *IdentityConfig) {
	if k := s.startKeeper(cfg); k != nil {
		// The file is there when the sandbox is handed over (the first
		// fetch is a round trip to the host), unless the host is slow.
		select {
		case <-k.first:
		case <-time.After(firstTokenWait):
		}
	}
}

// firstTokenWait bounds how long a configure waits for the first token.
const firstTokenWait = 5 * time.Second

// startKeeper replaces the keeper; it returns the new one (nil: none
// started).
func (s *Server) startKeeper(cfg *IdentityConfig) *tokenKeeper {
	s.tokenMu.Lock()
	defer s.tokenMu.Unlock()
	if s.token != nil {
		if cfg != nil && s.token.cfg == *cfg {
			s.token.wake()
			return nil
		}
		close(s.token.stop)
		s.token.cancel()
		<-s.token.done
		s.token = nil
	}
	if cfg == nil || cfg.File == "" || cfg.URL == "" {
		return nil
	}
	// Another identity (a fork's first configure): the token there is the
	// parent's, gone before the fork's is fetched.
	os.Remove(cfg.File)
	k := &tokenKeeper{cfg: *cfg, log: s.log, nudge: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}), first: make(chan struct{})}
	k.ctx, k.cancel = context.WithCancel(context.Background())
	s.token = k
	go k.run()
	return k
}

// wakeToken fetches the token again now (the sandbox woke from a pause:
// the token may have expired meanwhile).
func (s *Server) wakeToken() {
	s.tokenMu.Lock()
	defer s.tokenMu.Unlock()
	if s.token != nil {
		s.token.wake()
	}
}

func (k *tokenKeeper) wake() {
	select {
	case k.nudge <- struct{}{}:
	default:
	}
}

func (k *tokenKeeper) run() {
	defer close(k.done)
	retry := tokenRetryMin
	for first := true; ; first = false {
		exp, err := k.fetch()
		if first {
			close(k.first)
		}
		var wait time.Duration
		if err != nil {
			k.log.Warn("identity token file: fetch failed", "file", k.cfg.File, "err", err, "retry", retry)
			wait = retry
			retry = min(retry*2, tokenRetryMax)
		} else {
			retry = tokenRetryMin
			wait = min(max(time.Until(exp)/2, tokenRefreshMin), tokenRefreshMax)
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-k.nudge:
			t.Stop()
		case <-k.stop:
			t.Stop()
			return
		}
	}
}

// fetch gets a token and writes it to the file (replaced whole, so a
// reader never sees half of one); it returns the token's expiry.
func (k *tokenKeeper) fetch() (time.Time, error) {
	b, err := httpGet(k.ctx, k.cfg.URL, map[string]string{"Nook-Metadata": "true"}, 10*time.Second)
	if err != nil {
		return time.Time{}, err
	}
	exp, err := tokenExpiry(string(b))
	if err != nil {
		return time.Time{}, err
	}
	if err := os.MkdirAll(filepath.Dir(k.cfg.File), 0o755); err != nil {
		return time.Time{}, err
	}
	tmp := k.cfg.File + ".tmp"
	// Readable by every user of the sandbox, who may all fetch it from the
	// endpoint anyway.
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return time.Time{}, err
	}
	if err := os.Chmod(tmp, 0o644); err != nil {
		return time.Time{}, err
	}
	if k.ctx.Err() != nil {
		os.Remove(tmp)
		return time.Time{}, k.ctx.Err() // stopped: another identity's keeper owns the file now
	}
	return exp, os.Rename(tmp, k.cfg.File)
}

// httpGet is a plain HTTP/1.0 GET of rawURL (http only), answering the
// body of a 200 (at most 64 KiB). The agent has no net/http: it keeps the
// binary small and its start fast.
func httpGet(ctx context.Context, rawURL string, headers map[string]string, timeout time.Duration) ([]byte, error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme != "http" || u.Host == "" {
		return nil, fmt.Errorf("not an http URL: %q", rawURL)
	}
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), "80")
	}
	c, err := (&net.Dialer{Timeout: timeout}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	c.SetDeadline(time.Now().Add(timeout))
	var req strings.Builder
	fmt.Fprintf(&req, "GET %s HTTP/1.0\r\nHost: %s\r\n", u.RequestURI(), u.Hostname())
	for k, v := range headers {
		fmt.Fprintf(&req, "%s: %s\r\n", k, v)
	}
	req.WriteString("\r\n")
	if _, err := io.WriteString(c, req.String()); err != nil {
		return nil, err
	}
	resp, err := io.ReadAll(io.LimitReader(c, 64<<10))
	if err != nil {
		return nil, err
	}
	head, body, ok := strings.Cut(string(resp), "\r\n\r\n")
	if !ok {
		return nil, fmt.Errorf("no complete HTTP answer")
	}
	status, _, _ := strings.Cut(head, "\r\n")
	if f := strings.Fields(status); len(f) < 2 || !strings.HasPrefix(f[0], "HTTP/1.") || f[1] != "200" {
		return nil, fmt.Errorf("%s: %s", status, strings.TrimSpace(body))
	}
	return []byte(body), nil
}

// tokenExpiry reads a JWT's exp (unverified: the agent only schedules
// the next fetch by it).
func tokenExpiry(tok string) (time.Time, error) {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return time.Time{}, fmt.Errorf("the answer is not a JWT")
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return time.Time{}, fmt.Errorf("the token's payload: %w", err)
	}
	var c struct {
		Exp int64 `json:"exp"`
	}
	if err := json.Unmarshal(payload, &c); err != nil || c.Exp == 0 {
		return time.Time{}, fmt.Errorf("the token has no exp")
	}
	return time.Unix(c.Exp, 0), nil
}
