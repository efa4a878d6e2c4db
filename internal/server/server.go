// Package server is nook's REST API edge: it decodes requests, calls the
// daemon's Manager, and maps error categories to HTTP status codes and
// stable error codes. Nothing below this package knows about HTTP.
//
// It also guards the edge: the TCP listener serves TLS (tls.go: a
// self-signed certificate kept in the data directory unless one is given)
// with a connection cap and idle timeout, every request there needs a
// token, and every route has an access class that a token's scope must
// allow (scope.go). /mcp runs its tools with the caller's token.
package server

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/daemon"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/image"
	"github.com/nookhq/nook/internal/listfilter"
	"github.com/nookhq/nook/internal/template"
)

// maxBody bounds a JSON request body.
const maxBody = 1 << 20

// Server serves the API for one Manager.
type Server struct {
	m   *daemon.Manager
	log *slog.Logger
	mux *http.ServeMux
	// authenticate and sandboxID are the Manager's, replaceable in tests.
	authenticate func(ctx context.Context, secret string) (*daemon.TokenInfo, error)
	sandboxID    func(ctx context.Context, name string) (string, error)
	// tlsFingerprint is the TCP listener's certificate's, for /v1/info.
	tlsFingerprint string
	// ssh and preview are the endpoints nook serve runs, or nil.
	ssh     SSHEndpoint
	preview PreviewEndpoint
	// statsServing counts the stats requests being served (maxStats).
	statsServing atomic.Int32
}

// New returns a Server.
func New(m *daemon.Manager, log *slog.Logger) *Server {
	s := &Server{m: m, log: log, authenticate: m.Authenticate, sandboxID: func(ctx context.Context, name string) (string, error) {
		sb, err := m.Get(ctx, name)
		if err != nil {
			return "", err
		}
		return sb.ID, nil
	}}
	s.mux = s.newMux(s.routes())
	return s
}

// newMux serves routes, each behind its access check.
func (s *Server) newMux(routes []route) *http.ServeMux {
	mux := http.NewServeMux()
	for _, r := range routes {
		if r.access == accessUndecided {
			panic("route " + r.pattern + " has no access decision")
		}
		mux.Handle(r.pattern, s.authorize(r.access, r.handler))
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, api.CodeNotFound, fmt.Sprintf("no API route %s %s: see /v1/openapi.yaml", r.Method, r.URL.Path))
	})
	return mux
}

type route struct {
	pattern string
	// access is which callers may use the route (scope.go).
	access  access
	handler http.HandlerFunc
}

// routes is the API; every pattern here is documented in api/openapi.yaml (a test checks).
func (s *Server) routes() []route {
	return []route{
		{"GET /v1/openapi.yaml", accessAnyToken, s.openapi},
		{"GET /v1/info", accessAnyToken, s.info},
		{"GET /v1/events", accessList, s.events},
		{"POST /v1/sandboxes", accessAdmin, s.idempotent(daemon.IdempotentCreate, s.createSandbox)},
		{"GET /v1/sandboxes", accessList, s.listSandboxes},
		{"GET /v1/sandboxes/{name}", accessSandboxRead, s.getSandbox},
		{"DELETE /v1/sandboxes/{name}", accessSandboxWrite, s.deleteSandbox},
		{"PUT /v1/sandboxes/{name}/ttl", accessAdmin, s.setTTL},
		{"POST /v1/sandboxes/{name}/pause", accessSandboxWrite, s.pauseSandbox},
		{"POST /v1/sandboxes/{name}/resume", accessSandboxWrite, s.resumeSandbox},
		{"POST /v1/sandboxes/{name}/stop", accessSandboxWrite, s.stopSandbox},
		{"POST /v1/sandboxes/{name}/start", accessSandboxWrite, s.startSandbox},
		{"POST /v1/sandboxes/{name}/snapshots", accessSandboxWrite, s.idempotent(daemon.IdempotentSnapshot, s.createSnapshot)},
		{"GET /v1/sandboxes/{name}/snapshots", accessSandboxRead, s.listSnapshots},
		{"DELETE /v1/sandboxes/{name}/snapshots/{snapshot}", accessSandboxWrite, s.deleteSnapshot},
		{"POST /v1/sandboxes/{name}/rollback", accessSandboxWrite, s.rollback},
		{"POST /v1/sandboxes/{name}/fork", accessAdmin, s.idempotent(daemon.IdempotentFork, s.fork)},
		{"GET /v1/sandboxes/{name}/stats", accessSandboxRead, s.sandboxStats},
		{"GET /v1/stats", accessList, s.allStats},
		{"GET /v1/sandboxes/{name}/network", accessSandboxRead, s.getNetwork},
		{"PUT /v1/sandboxes/{name}/network", accessAdmin, s.setNetwork},
		{"GET /v1/sandboxes/{name}/network/log", accessSandboxRead, s.netLog},
		{"POST /v1/sandboxes/{name}/identity/token", accessSandboxWrite, s.identityToken},
		{"GET /v1/sandboxes/{name}/identity/log", accessSandboxRead, s.identityLog},
		{"GET /v1/sandboxes/{name}/logs", accessSandboxRead, s.sandboxLogs},
		{"POST /v1/identity/rotate", accessHost, s.rotateIdentityKeys},
		{"GET /v1/secrets", accessAdmin, s.listSecrets},
		{"PUT /v1/secrets/{secret}", accessAdmin, s.setSecret},
		{"DELETE /v1/secrets/{secret}", accessAdmin, s.deleteSecret},
		{"GET /.well-known/openid-configuration", accessPublic, s.discovery},
		{"GET /.well-known/jwks.json", accessPublic, s.jwks},
		{"POST /v1/sandboxes/{name}/expose", accessAdmin, s.expose},
		{"DELETE /v1/sandboxes/{name}/expose/{port}", accessAdmin, s.unexpose},
		{"GET /v1/ssh-keys", accessAnyToken, s.listSSHKeys},
		{"POST /v1/ssh-keys", accessAnyToken, s.addSSHKey},
		{"DELETE /v1/ssh-keys/{id}", accessAnyToken, s.removeSSHKey},
		{"GET /v1/sandboxes/{name}/ssh-keys", accessSandboxRead, s.listSSHKeys},
		{"POST /v1/sandboxes/{name}/ssh-keys", accessSandboxWrite, s.addSSHKey},
		{"DELETE /v1/sandboxes/{name}/ssh-keys/{id}", accessSandboxWrite, s.removeSSHKey},
		{"POST /v1/sandboxes/{name}/ssh-cert", accessSandboxWrite, s.sshCert},
		{"POST /v1/sandboxes/{name}/exec", accessSandboxWrite, s.exec},
		{"GET /v1/sandboxes/{name}/exec/ws", accessSandboxWrite, s.execWebSocket},
		{"GET /v1/sandboxes/{name}/processes", accessSandboxRead, s.listProcesses},
		{"GET /v1/sandboxes/{name}/processes/{pid}/output", accessSandboxRead, s.processOutput},
		{"GET /v1/sandboxes/{name}/processes/{pid}/attach", accessSandboxWrite, s.attachWebSocket},
		{"POST /v1/sandboxes/{name}/processes/{pid}/signal", accessSandboxWrite, s.signalProcess},
		{"GET /v1/sandboxes/{name}/files/stat", accessSandboxRead, s.statFile},
		{"GET /v1/sandboxes/{name}/files/list", accessSandboxRead, s.listFiles},
		{"GET /v1/sandboxes/{name}/files/content", accessSandboxRead, s.readFile},
		{"PUT /v1/sandboxes/{name}/files/content", accessSandboxWrite, s.writeFile},
		{"POST /v1/sandboxes/{name}/files/mkdir", accessSandboxWrite, s.mkdirFile},
		{"DELETE /v1/sandboxes/{name}/files", accessSandboxWrite, s.removeFile},
		{"POST /v1/sandboxes/{name}/files/move", accessSandboxWrite, s.moveFile},
		{"POST /v1/sandboxes/{name}/files/chmod", accessSandboxWrite, s.chmodFile},
		{"GET /v1/sandboxes/{name}/files/archive", accessSandboxRead, s.downloadArchive},
		{"PUT /v1/sandboxes/{name}/files/archive", accessSandboxWrite, s.uploadArchive},
		{"GET /v1/sandboxes/{name}/files/watch", accessSandboxRead, s.watchFiles},
		{"GET /v1/templates", accessAnyToken, s.listTemplates},
		{"POST /v1/templates", accessAdmin, s.buildTemplateFrom},
		{"POST /v1/templates/{name}/build", accessAdmin, s.buildTemplate},
		{"POST /v1/templates/{name}/dockerfile", accessAdmin, s.buildDockerfile},
		{"DELETE /v1/templates/{name}", accessAdmin, s.deleteTemplate},
		{"GET /v1/volumes", accessAdmin, s.listVolumes},
		{"POST /v1/volumes", accessAdmin, s.createVolume},
		{"GET /v1/volumes/{name}", accessAdmin, s.getVolume},
		{"DELETE /v1/volumes/{name}", accessAdmin, s.deleteVolume},
		{"GET /v1/volumes/{name}/files/stat", accessAdmin, s.statVolumeFile},
		{"GET /v1/volumes/{name}/files/list", accessAdmin, s.listVolumeFiles},
		{"GET /v1/volumes/{name}/files/content", accessAdmin, s.readVolumeFile},
		{"PUT /v1/volumes/{name}/files/content", accessAdmin, s.writeVolumeFile},
		{"GET /v1/volumes/{name}/files/archive", accessAdmin, s.downloadVolumeArchive},
		{"PUT /v1/volumes/{name}/files/archive", accessAdmin, s.uploadVolumeArchive},
		{"POST /v1/tokens", accessHost, s.createToken},
		{"GET /v1/tokens", accessHost, s.listTokens},
		{"DELETE /v1/tokens/{id}", accessHost, s.deleteToken},
	}
}

// Routes lists the API's route patterns, for the spec coverage test.
func (s *Server) Routes() []string {
	var out []string
	for _, r := range s.routes() {
		out = append(out, r.pattern)
	}
	return out
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int)        { w.status = code; w.ResponseWriter.WriteHeader(code) }
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// RequestIDHeader names the request id every answer carries (the
// caller's own, when it sent a usable one): the daemon's log lines of
// that request carry it too.
const RequestIDHeader = "X-Request-Id"

type requestIDKey struct{}

// requestIDOf is r's request id (logRequests gave it one).
func requestIDOf(r *http.Request) string {
	id, _ := r.Context().Value(requestIDKey{}).(string)
	return id
}

// newRequestID keeps the caller's id when it is 1-128 characters of
// letters, digits and ".-_:" (nothing a log line could be forged with),
// and makes one otherwise.
func newRequestID(given string) string {
	if len(given) > 0 && len(given) <= 128 && strings.Trim(given, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_:") == "" {
		return given
	}
	b := make([]byte, 12)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func (s *Server) logRequests(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		id := newRequestID(r.Header.Get(RequestIDHeader))
		w.Header().Set(RequestIDHeader, id)
		r = r.WithContext(context.WithValue(r.Context(), requestIDKey{}, id))
		sw := &statusWriter{ResponseWriter: w, status: 200}
		next.ServeHTTP(sw, r)
		s.log.Debug("api", "method", r.Method, "path", r.URL.Path, "status", sw.status, "duration", time.Since(start), "request_id", id)
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, api.ErrorBody{Error: api.Error{Code: code, Message: msg}})
}

// errorStatus maps an error's category to an HTTP status and a stable code.
func errorStatus(err error) (int, string) {
	switch {
	case errors.Is(err, errdefs.ErrInvalidArgument):
		return http.StatusBadRequest, api.CodeInvalidArgument
	case errors.Is(err, errdefs.ErrNotFound):
		return http.StatusNotFound, api.CodeNotFound
	case errors.Is(err, errdefs.ErrPermissionDenied):
		return http.StatusForbidden, api.CodePermissionDenied
	case errors.Is(err, errdefs.ErrAlreadyExists):
		return http.StatusConflict, api.CodeAlreadyExists
	case errors.Is(err, errdefs.ErrFailedPrecondition):
		return http.StatusConflict, api.CodeFailedPrecondition
	case errors.Is(err, errdefs.ErrResourceExhausted):
		return http.StatusInsufficientStorage, api.CodeResourceExhausted
	case errors.Is(err, errdefs.ErrLimit):
		return http.StatusTooManyRequests, api.CodeLimitReached
	case errors.Is(err, errdefs.ErrUnavailable):
		return http.StatusServiceUnavailable, api.CodeUnavailable
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return http.StatusServiceUnavailable, api.CodeUnavailable
	default:
		return http.StatusInternalServerError, api.CodeInternal
	}
}

func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	status, code := errorStatus(err)
	if status >= 500 {
		s.log.Error("api error", "method", r.Method, "path", r.URL.Path, "err", err, "request_id", requestIDOf(r))
	}
	writeError(w, status, code, err.Error())
}

// decode reads a JSON body strictly: unknown fields are an error, so a
// misspelt option is not silently ignored.
func decode(r *http.Request, v any) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return errdefs.Invalid("request body is empty: send a JSON object")
		}
		return errdefs.Invalid("request body is not valid JSON for this call: %v", err)
	}
	return nil
}

func (s *Server) openapi(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/yaml")
	w.Write(api.OpenAPISpec)
}

func (s *Server) info(w http.ResponseWriter, r *http.Request) {
	info := s.m.Info(r.Context())
	info.TLSFingerprint = s.tlsFingerprint
	if s.ssh != nil {
		si := s.ssh.Info()
		info.SSH = &si
	}
	if s.preview != nil {
		pi := s.preview.Info()
		info.Preview = &pi
	}
	writeJSON(w, http.StatusOK, info)
}

func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request) {
	var req api.CreateSandboxRequest
	if err := decode(r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	switch p := r.URL.Query().Get("progress"); p {
	case "":
	case "ndjson":
		s.streamCreate(w, r, req)
		return
	default:
		s.fail(w, r, errdefs.Invalid("progress=%q: the only form is ndjson", p))
		return
	}
	sb, err := s.m.Create(r.Context(), req, slogWriter{s.log})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, s.m.View(sb))
}

// streamCreate creates a sandbox, streaming NDJSON api.CreateEvents:
// its progress lines (a template built on the way, a repository
// cloned), then the sandbox or the error.
func (s *Server) streamCreate(w http.ResponseWriter, r *http.Request, req api.CreateSandboxRequest) {
	emit := ndjsonStream(w)
	send := func(ev api.CreateEvent) { emit(ev) }
	lines := &lineWriter{emit: func(line string) {
		if line != "" {
			send(api.CreateEvent{Progress: line})
		}
	}}
	sb, err := s.m.Create(r.Context(), req, lines)
	lines.flush()
	if err != nil {
		status, code := errorStatus(err)
		if status >= 500 {
			s.log.Error("create sandbox", "err", err)
		}
		send(api.CreateEvent{Error: &api.Error{Code: code, Message: err.Error()}})
		return
	}
	v := s.m.View(sb)
	send(api.CreateEvent{Sandbox: &v})
}

// ndjsonStream starts an NDJSON answer and returns what writes one value
// of it as a line, flushed (safe from several goroutines).
func ndjsonStream(w http.ResponseWriter) func(v any) {
	w.Header().Set("Content-Type", ndjsonContentType)
	fw := &flushWriter{w: w, rc: http.NewResponseController(w)}
	var mu sync.Mutex
	return func(v any) {
		mu.Lock()
		defer mu.Unlock()
		b, _ := json.Marshal(v)
		fw.Write(append(b, '\n'))
	}
}

// slogWriter logs template build progress lines.
type slogWriter struct{ log *slog.Logger }

func (s slogWriter) Write(p []byte) (int, error) {
	s.log.Info("template build", "output", strings.TrimSpace(string(p)))
	return len(p), nil
}

// listSandboxes is GET /v1/sandboxes, filtered by its query parameters
// (label, state, template, isolation, name: package listfilter).
func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request) {
	filter, err := listfilter.FromQuery(r.URL.Query(), listfilter.SandboxKeys)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	sbs, err := s.m.List(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	scope := callerFrom(r.Context()).scope
	out := make([]api.Sandbox, 0, len(sbs))
	for _, sb := range sbs {
		// A sandbox token sees only its sandbox.
		if scope.Kind == daemon.ScopeSandbox && sb.ID != scope.SandboxID {
			continue
		}
		if v := s.m.View(sb); filter.Sandbox(&v) {
			out = append(out, v)
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request) {
	sb, err := s.m.Get(r.Context(), r.PathValue("name"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.m.View(sb))
}

func (s *Server) deleteSandbox(w http.ResponseWriter, r *http.Request) {
	if err := s.m.Destroy(r.Context(), r.PathValue("name")); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) setTTL(w http.ResponseWriter, r *http.Request) {
	var req api.SetTTLRequest
	if err := decode(r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	sb, err := s.m.SetTTL(r.Context(), r.PathValue("name"), req.TTL)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.m.View(sb))
}

func (s *Server) pauseSandbox(w http.ResponseWriter, r *http.Request) {
	sb, err := s.m.Pause(r.Context(), r.PathValue("name"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.m.View(sb))
}

func (s *Server) resumeSandbox(w http.ResponseWriter, r *http.Request) {
	sb, err := s.m.Resume(r.Context(), r.PathValue("name"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.m.View(sb))
}

func (s *Server) stopSandbox(w http.ResponseWriter, r *http.Request) {
	sb, err := s.m.Stop(r.Context(), r.PathValue("name"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.m.View(sb))
}

func (s *Server) startSandbox(w http.ResponseWriter, r *http.Request) {
	sb, err := s.m.Start(r.Context(), r.PathValue("name"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.m.View(sb))
}

// exec streams a command's output as api frames. Errors before the
// command starts are ordinary JSON errors; after, a FrameError ends the stream.
func (s *Server) exec(w http.ResponseWriter, r *http.Request) {
	var req api.ExecRequest
	if err := decode(r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	if req.Stdin || req.TTY && !req.Background {
		s.fail(w, r, errdefs.Invalid("a foreground command with stdin or a terminal needs the WebSocket endpoint GET /v1/sandboxes/{name}/exec/ws; a background command takes no stdin (attach to it for input)"))
		return
	}
	p, err := s.m.Exec(r.Context(), r.PathValue("name"), req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if req.Background {
		writeJSON(w, http.StatusCreated, api.StartedProcess{PID: p.PID})
		return
	}
	s.relayStream(w, r, p)
}

func (s *Server) listTemplates(w http.ResponseWriter, r *http.Request) {
	tl, err := s.m.Templates(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if c := callerFrom(r.Context()); c.scope.Kind != api.ScopeAdmin {
		// An image's environment and labels often hold what its builder
		// baked in: an admin's to read, not every token's.
		for i := range tl.Templates {
			if cfg := tl.Templates[i].Config; cfg != nil {
				cfg = &api.ImageConfig{WorkingDir: cfg.WorkingDir, User: cfg.User, ExposedPorts: cfg.ExposedPorts}
				tl.Templates[i].Config = cfg
			}
		}
	}
	writeJSON(w, http.StatusOK, tl)
}

// flushWriter writes progress lines through to the client as they come.
type flushWriter struct {
	mu sync.Mutex
	w  io.Writer
	rc *http.ResponseController
}

func (f *flushWriter) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n, err := f.w.Write(p)
	f.rc.Flush()
	return n, err
}

// buildTemplate streams the build's progress as text; its last line is
// "ok <template id>" or "error: <message>".
func (s *Server) buildTemplate(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fw := &flushWriter{w: w, rc: http.NewResponseController(w)}
	name := r.PathValue("name")
	if err := template.CheckBuildable(name); err != nil {
		s.fail(w, r, err)
		return
	}
	t, err := s.m.BuildTemplate(r.Context(), name, fw)
	if err != nil {
		fmt.Fprintf(fw, "error: %v\n", err)
		return
	}
	fmt.Fprintf(fw, "ok %s\n", t.ID)
}

// buildTemplateFrom builds a template from a recipe or an image and
// streams NDJSON api.BuildEvents: progress lines and layers, then the
// template or the error. A request that cannot start (bad body, bad
// name, a host path from a remote caller) is an ordinary error answer.
func (s *Server) buildTemplateFrom(w http.ResponseWriter, r *http.Request) {
	var req api.BuildTemplateRequest
	if err := decode(r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	if err := template.CheckName(req.Name); err != nil {
		s.fail(w, r, err)
		return
	}
	host := callerFrom(r.Context()).host
	if req.From != "" && !host {
		if msg := remoteImageDenied(req.From); msg != "" {
			writeError(w, http.StatusForbidden, api.CodePermissionDenied, msg)
			return
		}
	}
	s.streamBuild(w, req.Name, func(opt daemon.BuildOptions) (api.Template, error) {
		opt.HostCredentials = host
		return s.m.BuildTemplateFrom(r.Context(), req, opt)
	})
}

// streamBuild runs a template build, streaming NDJSON api.BuildEvents:
// its progress lines, layers pulled and how far those being pulled are,
// then the template or the error.
func (s *Server) streamBuild(w http.ResponseWriter, name string, build func(daemon.BuildOptions) (api.Template, error)) {
	emit := ndjsonStream(w)
	send := func(ev api.BuildEvent) { emit(ev) }
	lines := &lineWriter{emit: func(line string) { send(api.BuildEvent{Progress: line}) }}
	t, err := build(daemon.BuildOptions{Progress: lines,
		OnLayer: func(l api.BuildLayerEvent) { send(api.BuildEvent{Layer: &l}) },
		OnPull:  func(p api.BuildPullEvent) { send(api.BuildEvent{Pulling: &p}) }})
	lines.flush()
	if err != nil {
		status, code := errorStatus(err)
		if status >= 500 {
			s.log.Error("template build", "template", name, "err", err)
		}
		send(api.BuildEvent{Error: &api.Error{Code: code, Message: err.Error()}})
		return
	}
	send(api.BuildEvent{Template: &t})
}

// buildDockerfile builds a template from a Dockerfile: the body is the
// build context as a tar, the options are in the query (api.DockerfileBuild).
func (s *Server) buildDockerfile(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := template.CheckName(name); err != nil {
		s.fail(w, r, err)
		return
	}
	q := r.URL.Query()
	for k := range q {
		switch k {
		case "dockerfile", "target", "build_arg", "allow", "start", "ready":
		default:
			s.fail(w, r, errdefs.Invalid("unknown query parameter %q: this call takes dockerfile, target, build_arg, allow, start and ready", k))
			return
		}
	}
	req := api.DockerfileBuild{Dockerfile: q.Get("dockerfile"), Target: q.Get("target"), Allow: q["allow"], Start: q.Get("start"), Ready: q.Get("ready")}
	for _, kv := range q["build_arg"] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			s.fail(w, r, errdefs.Invalid("build_arg %q is not NAME=VALUE", kv))
			return
		}
		if req.BuildArgs == nil {
			req.BuildArgs = map[string]string{}
		}
		req.BuildArgs[k] = v
	}
	host := callerFrom(r.Context()).host
	s.streamBuild(w, name, func(opt daemon.BuildOptions) (api.Template, error) {
		opt.HostCredentials = host
		return s.m.BuildDockerfile(r.Context(), name, req, r.Body, opt)
	})
}

// remoteImageDenied says why a caller other than the host may not
// build from image ref, or "" (image.RemoteDenied; a bad reference is
// the build's to report).
func remoteImageDenied(ref string) string {
	r, err := image.ParseRef(ref)
	if err != nil {
		return ""
	}
	return image.RemoteDenied(r)
}

// lineWriter cuts what is written into lines for emit.
type lineWriter struct {
	mu   sync.Mutex
	buf  []byte
	emit func(string)
}

func (l *lineWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			break
		}
		l.emit(strings.TrimRight(string(l.buf[:i]), "\r"))
		l.buf = l.buf[i+1:]
	}
	return len(p), nil
}

func (l *lineWriter) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.buf) > 0 {
		l.emit(string(l.buf))
		l.buf = nil
	}
}

func (s *Server) deleteTemplate(w http.ResponseWriter, r *http.Request) {
	if err := s.m.RemoveTemplate(r.Context(), r.PathValue("name")); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) listVolumes(w http.ResponseWriter, r *http.Request) {
	vols, err := s.m.ListVolumes(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.VolumeList{Volumes: vols})
}

func (s *Server) createVolume(w http.ResponseWriter, r *http.Request) {
	var req api.CreateVolumeRequest
	if err := decode(r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	v, err := s.m.CreateVolume(r.Context(), req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, v)
}

func (s *Server) getVolume(w http.ResponseWriter, r *http.Request) {
	v, err := s.m.GetVolume(r.Context(), r.PathValue("name"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

func (s *Server) deleteVolume(w http.ResponseWriter, r *http.Request) {
	force, err := queryBool(r, "force")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if err := s.m.RemoveVolume(r.Context(), r.PathValue("name"), force); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) listSecrets(w http.ResponseWriter, r *http.Request) {
	list, err := s.m.ListSecrets(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.SecretList{Secrets: list})
}

func (s *Server) setSecret(w http.ResponseWriter, r *http.Request) {
	v, err := io.ReadAll(io.LimitReader(r.Body, 64<<10+1))
	if err != nil {
		s.fail(w, r, errdefs.Invalid("read the secret's value: %v", err))
		return
	}
	if err := s.m.SetSecret(r.Context(), r.PathValue("secret"), v); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) deleteSecret(w http.ResponseWriter, r *http.Request) {
	if err := s.m.DeleteSecret(r.Context(), r.PathValue("secret")); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) createToken(w http.ResponseWriter, r *http.Request) {
	var req api.CreateTokenRequest
	if r.ContentLength != 0 {
		if err := decode(r, &req); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	t, err := s.m.CreateToken(r.Context(), req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, t)
}

func (s *Server) listTokens(w http.ResponseWriter, r *http.Request) {
	ts, err := s.m.Tokens(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, ts)
}

func (s *Server) deleteToken(w http.ResponseWriter, r *http.Request) {
	if err := s.m.RevokeToken(r.Context(), r.PathValue("id")); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
