package daemon

import (
	"context"
	"net/http"
	"net/netip"
	"path/filepath"
	"sync"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/identity"
	"github.com/nookhq/nook/internal/store"
)

// IdentityConfig configures sandboxes' identity tokens (internal/identity).
type IdentityConfig struct {
	// Issuer is the tokens' `iss`, the URL relying parties read the
	// discovery document and keys under (default identity.DefaultIssuer).
	Issuer string
	// TrustDomain of the subjects, spiffe://TRUST-DOMAIN/sandbox/ID
	// (default the issuer's host).
	TrustDomain string
	// RotateEvery is how long a signing key signs (default 24h); MaxTTL
	// the longest token lifetime (default 1h).
	RotateEvery, MaxTTL time.Duration
}

// identityLogKeep is how many entries a sandbox's identity log keeps.
const identityLogKeep = 1000

// Via values of the identity log.
const viaMetadata = "metadata"

type creatorKey struct{}

// WithCreator says who makes the sandboxes created with ctx: the name of
// the caller's token (the API edge sets it). Their identity tokens carry
// it as `creator`.
func WithCreator(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, creatorKey{}, name)
}

// creatorFrom is the creator WithCreator set, or "host": the Unix socket
// without a token.
func creatorFrom(ctx context.Context) string {
	if s, _ := ctx.Value(creatorKey{}).(string); s != "" {
		return s
	}
	return "host"
}

func openIssuer(cfg Config) (*identity.Issuer, error) {
	return identity.New(identity.Config{
		Dir: filepath.Join(cfg.DataDir, "identity"), Issuer: cfg.Identity.Issuer, TrustDomain: cfg.Identity.TrustDomain,
		RotateEvery: cfg.Identity.RotateEvery, MaxTTL: cfg.Identity.MaxTTL,
	})
}

// Issuer is the daemon's identity token issuer: its discovery document
// and keys are public.
func (m *Manager) Issuer() *identity.Issuer { return m.issuer }

// IdentityToken issues a token for a sandbox to an API caller (via names
// it in the log: "api:TOKEN-NAME").
func (m *Manager) IdentityToken(ctx context.Context, name string, req api.IdentityTokenRequest) (api.IdentityToken, error) {
	var ttl time.Duration
	if req.TTL != "" {
		d, err := core.ParseDuration(req.TTL)
		if err != nil {
			return api.IdentityToken{}, errdefs.Invalid("ttl %q: %v", req.TTL, err)
		}
		ttl = d
	}
	sb, err := m.Get(ctx, name)
	if err != nil {
		return api.IdentityToken{}, err
	}
	tok, err := m.issue(ctx, sb, req.Audience, ttl, "api:"+creatorFrom(ctx))
	if err != nil {
		return api.IdentityToken{}, err
	}
	return api.IdentityToken{Token: tok.Raw, Issuer: tok.Claims.Issuer, Subject: tok.Claims.Subject, Audience: tok.Claims.Audience,
		ID: tok.Claims.ID, ExpiresAt: time.Unix(tok.Claims.Expiry, 0).UTC()}, nil
}

// issue signs a token for sb and logs it.
func (m *Manager) issue(ctx context.Context, sb *core.Sandbox, audience string, ttl time.Duration, via string) (identity.Token, error) {
	switch sb.State {
	case core.StateDestroying, core.StateFailed:
		// (A creating sandbox has its identity already: its agent fetches
		// its token file before the create answers.)
		return identity.Token{}, errdefs.Precondition("sandbox %s is %s: it gets no identity tokens", sb.Name, sb.State)
	}
	var digest string
	if t, err := m.templates.ByID(sb.TemplateID); err == nil {
		digest = t.Digest
	}
	var exp time.Time
	if sb.ExpiresAt.Unix() > 0 && !sb.Expired {
		exp = sb.ExpiresAt
	}
	tok, err := m.issuer.Issue(identity.Subject{
		ID: sb.ID, Name: sb.Name, Template: sb.Template, TemplateID: sb.TemplateID, TemplateDigest: digest, Isolation: sb.Isolation,
		Creator: sb.Creator, Labels: sb.Labels, ParentID: sb.ParentID, LineageID: sb.LineageID, ExpiresAt: exp,
		Repository: sb.Repo.URL, Commit: sb.Repo.Commit,
	}, audience, ttl)
	if err != nil {
		return identity.Token{}, err
	}
	e := store.IdentityLogEntry{SandboxID: sb.ID, Time: time.Unix(tok.Claims.IssuedAt, 0), Audience: audience,
		JTI: tok.Claims.ID, ExpiresAt: time.Unix(tok.Claims.Expiry, 0), Via: via}
	m.idlog.add(e)
	// The identity log is the record (a flood of tokens must not flood
	// the daemon's log, and with it every other sandbox's lines).
	m.log.DebugContext(ctx, "identity token issued", "sandbox", sb.Name, "audience", audience, "jti", tok.Claims.ID,
		"kid", tok.KeyID, "expires", e.ExpiresAt.UTC().Format(time.RFC3339), "via", via)
	return tok, nil
}

// IdentityLog returns the tokens issued to a sandbox, oldest first.
func (m *Manager) IdentityLog(ctx context.Context, name string) (api.IdentityLog, error) {
	sb, err := m.Get(ctx, name)
	if err != nil {
		return api.IdentityLog{}, err
	}
	m.idlog.flush(ctx)
	es, err := m.store.IdentityLog(ctx, sb.ID, identityLogKeep)
	if err != nil {
		return api.IdentityLog{}, err
	}
	out := api.IdentityLog{Entries: make([]api.IdentityLogEntry, 0, len(es))}
	for _, e := range es {
		out.Entries = append(out.Entries, api.IdentityLogEntry{Time: e.Time.UTC(), Audience: e.Audience, ID: e.JTI,
			ExpiresAt: e.ExpiresAt.UTC(), Via: e.Via})
	}
	return out, nil
}

// RotateIdentityKeys retires the signing key now (the published next key
// signs from now on); tokens already issued verify until they expire.
func (m *Manager) RotateIdentityKeys(ctx context.Context) error {
	if err := m.issuer.Rotate(); err != nil {
		return err
	}
	m.log.InfoContext(ctx, "identity signing key rotated")
	return nil
}

// metadataHandler serves the metadata endpoint of sandbox id, whose
// address is caller.
func (m *Manager) metadataHandler(id string, caller netip.Addr) http.Handler {
	return identity.MetadataHandler(caller, &sandboxMetadata{m: m, id: id})
}

// sandboxMetadata answers one sandbox's metadata endpoint.
type sandboxMetadata struct {
	m  *Manager
	id string
}

func (s *sandboxMetadata) Token(ctx context.Context, audience string, ttl time.Duration) (string, error) {
	sb, err := s.m.store.GetSandboxByID(ctx, s.id)
	if err != nil {
		return "", err
	}
	tok, err := s.m.issue(ctx, sb, audience, ttl, viaMetadata)
	return tok.Raw, err
}

// sandboxFacts is what /v1/sandbox answers.
type sandboxFacts struct {
	ID        string            `json:"id"`
	Name      string            `json:"name"`
	Template  string            `json:"template"`
	Isolation string            `json:"isolation"`
	CreatedAt time.Time         `json:"created_at"`
	ExpiresAt *time.Time        `json:"expires_at,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	Issuer    string            `json:"issuer"`
	Subject   string            `json:"subject"`
}

func (s *sandboxMetadata) Facts(ctx context.Context) (any, error) {
	sb, err := s.m.store.GetSandboxByID(ctx, s.id)
	if err != nil {
		return nil, err
	}
	f := sandboxFacts{ID: sb.ID, Name: sb.Name, Template: sb.Template, Isolation: sb.Isolation, CreatedAt: sb.CreatedAt.UTC(),
		Labels: sb.Labels, Issuer: s.m.issuer.URL(), Subject: s.m.issuer.SubjectOf(sb.ID)}
	if sb.ExpiresAt.Unix() > 0 && !sb.Expired {
		t := sb.ExpiresAt.UTC()
		f.ExpiresAt = &t
	}
	return f, nil
}

// identityLog writes issued tokens to the database in batches, off the
// path of the request that issued them.
type identityLog struct {
	st     *store.Store
	log    interface{ Error(string, ...any) }
	c      chan store.IdentityLogEntry
	flushc chan chan struct{}
	stop   chan struct{}
	done   chan struct{}
	once   sync.Once
}

func newIdentityLog(st *store.Store, log interface{ Error(string, ...any) }) *identityLog {
	l := &identityLog{st: st, log: log, c: make(chan store.IdentityLogEntry, 4096), flushc: make(chan chan struct{}),
		stop: make(chan struct{}), done: make(chan struct{})}
	go l.run()
	return l
}

func (l *identityLog) add(e store.IdentityLogEntry) {
	select {
	case l.c <- e:
	default:
		l.log.Error("identity log queue full: entry dropped", "sandbox", e.SandboxID, "jti", e.JTI, "audience", e.Audience)
	}
}

func (l *identityLog) run() {
	defer close(l.done)
	var batch []store.IdentityLogEntry
	write := func() {
		if len(batch) == 0 {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := l.st.AppendIdentityLog(ctx, batch, identityLogKeep); err != nil {
			l.log.Error("write identity log", "entries", len(batch), "err", err)
		}
		cancel()
		batch = batch[:0]
	}
	drain := func() {
		for len(batch) < 256 {
			select {
			case e := <-l.c:
				batch = append(batch, e)
			default:
				return
			}
		}
	}
	for {
		select {
		case e := <-l.c:
			batch = append(batch, e)
			drain()
			write()
		case ack := <-l.flushc:
			for len(l.c) > 0 {
				drain()
				write()
			}
			close(ack)
		case <-l.stop:
			for len(l.c) > 0 {
				drain()
				write()
			}
			return
		}
	}
}

// flush waits until what was added before is written.
func (l *identityLog) flush(ctx context.Context) {
	ack := make(chan struct{})
	select {
	case l.flushc <- ack:
		select {
		case <-ack:
		case <-ctx.Done():
		}
	case <-ctx.Done():
	case <-l.done:
	}
}

// close writes what is queued and stops; closing again does nothing.
func (l *identityLog) close() {
	l.once.Do(func() { close(l.stop) })
	<-l.done
}

// lineageOf is the line of forks a sandbox is of: the first sandbox's ID.
func lineageOf(sb *core.Sandbox) string {
	if sb.LineageID != "" {
		return sb.LineageID
	}
	return sb.ID
}
