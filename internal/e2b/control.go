package e2b

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/daemon"
	"github.com/nookhq/nook/internal/errdefs"
)

// The control API: E2B's REST API (e2b-dev/infra spec/openapi.yml) over
// the Manager. A sandbox's E2B ID is its nook name.

// defaultTimeout is a sandbox's lifetime when a create or connect names
// none (E2B's NewSandboxV2 default, seconds).
const defaultTimeout = 300

func (s *Server) controlMux() *http.ServeMux {
	mux := http.NewServeMux()
	h := func(pattern string, write bool, f func(http.ResponseWriter, *http.Request, daemon.Scope)) {
		mux.HandleFunc(pattern, s.authorize(write, f))
	}
	h("POST /sandboxes", true, s.create)
	h("POST /v2/sandboxes", true, s.create)
	h("GET /sandboxes", false, s.listV1)
	h("GET /v2/sandboxes", false, s.list)
	h("GET /sandboxes/{id}", false, s.get)
	h("DELETE /sandboxes/{id}", true, s.kill)
	h("POST /sandboxes/{id}/connect", true, s.connect)
	h("POST /v2/sandboxes/{id}/connect", true, s.connect)
	h("POST /sandboxes/{id}/resume", true, s.connect)
	h("POST /sandboxes/{id}/timeout", true, s.setTimeout)
	h("POST /sandboxes/{id}/refreshes", true, s.refresh)
	h("POST /sandboxes/{id}/pause", true, s.pause)
	h("GET /sandboxes/{id}/metrics", false, s.metrics)
	h("GET /templates", false, s.templates)
	h("POST /sandboxes/{id}/snapshots", true, s.createSnapshot)
	h("GET /snapshots", false, s.listSnapshots)
	h("DELETE /templates/{id}", true, s.deleteTemplate)
	h("POST /sandboxes/{id}/fork", true, s.fork)
	h("PUT /sandboxes/{id}/network", true, s.updateNetwork)
	h("GET /templates/aliases/{alias}", false, s.templateAlias)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "Health check successful")
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("nook's E2B API has no route %s %s", r.Method, r.URL.Path))
	})
	return mux
}

// authorize checks the request's API key (X-API-Key: a nook token) and
// that its scope allows the call: an admin token everything, a
// read-only one what does not write, a sandbox's token only its own
// sandbox (and no create).
func (s *Server) authorize(write bool, f func(http.ResponseWriter, *http.Request, daemon.Scope)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("X-API-Key")
		if key == "" {
			writeError(w, http.StatusUnauthorized, "no API key: set X-API-Key (E2B_API_KEY) to a nook token (nook token create --e2b)")
			return
		}
		ti, err := s.m.Authenticate(r.Context(), key)
		if err != nil {
			writeError(w, http.StatusUnauthorized, "Invalid API key")
			return
		}
		sc := ti.Scope
		switch {
		case sc.Kind == api.ScopeReadOnly && write:
			writeError(w, http.StatusForbidden, "this API key is read-only")
			return
		case sc.Kind == daemon.ScopeSandbox && r.PathValue("id") == "" && write:
			writeError(w, http.StatusForbidden, "this API key is for sandbox "+sc.Sandbox+" alone: it cannot create sandboxes")
			return
		case sc.Kind == daemon.ScopeSandbox && r.PathValue("id") != "":
			if sb, err := s.m.Get(r.Context(), r.PathValue("id")); err != nil || sb.ID != sc.SandboxID {
				writeError(w, http.StatusNotFound, fmt.Sprintf("sandbox %q not found", r.PathValue("id")))
				return
			}
		}
		f(w, r.WithContext(daemon.WithTokenID(daemon.WithCreator(r.Context(), ti.Name), ti.ID)), sc)
	}
}

// newSandbox is the body of a create (NewSandbox and NewSandboxV2).
type newSandbox struct {
	TemplateID          string            `json:"templateID"`
	Timeout             *int              `json:"timeout"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	AutoPause           bool              `json:"autoPause"`
	Secure              *bool             `json:"secure"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	Network             *struct {
		AllowOut           []string `json:"allowOut"`
		DenyOut            []string `json:"denyOut"`
		AllowPublicTraffic *bool    `json:"allowPublicTraffic"`
	} `json:"network"`
}

// publicLabel marks a sandbox whose ports anyone who reaches the edge
// may use, as E2B's are unless a create says allowPublicTraffic false:
// set by E2B creates only, so sandboxes made through nook's own API are
// reached only with their traffic token. Labels under reservedPrefix
// are the edge's, never shown as metadata.
const (
	reservedPrefix = "nook.e2b/"
	publicLabel    = reservedPrefix + "public-traffic"
	// isolationKey in a create's metadata chooses the sandbox's
	// isolation: container (the default) or vm. It stays in the
	// metadata.
	isolationKey = "nook.isolation"
)

// sandboxView is E2B's Sandbox (create and connect answers).
type sandboxView struct {
	SandboxID          string  `json:"sandboxID"`
	TemplateID         string  `json:"templateID"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken,omitempty"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
	Alias              string  `json:"alias,omitempty"`
}

// listedSandbox is E2B's ListedSandbox; SandboxDetail adds the rest.
type listedSandbox struct {
	SandboxID       string            `json:"sandboxID"`
	TemplateID      string            `json:"templateID"`
	ClientID        string            `json:"clientID"`
	Alias           string            `json:"alias,omitempty"`
	CPUCount        int               `json:"cpuCount"`
	MemoryMB        int64             `json:"memoryMB"`
	DiskSizeMB      int64             `json:"diskSizeMB"`
	StartedAt       time.Time         `json:"startedAt"`
	EndAt           time.Time         `json:"endAt"`
	EnvdVersion     string            `json:"envdVersion"`
	State           string            `json:"state"`
	Metadata        map[string]string `json:"metadata,omitempty"`
	EnvdAccessToken string            `json:"envdAccessToken,omitempty"`
	Domain          *string           `json:"domain,omitempty"`
	Lifecycle       *lifecycle        `json:"lifecycle,omitempty"`
}

type lifecycle struct {
	OnTimeout  string `json:"onTimeout"`
	AutoResume bool   `json:"autoResume"`
}

func (s *Server) view(sb *core.Sandbox) sandboxView {
	v := sandboxView{SandboxID: sb.Name, TemplateID: templateName(sb), ClientID: clientID, EnvdVersion: EnvdVersion,
		EnvdAccessToken: s.accessToken(sb.ID)}
	if s.domain != "" {
		v.Domain = &s.domain
	}
	if sb.Labels[publicLabel] != "true" {
		tok := s.trafficToken(sb.ID)
		v.TrafficAccessToken = &tok
	}
	return v
}

// metadata is a sandbox's labels less the edge's own.
func metadata(sb *core.Sandbox) map[string]string {
	var out map[string]string
	for k, v := range sb.Labels {
		if !strings.HasPrefix(k, reservedPrefix) {
			if out == nil {
				out = map[string]string{}
			}
			out[k] = v
		}
	}
	return out
}

// state is a sandbox's E2B state: running or paused ("" for one E2B
// has no word for: creating, stopped, failed, destroying).
func state(sb *core.Sandbox) string {
	switch sb.State {
	case core.StateRunning:
		return "running"
	case core.StatePaused:
		return "paused"
	}
	return ""
}

// listed is a sandbox as a list shows it; detail adds what GET shows,
// and the access token for a scope that may act on it (never a read-only
// one: the token runs commands).
func (s *Server) listed(sb *core.Sandbox, detail bool, sc daemon.Scope) listedSandbox {
	l := listedSandbox{SandboxID: sb.Name, TemplateID: templateName(sb), ClientID: clientID, CPUCount: max(1, int(sb.CPUs+0.5)),
		MemoryMB: sb.MemoryBytes >> 20, DiskSizeMB: sb.DiskBytes >> 20, StartedAt: sb.CreatedAt.UTC(), EndAt: sb.ExpiresAt.UTC(),
		EnvdVersion: EnvdVersion, State: state(sb), Metadata: metadata(sb)}
	if detail {
		if sc.Kind != api.ScopeReadOnly {
			l.EnvdAccessToken = s.accessToken(sb.ID)
		}
		onTimeout := "kill"
		if sb.OnExpire == core.OnExpirePause {
			onTimeout = "pause"
		}
		l.Lifecycle = &lifecycle{OnTimeout: onTimeout}
	}
	return l
}

func decodeBody(r *http.Request, v any) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		return errdefs.Invalid("the request body is not valid JSON: %v", err)
	}
	return nil
}

// ttlOf is a lifetime in E2B's seconds as a nook TTL, which is at least
// a minute.
func ttlOf(seconds int) string {
	return strconv.Itoa(max(seconds, int(core.MinTTL/time.Second))) + "s"
}

// newName is a new sandbox's name (its E2B ID): e2b- and 12 lowercase
// letters and digits, a DNS label as E2B's IDs are.
func newName() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 12)
	rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return "e2b-" + string(b)
}

func (s *Server) create(w http.ResponseWriter, r *http.Request, _ daemon.Scope) {
	var req newSandbox
	if err := decodeBody(r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	if req.TemplateID == "" {
		writeError(w, http.StatusBadRequest, "templateID is required")
		return
	}
	timeout := defaultTimeout
	if req.Timeout != nil {
		timeout = *req.Timeout
	}
	if timeout <= 0 {
		writeError(w, http.StatusBadRequest, "timeout must be positive")
		return
	}
	if len(req.Metadata) >= core.MaxLabels {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("%d metadata keys: a sandbox has at most %d", len(req.Metadata), core.MaxLabels-1))
		return
	}
	labels := map[string]string{}
	isolation := req.Metadata[isolationKey]
	for k, v := range req.Metadata {
		if strings.HasPrefix(k, reservedPrefix) {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("metadata key %q: keys starting %s are nook's", k, reservedPrefix))
			return
		}
		labels[k] = v
	}
	if req.Network == nil || req.Network.AllowPublicTraffic == nil || *req.Network.AllowPublicTraffic {
		labels[publicLabel] = "true"
	}
	if sandbox, snapshot, ok := parseSnapshotID(req.TemplateID); ok {
		s.createFromSnapshot(w, r, sandbox, snapshot, timeout)
		return
	}
	cr := api.CreateSandboxRequest{Name: newName(), Template: templateOf(req.TemplateID), TTL: ttlOf(timeout), Env: req.EnvVars, Labels: labels,
		Isolation: isolation}
	if req.AutoPause {
		cr.OnExpire = core.OnExpirePause
	}
	switch {
	case req.Network != nil && len(req.Network.AllowOut) > 0:
		cr.Allow = req.Network.AllowOut
	case (req.AllowInternetAccess == nil || *req.AllowInternetAccess) && s.m.Networking():
		// E2B's default; a daemon without sandbox networking gives
		// loopback only, whatever a create says by default.
		cr.Allow = []string{"@internet"}
	}
	if req.Network != nil {
		cr.Deny = req.Network.DenyOut
	}
	sb, err := s.m.Create(r.Context(), cr, nil)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.log.Info("e2b sandbox created", "sandbox", sb.Name, "template", sb.Template)
	writeJSON(w, http.StatusCreated, s.view(sb))
}

// e2bBase is the nook template E2B's base template is: Debian with
// E2B's default user.
const e2bBase = "e2b"

// templateOf maps an E2B template name to nook's: E2B's base is nook's
// e2b recipe (its user, whom commands run as), any other name the nook
// template of that name.
func templateOf(id string) string {
	if id == "base" {
		return e2bBase
	}
	return id
}

// templateName is the E2B name of a sandbox's template.
func templateName(sb *core.Sandbox) string {
	if sb.Template == e2bBase {
		return "base"
	}
	return sb.Template
}

// connect resumes a paused sandbox (201) or answers a running one (200),
// and extends its lifetime to the timeout given if that is later.
func (s *Server) connect(w http.ResponseWriter, r *http.Request, sc daemon.Scope) {
	var req struct {
		Timeout *int `json:"timeout"`
	}
	if err := decodeBody(r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	id := r.PathValue("id")
	sb, err := s.m.Get(r.Context(), id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	status := http.StatusOK
	if sb.State == core.StatePaused {
		if sb, err = s.m.Resume(r.Context(), id); err != nil {
			s.fail(w, r, err)
			return
		}
		status = http.StatusCreated
	} else if sb.State != core.StateRunning {
		writeError(w, http.StatusConflict, fmt.Sprintf("sandbox %s is %s", id, sb.State))
		return
	}
	timeout := defaultTimeout
	if req.Timeout != nil {
		timeout = *req.Timeout
	}
	if sc.Kind != daemon.ScopeSandbox { // a sandbox's own key resumes it, never lengthens its life
		if sb, err = s.extend(r.Context(), sb, timeout); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	writeJSON(w, status, s.view(sb))
}

func (s *Server) get(w http.ResponseWriter, r *http.Request, sc daemon.Scope) {
	sb, err := s.m.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.listed(sb, true, sc))
}

func (s *Server) kill(w http.ResponseWriter, r *http.Request, _ daemon.Scope) {
	id := r.PathValue("id")
	sb, err := s.m.Get(r.Context(), id)
	if err == nil {
		err = s.m.Destroy(r.Context(), id)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.procs.forget(sb.ID)
	w.WriteHeader(http.StatusNoContent)
}

// mayExtend says whether a scope may lengthen a sandbox's life: not a
// sandbox's own key (nook's API keeps TTLs an admin's).
func mayExtend(w http.ResponseWriter, sc daemon.Scope) bool {
	if sc.Kind == daemon.ScopeSandbox {
		writeError(w, http.StatusForbidden, "this API key is for sandbox "+sc.Sandbox+" alone: it cannot change its lifetime")
		return false
	}
	return true
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request, sc daemon.Scope) {
	if !mayExtend(w, sc) {
		return
	}
	var req struct {
		Timeout *int `json:"timeout"`
	}
	if err := decodeBody(r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	if req.Timeout == nil || *req.Timeout <= 0 {
		writeError(w, http.StatusBadRequest, "timeout (seconds) is required and must be positive")
		return
	}
	if _, err := s.m.SetTTL(r.Context(), r.PathValue("id"), ttlOf(*req.Timeout)); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// refresh extends a sandbox's life by duration seconds (at most an
// hour), never shortening it.
func (s *Server) refresh(w http.ResponseWriter, r *http.Request, sc daemon.Scope) {
	if !mayExtend(w, sc) {
		return
	}
	var req struct {
		Duration int `json:"duration"`
	}
	if err := decodeBody(r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	sb, err := s.m.Get(r.Context(), r.PathValue("id"))
	if err == nil {
		_, err = s.extend(r.Context(), sb, min(max(req.Duration, 0), 3600))
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// extend makes a sandbox live at least seconds more, never shortening
// its life.
func (s *Server) extend(ctx context.Context, sb *core.Sandbox, seconds int) (*core.Sandbox, error) {
	if !time.Now().Add(time.Duration(seconds) * time.Second).After(sb.ExpiresAt) {
		return sb, nil
	}
	return s.m.SetTTL(ctx, sb.Name, ttlOf(seconds))
}

func (s *Server) pause(w http.ResponseWriter, r *http.Request, _ daemon.Scope) {
	id := r.PathValue("id")
	sb, err := s.m.Get(r.Context(), id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if sb.State == core.StatePaused {
		writeError(w, http.StatusConflict, fmt.Sprintf("sandbox %s is already paused", id))
		return
	}
	if _, err := s.m.Pause(r.Context(), id); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) templates(w http.ResponseWriter, r *http.Request, _ daemon.Scope) {
	list, err := s.m.Templates(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	type tpl struct {
		TemplateID string    `json:"templateID"`
		BuildID    string    `json:"buildID"`
		Public     bool      `json:"public"`
		Aliases    []string  `json:"aliases"`
		CreatedAt  time.Time `json:"createdAt"`
		UpdatedAt  time.Time `json:"updatedAt"`
	}
	out := []tpl{}
	for _, t := range list.Templates {
		name := t.Name
		if name == e2bBase {
			name = "base"
		} else if name == "base" {
			continue // E2B's base is nook's e2b
		}
		out = append(out, tpl{TemplateID: name, BuildID: t.ID, Aliases: []string{name}, CreatedAt: t.CreatedAt, UpdatedAt: t.CreatedAt})
	}
	writeJSON(w, http.StatusOK, out)
}

// updateNetwork is PUT /sandboxes/{id}/network: the sandbox's egress
// policy replaced at once (nook's SetNetwork), as a create would set it.
// An admin's only: a sandbox's own key may not widen what it reaches.
func (s *Server) updateNetwork(w http.ResponseWriter, r *http.Request, sc daemon.Scope) {
	if sc.Kind == daemon.ScopeSandbox {
		writeError(w, http.StatusForbidden, "this API key is for sandbox "+sc.Sandbox+" alone: it cannot change its network")
		return
	}
	var req struct {
		AllowOut            []string `json:"allowOut"`
		DenyOut             []string `json:"denyOut"`
		AllowInternetAccess *bool    `json:"allow_internet_access"`
	}
	if err := decodeBody(r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	nr := api.SetNetworkRequest{Allow: req.AllowOut, Deny: req.DenyOut}
	if len(nr.Allow) == 0 && (req.AllowInternetAccess == nil || *req.AllowInternetAccess) {
		nr.Allow = []string{"@internet"}
	}
	if _, err := s.m.SetNetwork(r.Context(), r.PathValue("id"), nr); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// templateAlias answers whether a template name is one a create can use
// (the SDKs' Template.exists): built, or one nook builds on first use.
func (s *Server) templateAlias(w http.ResponseWriter, r *http.Request, _ daemon.Scope) {
	alias := r.PathValue("alias")
	name := templateOf(alias)
	list, err := s.m.Templates(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	known := false
	for _, t := range list.Templates {
		known = known || t.Name == name
	}
	for _, b := range list.Buildable {
		known = known || b.Name == name
	}
	if !known {
		writeError(w, http.StatusNotFound, fmt.Sprintf("template %q not found", alias))
		return
	}
	writeJSON(w, http.StatusOK, struct {
		TemplateID string `json:"templateID"`
		Public     bool   `json:"public"`
	}{alias, true})
}

// listV1 is the first list API: the running sandboxes, all at once.
func (s *Server) listV1(w http.ResponseWriter, r *http.Request, sc daemon.Scope) {
	all, err := s.matching(r, sc)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := []listedSandbox{}
	for _, sb := range all {
		if sb.State == core.StateRunning {
			out = append(out, s.listed(sb, false, sc))
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// list is GET /v2/sandboxes: filters by metadata and state, newest
// first (order=asc: oldest), pages of limit (1-100, default 100) with
// the next page's token in X-Next-Token.
func (s *Server) list(w http.ResponseWriter, r *http.Request, sc daemon.Scope) {
	q := r.URL.Query()
	all, err := s.matching(r, sc)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	states := map[string]bool{"running": true, "paused": true}
	if v := q.Get("state"); v != "" {
		states = map[string]bool{}
		for _, st := range strings.Split(v, ",") {
			if st != "running" && st != "paused" {
				writeError(w, http.StatusBadRequest, fmt.Sprintf("state %q: use running or paused", st))
				return
			}
			states[st] = true
		}
	}
	limit := 100
	if v := q.Get("limit"); v != "" {
		if limit, err = strconv.Atoi(v); err != nil || limit < 1 || limit > 100 {
			writeError(w, http.StatusBadRequest, "limit must be a number from 1 to 100")
			return
		}
	}
	asc := q.Get("order") == "asc"
	var picked []*core.Sandbox
	for _, sb := range all {
		if st := state(sb); st != "" && states[st] && (q.Get("template") == "" || templateOf(q.Get("template")) == sb.Template) {
			picked = append(picked, sb)
		}
	}
	sort.Slice(picked, func(i, j int) bool {
		a, b := picked[i], picked[j]
		if !a.CreatedAt.Equal(b.CreatedAt) {
			return a.CreatedAt.After(b.CreatedAt) != asc
		}
		return a.ID < b.ID
	})
	// A page token is where the last page ended in this order (its last
	// sandbox's start time and ID), not that sandbox: the next page goes
	// on from there even if that sandbox has gone since.
	start := 0
	if tok := q.Get("nextToken"); tok != "" {
		raw, err := base64.RawURLEncoding.DecodeString(tok)
		at, id, ok := strings.Cut(string(raw), "/")
		nanos, perr := strconv.ParseInt(at, 10, 64)
		if err != nil || !ok || perr != nil {
			writeError(w, http.StatusBadRequest, "nextToken is not one this API gave")
			return
		}
		start = len(picked)
		for i, sb := range picked {
			c := sb.CreatedAt.UnixNano()
			if (asc && c > nanos) || (!asc && c < nanos) || (c == nanos && sb.ID > id) {
				start = i
				break
			}
		}
	}
	page := picked[start:]
	if len(page) > limit {
		page = page[:limit]
		last := page[len(page)-1]
		w.Header().Set("X-Next-Token", base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(last.CreatedAt.UnixNano(), 10)+"/"+last.ID)))
	}
	out := make([]listedSandbox, 0, len(page))
	for _, sb := range page {
		out = append(out, s.listed(sb, false, sc))
	}
	writeJSON(w, http.StatusOK, out)
}

// matching is the sandboxes a scope may see whose labels match the
// request's metadata filter.
func (s *Server) matching(r *http.Request, sc daemon.Scope) ([]*core.Sandbox, error) {
	filter, err := metadataFilter(r.URL.Query().Get("metadata"))
	if err != nil {
		return nil, err
	}
	all, err := s.visible(r.Context(), sc)
	if err != nil {
		return nil, err
	}
	out := all[:0:0]
	for _, sb := range all {
		if matches(sb, filter) {
			out = append(out, sb)
		}
	}
	return out, nil
}

// visible is the sandboxes a scope may see.
func (s *Server) visible(ctx context.Context, sc daemon.Scope) ([]*core.Sandbox, error) {
	all, err := s.m.List(ctx)
	if err != nil || sc.Kind != daemon.ScopeSandbox {
		return all, err
	}
	var out []*core.Sandbox
	for _, sb := range all {
		if sb.ID == sc.SandboxID {
			out = append(out, sb)
		}
	}
	return out, nil
}

// metadataFilter reads the SDK's metadata query: k=v pairs joined by &,
// each part escaped, the whole escaped again.
func metadataFilter(raw string) (map[string]string, error) {
	if raw == "" {
		return nil, nil
	}
	whole, err := url.QueryUnescape(raw)
	if err != nil {
		return nil, errdefs.Invalid("metadata filter: %v", err)
	}
	out := map[string]string{}
	for _, kv := range strings.Split(whole, "&") {
		k, v, _ := strings.Cut(kv, "=")
		if k, err = url.QueryUnescape(k); err != nil {
			return nil, errdefs.Invalid("metadata filter: %v", err)
		}
		if v, err = url.QueryUnescape(v); err != nil {
			return nil, errdefs.Invalid("metadata filter: %v", err)
		}
		out[k] = v
	}
	return out, nil
}

func matches(sb *core.Sandbox, filter map[string]string) bool {
	for k, v := range filter {
		if got, ok := sb.Labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}
